"""Logits of an mlx-lm model on our layer caches against its own caches (tests/impl/test_architectures.py).

``compare(model)`` runs the same token stream through the model twice — once on
``mlx_lm.models.cache.make_prompt_cache(model)``, once on ``impl.caches.make_layer_caches(model)``
driven by ``impl.caches.forward`` — through a 6-token prefill, 4 single-token decode steps, a trim
of 3 (mlx-lm's ``trim_prompt_cache``, on both) and 3 more decode steps, and returns the first step
whose logits are not bit-identical (None when all are), plus a no-cache forward's distance for context.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

PROMPT = [1, 5, 9, 2, 7, 3]
DECODE = [4, 8, 6, 11]
REGEN = [12, 10, 13]


def steps():
    yield "prefill", PROMPT
    for i, t in enumerate(DECODE):
        yield f"decode {i}", [t]
    yield "trim 3", None
    for i, t in enumerate(REGEN):
        yield f"regen {i}", [t]


def compare(model, ours) -> str | None:
    """None when every step's logits are identical, else a description of the first difference."""
    from impl.caches import forward

    stock = make_prompt_cache(model)
    for name, toks in steps():
        if toks is None:
            a, b = trim_prompt_cache(stock, 3), trim_prompt_cache(ours, 3)
            if a != b:
                return f"{name}: mlx-lm trimmed {a}, ours {b}"
            continue
        want = model(mx.array([toks]), cache=stock)
        got = forward(model, toks, ours)
        mx.eval(want, got)
        if want.shape != got.shape or not mx.array_equal(want, got).item():
            diff = mx.abs(want - got).max().item() if want.shape == got.shape else float("nan")
            return f"{name}: logits differ (max |diff| {diff:.3g})"
    return None
