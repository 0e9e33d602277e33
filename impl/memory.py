"""MLX allocator figures and pool release (REFERENCE A3).

Invariants:
- ``mlx_memory()`` reports MLX's own counters: ``active`` (bytes held by live arrays), ``cache``
  (freed bytes kept in the allocator's pool for reuse), ``peak`` (high-water mark of active).
- ``release_pool()`` returns the pool to the system (and says how many bytes it held); after it,
  ``cache`` is 0. Operations that create temporary arrays (loading weights, evicting, merging) call
  it when they end, so an idle process holds its live arrays and nothing more.
"""

from __future__ import annotations

import mlx.core as mx


def mlx_memory() -> dict:
    return {
        "active": mx.get_active_memory(),
        "cache": mx.get_cache_memory(),
        "peak": mx.get_peak_memory(),
    }


def release_pool() -> int:
    """Return the allocator pool to the system; returns the bytes it held just before."""
    mx.synchronize()
    held = int(mx.get_cache_memory())
    mx.clear_cache()
    return held
