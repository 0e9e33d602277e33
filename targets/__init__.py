"""Targets: other people's prefix caches driven by our operations and judged by our rules (REFERENCE §4)."""
