"""mlx-lm's save_prompt_cache / load_prompt_cache and trim on our caches (impl/caches/persist.py).

- A prompt cache of our classes saved with mlx-lm's save_prompt_cache loads back with mlx-lm's
  load_prompt_cache as our classes, and decoding continues with the same logits as the caches
  that were saved (every kind: KV, windowed, recurrent, chunked, both composites).
- A file saved from mlx-lm's own caches still loads as mlx-lm's classes (nothing of theirs replaced).
- After mlx-lm's trim back to offset 0, ``empty()`` and ``nbytes`` report what mlx-lm's caches report.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models import cache as mlx_cache
from mlx_lm.models.cache import load_prompt_cache, make_prompt_cache, save_prompt_cache, trim_prompt_cache

from impl.caches import LayerCache, forward, make_layer_caches
from tests.support.small_archs import build

MODELS = ["llama", "gemma3_text", "mamba", "qwen3_next", "llama4", "deepseek_v32", "falcon_h1"]


@pytest.mark.parametrize("model_type", MODELS)
def test_save_load_round_trips_our_caches(model_type, tmp_path):
    model, _ = build(model_type)
    ours = make_layer_caches(model)
    forward(model, [1, 5, 9, 2, 7, 3, 4, 8, 6, 11], ours)
    path = str(tmp_path / "cache.safetensors")
    save_prompt_cache(path, ours, {"model": model_type})
    loaded, meta = load_prompt_cache(path, return_metadata=True)
    assert meta == {"model": model_type}
    assert [type(c) for c in loaded] == [type(c) for c in ours]
    assert all(isinstance(c, LayerCache) and c.offset == 10 for c in loaded)
    for t in (12, 10, 13):
        a = forward(model, [t], ours)
        b = forward(model, [t], loaded)
        mx.eval(a, b)
        assert mx.array_equal(a, b).item()


def test_mlx_lm_files_still_load_as_mlx_lm_classes(tmp_path):
    model, _ = build("gemma3_text")
    stock = make_prompt_cache(model)
    model(mx.array([[1, 2, 3]]), cache=stock)
    path = str(tmp_path / "stock.safetensors")
    save_prompt_cache(path, stock)
    assert [type(c) for c in load_prompt_cache(path)] == [type(c) for c in stock]
    assert {type(c) for c in stock} <= {mlx_cache.KVCache, mlx_cache.RotatingKVCache}


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "deepseek_v32"])
def test_trim_to_zero_reports_like_mlx_lm(model_type):
    model, _ = build(model_type)
    stock, ours = make_prompt_cache(model), make_layer_caches(model)
    model(mx.array([[1, 5, 9, 2]]), cache=stock)
    forward(model, [1, 5, 9, 2], ours)
    assert trim_prompt_cache(stock, 4) == trim_prompt_cache(ours, 4) == 4
    for s, o in zip(stock, ours):
        assert (s.empty(), s.nbytes) == (o.empty(), o.nbytes), type(o).__name__
