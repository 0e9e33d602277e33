"""Where captures go and where chunks end (mirrors spec/plan.py; impl/prefix_cache.py calls these).

M1: a chunk never ends strictly inside a non-causal span; M2: a capture that would land strictly
inside one moves to the span's end.
"""
from __future__ import annotations


def _inside(x: int, spans) -> tuple | None:
    if not spans:
        return None
    return next(((a, e) for a, e in spans if a < x < e), None)


def _chunk_end(q: int, spans) -> int:
    """M1: a chunk that would end strictly inside a non-causal span ends at the span's end."""
    span = _inside(q, spans)
    return span[1] if span else q


def schedule(n: int, resume: int, matched: int, spans, interval: int, near_end: int, boundaries=()) -> list:
    """Capture offsets (offset, user) for a prompt of n keys; see spec.plan.schedule."""
    wanted = {matched: False}                              # the branch point (dropped below if resume == matched)
    offsets = list(range(interval, n, interval)) if interval > 0 else []
    offsets.append(n - near_end)                           # dropped below unless inside (resume, n - 1]
    offsets += boundaries                                  # message boundaries (section 2 step 2)
    for c in offsets:
        span = _inside(c, spans)
        wanted[span[1] if span else c] = True              # M2
    return sorted((c, u) for c, u in wanted.items() if resume < c <= n - 1)
