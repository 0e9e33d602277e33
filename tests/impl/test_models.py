"""The real small models: loading (no hub), tokenizer, chat, A3 pool release, forward driver rules."""

from __future__ import annotations

import glob
import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from impl.caches import CacheError, forward, make_layer_caches
from impl.memory import mlx_memory, release_pool
from impl.models import MODEL_NAMES, DtypeUnsupported, hybrid, load, shared_tokenizer
from impl.platform import cpu_only_allocator

FAST = ["gemma3", "qwen3next", "mamba2", "mamba", "falcon_h1", "deepseek_v32", "llama4"]
KINDS = {
    "gemma3": ["windowed", "kv", "windowed", "kv"],
    "qwen3next": ["recurrent", "kv", "recurrent", "kv"],
    "mamba2": ["recurrent", "recurrent"],
    "mamba": ["recurrent", "recurrent"],
    "falcon_h1": ["recurrent", "recurrent"],            # CacheList(ArraysCache, KVCache): StateListCache
    "deepseek_v32": ["kv", "kv"],                        # CacheList(KVCache, KVCache): KVListCache
    "llama4": ["recurrent", "recurrent", "recurrent", "kv"],   # ChunkedCache x3, KVCache
}


def test_model_names():
    assert MODEL_NAMES == ("smollm2", "gemma3", "qwen3next", "mamba2", "mamba", "falcon_h1", "deepseek_v32",
                           "llama4")


@pytest.mark.parametrize("name", FAST)
def test_hybrid_models_load_small_float32(name):
    lm = load(name, "float32")
    assert lm is load(name, "float32")  # cached per process
    assert lm.layer_kinds == KINDS[name]
    assert lm.vocab_size == 49152 and lm.context_length == 8192
    params = tree_flatten(lm.model.parameters())
    assert all(v.dtype == mx.float32 for _, v in params)
    assert lm.n_params == sum(v.size for _, v in params) < 8_000_000   # untied heads of 49152 x 64: ~6.4M
    assert lm.weight_bytes == 4 * lm.n_params
    assert lm.tokenizer is shared_tokenizer()
    if name == "gemma3":
        assert lm.model.args.sliding_window == hybrid.WINDOW


def test_a3_pool_released_after_load(monkeypatch):
    import impl.models as models

    monkeypatch.setattr(models, "_loaded", {})  # force a real load in this process
    x = mx.ones((1024, 1024))
    mx.eval(x)
    del x
    # freed bytes sit in the allocator pool (the CPU's and Metal's allocators keep them; MLX's CUDA
    # allocator returned this buffer at once on the H200: there the load must still leave the pool empty)
    assert mlx_memory()["cache"] > 0 or not cpu_only_allocator()
    lm = models.load("mamba2")
    assert mlx_memory()["cache"] == 0  # load() released the pool: only weights stay held (A3)
    assert mlx_memory()["active"] >= lm.weight_bytes
    release_pool()
    assert mlx_memory()["cache"] == 0


@pytest.mark.parametrize("name", ["deepseek_v32", "llama4", "mamba2"])
def test_a_half_precision_load_either_runs_or_says_why(name):
    """A model loaded in bfloat16 runs a request's forward; where the backend lacks a kernel in that
    dtype (MLX's CPU gather_mm is float32-only: the MoE models), the load itself raises
    DtypeUnsupported naming the model, the dtype and the backend, and caches nothing, instead of the
    first request failing with MLX's bare message."""
    import impl.models as models

    try:
        lm = load(name, "bfloat16")
    except DtypeUnsupported as e:
        assert name in str(e) and "bfloat16" in str(e) and "backend" in str(e), str(e)
        assert f"{name}@bfloat16" not in models._loaded
        return
    assert lm.dtype == "bfloat16"
    out = lm.model(mx.array([[1, 2, 3]]), cache=make_layer_caches(lm.model))
    mx.eval(out)
    assert out.dtype == mx.bfloat16


def test_a_loaded_model_is_frozen_out_of_garbage_collection():
    """A loaded model's objects (modules, parameters, the tokenizer) are moved out of the collector's
    generations (gc.freeze): full collections no longer rescan them on every request."""
    import gc

    lm = load("qwen3next")
    tracked = {id(o) for o in gc.get_objects()}
    assert id(lm.model) not in tracked and id(lm.tokenizer) not in tracked
    assert id(lm.model.layers) not in tracked


