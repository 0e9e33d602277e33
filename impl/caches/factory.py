"""Build a model's layer caches and drive its forwards.

Invariants:
- ``make_layer_caches(model)`` mirrors exactly what ``mlx_lm.models.cache.make_prompt_cache(model)``
  builds, layer by layer: KVCache -> KVCache, RotatingKVCache(max_size=W, keep=0) ->
  WindowedCache(W), ArraysCache(n) -> RecurrentCache(n), None -> None (stateless). Any other kind is
  refused with a CacheError naming it, never approximated.
- ``forward(model, tokens, caches, n)`` is the only place a forward happens for the Engine: it
  refuses a forward that would cross a whole-state capture strictly inside it (the caller must cut
  there), calls the model once, then ``finish_forward(n)`` on every cache, so all layers rest at
  one offset afterwards (T3).
"""

from __future__ import annotations

from typing import Optional, Sequence

import mlx.core as mx
from mlx_lm.models import cache as mlx_cache

from .base import CacheError, LayerCache
from .kv import KVCache
from .recurrent import RecurrentCache
from .windowed import WindowedCache


def make_layer_caches(model) -> list[Optional[LayerCache]]:
    stock = mlx_cache.make_prompt_cache(model)
    out: list[Optional[LayerCache]] = []
    for i, c in enumerate(stock):
        t = type(c)
        if c is None:
            out.append(None)
        elif t is mlx_cache.KVCache:
            out.append(KVCache(layer=i))
        elif t is mlx_cache.RotatingKVCache:
            if c.keep != 0:
                raise CacheError(f"layer {i}: RotatingKVCache with keep={c.keep} is not supported (keep=0 only)")
            out.append(WindowedCache(c.max_size, layer=i))
        elif t is mlx_cache.ArraysCache:
            out.append(RecurrentCache(len(c.cache), layer=i))
        else:
            raise CacheError(f"layer {i}: unsupported mlx-lm cache kind {t.__name__}")
    return out


def layer_kinds(caches: Sequence[Optional[LayerCache]]) -> list[Optional[str]]:
    return [None if c is None else c.kind for c in caches]


def forward(model, tokens, caches: Sequence[Optional[LayerCache]], n: Optional[int] = None):
    """Run one model forward over n positions and finish it on every cache; returns the logits.

    ``tokens``: token ids (list, [n] or [1, n] integer array).
    """
    x = tokens if isinstance(tokens, mx.array) else mx.array(tokens)
    if x.ndim == 1:
        x = x[None]
    length = x.shape[1]
    if n is None:
        n = length
    if n != length or n < 1:
        raise CacheError(f"forward of {length} positions but n={n}")
    for c in caches:
        if c is not None:
            inside = c.captures_inside(n)
            if inside:
                raise CacheError(
                    f"capture offset {inside[0]} is strictly inside this forward [{c.offset},{c.offset + n}) "
                    f"for the {c.kind} layer {c.layer}: cut the forward there"
                )
    logits = model(x, cache=list(caches))
    for c in caches:
        if c is not None:
            c.finish_forward(n)
    return logits
