"""Build a model's layer caches and drive its forwards.

Invariants:
- ``make_layer_caches(model)`` mirrors exactly what ``mlx_lm.models.cache.make_prompt_cache(model)``
  builds, layer by layer: KVCache -> KVCache, RotatingKVCache(max_size=W, keep=k) ->
  WindowedCache(W, keep=k), ArraysCache(n) -> RecurrentCache(n), ChunkedKVCache(c) -> ChunkedCache(c),
  CacheList(parts) -> KVListCache / StateListCache of the parts mapped the same way, None -> None
  (stateless). Each of ours subclasses the mlx-lm class it replaces, so every isinstance check a
  model makes comes out as on the stock cache. Any other kind is refused with a CacheError naming
  the model, the layer and the kind (docs/caches.md), never approximated.
- ``forward(model, tokens, caches, n)`` is the only place a forward happens for the Engine: it
  refuses a forward that would cross a whole-state capture strictly inside it (the caller must cut
  there), copies out the lazy snapshots the forward overwrites (``before_write``, one evaluation for
  every layer), calls the model once, then ``finish_forward(n)`` on every cache, so all layers rest at
  one offset afterwards (T3).
"""

from __future__ import annotations

from typing import Optional, Sequence

import mlx.core as mx
from mlx_lm.models import cache as mlx_cache

from .base import CacheError, LayerCache
from .evaluation import deferred_eval
from .chunked import ChunkedCache
from .composite import make_list_cache
from .kv import KVCache
from .recurrent import RecurrentCache
from .windowed import WindowedCache


def make_layer_caches(model, max_kv_size: Optional[int] = None) -> list[Optional[LayerCache]]:
    """max_kv_size: as mlx-lm's (--max-kv-size): RotatingKVCache(max_kv_size, keep=4) layers for a
    model without its own make_cache."""
    stock = mlx_cache.make_prompt_cache(model, max_kv_size)
    return [None if c is None else _ours(c, i, model) for i, c in enumerate(stock)]


def _ours(c, i: int, model) -> LayerCache:
    """Our cache for mlx-lm's cache c of layer i (exact types only: a subclass could change anything)."""
    t = type(c)
    if t is mlx_cache.KVCache:
        return KVCache(layer=i)
    if t is mlx_cache.RotatingKVCache:
        return WindowedCache(c.max_size, layer=i, keep=c.keep)
    if t is mlx_cache.ArraysCache:
        return RecurrentCache(len(c.cache), layer=i)
    if t is mlx_cache.ChunkedKVCache:
        return ChunkedCache(c.chunk_size, layer=i)
    if t is mlx_cache.CacheList:
        return make_list_cache([_ours(p, i, model) for p in c.caches], layer=i)
    raise CacheError(f"{_name(model)} layer {i}: unsupported mlx-lm cache kind {t.__name__} (docs/caches.md)")


def _name(model) -> str:
    args = getattr(model, "args", None) or getattr(model, "config", None)
    return f"model {getattr(args, 'model_type', None) or type(model).__module__}"


def layer_kinds(caches: Sequence[Optional[LayerCache]]) -> list[Optional[str]]:
    return [None if c is None else c.kind for c in caches]


def copying(caches: Sequence[Optional[LayerCache]]) -> list[LayerCache]:
    """The caches whose kind can hold lazy snapshots (it answers ``would_copy``): the only ones
    ``before_write`` needs to ask, once per decode step."""
    return [c for c in caches if c is not None and type(c).would_copy is not LayerCache.would_copy]


def before_write(caches: Sequence[Optional[LayerCache]], n: int) -> None:
    """Copy out every lazy snapshot the next forward of n rows overwrites, all layers in one MLX
    evaluation (a layer's own write would evaluate its copies alone, one evaluation per layer). Most
    forwards (decode steps) overwrite none: then it returns without opening the evaluation block."""
    for c in caches:
        if c is not None and c.would_copy(n):
            break
    else:
        return
    with deferred_eval():
        for c in caches:
            if c is not None:
                c.before_write(n)


def forward(model, tokens, caches: Sequence[Optional[LayerCache]], n: Optional[int] = None, *,
            views_copied: bool = False):
    """Run one model forward over n positions and finish it on every cache; returns the logits.

    ``tokens``: token ids (list, [n] or [1, n] integer array). ``views_copied``: the caller already
    ran ``before_write(caches, n)`` (the Engine does, to time it as bookkeeping).
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
    if not views_copied:
        before_write(caches, n)
    logits = model(x, cache=list(caches))
    for c in caches:
        if c is not None:
            c.finish_forward(n)
    return logits
