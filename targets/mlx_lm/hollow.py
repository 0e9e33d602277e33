"""A hollow model: a model's writes to its caches without its arithmetic (the target's fast tier).

mlx-lm's prompt cache never reads the values its caches hold: which entries it keeps, fetches, trims and
evicts follows from their keys, offsets and byte sizes only. A hollow model writes, for every forward,
rows of exactly the shapes and dtypes the real model writes, into the same caches, through the same
cache methods, and returns zero logits. The server's code (BatchGenerator, stream_generate,
LRUPromptCache) then runs unchanged and makes the same calls with the same cache states, at a fraction
of the cost: every rule but C1 (which judges the values) is checked at a few hundred requests a second.

Invariants:
- The write shapes are read from one real forward of the model on fresh caches (`make_prompt_cache`),
  so a hollow model follows its model's configuration, whatever the architecture.
- Per forward of L tokens and batch B, for every layer cache, in layer order, as mlx-lm's models do:
  a cache with `maybe_trim_front` (ChunkedKVCache) is trimmed first (llama4 does so before attending);
  a KV cache gets one `update_and_fetch` of B x heads x L rows; an ArraysCache gets every state slot
  the model sets, then `advance(L)`; a CacheList gets each of its caches in turn.
- tests/targets/test_mlx_lm_hollow.py shows the claim above on every model of the zoo, --kv-bits
  included: the same programs make the same cache calls and leave entries equal in keys, types,
  offsets and bytes after every request, hollow or real.
- The greedy choices of a hollow model are all token 0 (zero logits): a draft model's proposals are
  always accepted, so speculative decoding runs its all-accepted path only (the draft configuration
  is therefore not in that equality, and findings that need a rejected proposal are the real tier's).
"""
from __future__ import annotations

import mlx.core as mx


def _layout(c):
    """What one real forward wrote into the layer cache `c`."""
    if hasattr(c, "caches"):                                        # CacheList
        return ("list", tuple(_layout(x) for x in c.caches))
    if type(c).__name__ == "ArraysCache":
        return ("arrays", tuple(None if a is None else (tuple(a.shape[1:]), a.dtype) for a in c.cache))
    return ("kv", (c.keys.shape[1], c.keys.shape[3], c.values.shape[3], c.keys.dtype))


def _write(c, layout, B: int, L: int) -> None:
    kind, spec = layout
    if kind == "list":
        for x, sub in zip(c.caches, spec):
            _write(x, sub, B, L)
    elif kind == "arrays":
        for i, s in enumerate(spec):
            if s is not None:
                c[i] = mx.zeros((B,) + s[0], dtype=s[1])
        c.advance(L)
    else:
        heads, dk, dv, dtype = spec
        if hasattr(c, "maybe_trim_front"):
            c.maybe_trim_front()
        c.update_and_fetch(mx.zeros((B, heads, L, dk), dtype=dtype), mx.zeros((B, heads, L, dv), dtype=dtype))


class HollowModel:
    """`model`'s cache writes without its arithmetic; every other attribute is the model's own."""

    def __init__(self, model, vocab: int):
        from mlx_lm.models.cache import make_prompt_cache
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([[1, 2]]), cache=cache))
        self.__dict__.update(_model=model, _layouts=tuple(_layout(c) for c in cache), _vocab=vocab)

    def __call__(self, inputs, cache=None, **kwargs):
        B, L = inputs.shape
        for c, layout in zip(cache, self._layouts):
            _write(c, layout, B, L)
        return mx.zeros((B, L, self._vocab), dtype=mx.float32)

    def __getattr__(self, name):
        return getattr(self._model, name)