def test_hybrid_generation_is_deterministic_mlx_lm_format(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIX_TRIE_CACHE", str(tmp_path))
    path = hybrid.model_dir("mamba2")
    hybrid.generate("mamba2", path)
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "mamba2"
    fresh = mx.load(str(path / "model.safetensors"))
    monkeypatch.delenv("PREFIX_TRIE_CACHE")
    # through mlx-lm's loader, not the process's model cache (an Engine wraps a cached model's embedding)
    cached = dict(tree_flatten(hybrid.load("mamba2")[0].parameters()))
    assert fresh.keys() == cached.keys()
    for k in fresh:
        assert mx.array_equal(fresh[k], cached[k]), k


def test_generation_never_shows_a_partial_weights_file_to_the_loader(tmp_path, monkeypatch):
    """mlx-lm's loader reads every model*.safetensors in the model's directory: a generator's
    temporary file must never be one of them (in CI a concurrent load read a half-written one)."""
    monkeypatch.setenv("PREFIX_TRIE_CACHE", str(tmp_path))
    path = hybrid.model_dir("mamba2")
    seen = []
    real = mx.save_safetensors

    def save(file, *a, **k):
        real(file, *a, **k)
        seen.append(sorted(glob.glob(str(path / "model*.safetensors"))))   # what a load would read now

    monkeypatch.setattr(mx, "save_safetensors", save)
    hybrid.generate("mamba2", path)
    assert seen == [[]], seen
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_tokenizer_from_gguf():
    tok = shared_tokenizer()
    ids = tok.encode("Hello world 42 <|im_start|>user")
    assert tok.decode(ids) == "Hello world 42 <|im_start|>user"
    assert tok.token_to_id("<|im_start|>") in ids  # control token is one id, not split
    assert tok.eos_token_id == tok.token_to_id("<|im_end|>")
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    text = tok.decode(chat)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_smollm2_answers_paris():
    """Float32 SmolLM2 (the GGUF's Q4_1 weights dequantised); in bfloat16 stock mlx-lm's forward of the same
    weights answers "L'Étoile, la Marseillaise, ..." as ours does, so this pins the float32 load."""
    lm = load("smollm2", "float32")
    assert lm.layer_kinds == ["kv"] * 30
    assert 130e6 < lm.n_params < 140e6
    tok = lm.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    caches = make_layer_caches(lm.model)
    logits = forward(lm.model, prompt, caches)[0, -1]
    out = []
    for _ in range(24):
        t = int(mx.argmax(logits).item())
        if t == tok.eos_token_id:
            break
        out.append(t)
        logits = forward(lm.model, [t], caches)[0, -1]
    answer = tok.decode(out)
    assert "Paris" in answer, answer
    assert mlx_memory()["cache"] >= 0


@pytest.mark.parametrize("name", ["qwen3next", "gemma3", "mamba2"])
def test_forward_refuses_whole_state_capture_inside(name):
    lm = load(name)
    caches = make_layer_caches(lm.model)
    for c in caches:
        c.prepare_captures([4])
    with pytest.raises(CacheError, match="4"):
        forward(lm.model, list(range(10, 20)), caches)
    assert all(c.offset == 0 for c in caches)  # refused before the model ran
    forward(lm.model, list(range(10, 14)), caches)
    forward(lm.model, list(range(14, 20)), caches)
    caps = [c.take_captures()[0] for c in caches]
    assert all(s is not None and s.end == 4 for s in caps)
    for s in caps:
        s.release()


def test_attention_spans_make_an_item_bidirectional():
    lm = load("gemma3")
    toks = list(range(100, 112))
    plain = forward(lm.model, toks, make_layer_caches(lm.model))[0]
    caches = make_layer_caches(lm.model)
    for c in caches:
        c.attention_spans = [(4, 8)]
    spanned = forward(lm.model, toks, caches)[0]
    d = np.abs(np.array((plain - spanned).astype(mx.float32))).max(axis=-1)
    assert (d[:4] == 0).all()  # positions before the item are unaffected
    assert (d[4:7] > 0).all()  # positions inside see the later positions of their item


def test_memory_returns_to_baseline_after_snapshots():
    lm = load("qwen3next")

    def cycle():
        caches = make_layer_caches(lm.model)
        for c in caches:
            c.prepare_captures([8, 16])
        for a, b in ((0, 8), (8, 16), (16, 30)):
            forward(lm.model, list(range(a + 50, b + 50)), caches)
        snaps = [s for c in caches for s in c.take_captures()] + [c.snapshot(16) for c in caches]
        merged = [c.merge_snapshots(a, b) for c, a, b in zip(caches, snaps[0::2][:4], snaps[1::2][:4])]
        for c in caches:
            c.free()
        for s in snaps + merged:
            if s is not None and not s.closed:
                s.release()

    cycle()          # first use creates MLX's own lasting constants (a few bytes): not ours to count
    release_pool()
    mx.synchronize()
    base = mx.get_active_memory()
    cycle()
    mx.synchronize()
    assert mx.get_active_memory() <= base


@pytest.mark.parametrize("name", FAST)
def test_drop_in_for_mlx_lm_generate(name):
    """mlx-lm's own generation loop runs on our caches and yields the stock caches' tokens."""
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    lm = load(name)
    prompt = mx.array(list(range(300, 340)))

    def run(cache):
        return [int(t) for t, _ in generate_step(prompt, lm.model, prompt_cache=cache, max_tokens=12)]

    assert run(make_layer_caches(lm.model)) == run(make_prompt_cache(lm.model))
