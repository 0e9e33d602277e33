"""Small fixed-seed models of mlx-lm architectures, built in memory from a config dict.

Invariants:
- Each model is one of mlx-lm's own model classes (`mlx_lm.models.<model_type>.Model`) built small:
  hidden size 64, a 512-token vocabulary, float32, weights from `mx.random.seed(SEED)`. The same
  config dicts appear verbatim in exported scripts, so a maintainer rebuilds the identical model.
- Cache kinds per model (mlx-lm's `make_prompt_cache`):
    llama      KVCache x2                                  (pure attention; trimmable)
    gemma3     RotatingKVCache(window 8) + KVCache          (trimmable only while offset < window)
    qwen3next  ArraysCache (gated delta) + KVCache          (never trimmable)
    mamba2     ArraysCache x2                              (never trimmable)
    llama4     ChunkedKVCache(chunk 8) x3 + KVCache        (trimmable, but only back to the chunk window;
                                                            no `merge`: the server serves it sequentially)
    falcon_h1  CacheList(ArraysCache, KVCache) x2          (never trimmable; batched)
    llama_q    KVCache x2 with head_dim 64                 (for --kv-bits: the server's --kv-group-size 64
                                                            needs a head dimension it divides)
    llama_draft KVCache x1                                 (the draft model for llama: --draft-model)
  The zoo's configs (impl/models/zoo.py) with this module's vocabulary; RotatingKVCache with keep > 0
  is made only by make_prompt_cache(model, max_kv_size), which mlx_lm.server 0.32.2 never passes (it has
  no --max-kv-size): the server cannot build that kind.
- `server_path(model)` applies the server's own test (ModelProvider._load: no draft model and every
  layer cache has `merge`) plus ResponseGenerator._is_batchable's defaults (no seed, no --kv-bits):
  all four models take the batched path (BatchGenerator) for text requests without images.
"""
from __future__ import annotations

import importlib

VOCAB = 512
SEED = 20261203
WINDOW = 8

CONFIGS: dict[str, dict] = {
    "llama": dict(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB,
                  rope_theta=10000.0, tie_word_embeddings=True),
    "gemma3": dict(model_type="gemma3_text", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                   rms_norm_eps=1e-6, vocab_size=VOCAB, rope_theta=1_000_000.0,
                   rope_local_base_freq=10_000.0, sliding_window=WINDOW, sliding_window_pattern=2,
                   max_position_embeddings=8192),
    "qwen3next": dict(model_type="qwen3_next", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_value_heads=4,
                      linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                      linear_conv_kernel_dim=4, num_experts=0, num_experts_per_tok=1, decoder_sparse_step=1,
                      shared_expert_intermediate_size=0, mlp_only_layers=[], moe_intermediate_size=0,
                      rms_norm_eps=1e-6, vocab_size=VOCAB, rope_theta=10_000.0, partial_rotary_factor=0.5,
                      max_position_embeddings=8192, tie_word_embeddings=True, full_attention_interval=2),
    "mamba2": dict(model_type="mamba2", num_heads=4, head_dim=16, vocab_size=VOCAB, hidden_size=64,
                   intermediate_size=64, state_size=16, num_hidden_layers=2, layer_norm_epsilon=1e-5,
                   conv_kernel=4, n_groups=1, use_bias=False, use_conv_bias=True, tie_word_embeddings=True,
                   time_step_limit=[0.0, 1e9], time_step_rank="auto", max_position_embeddings=8192),
}

def _zoo(name):
    from impl.models.zoo import CONFIGS as ZOO
    cfg = dict(ZOO[name], vocab_size=VOCAB)
    if "text_config" in cfg:
        cfg["text_config"] = dict(cfg["text_config"], vocab_size=VOCAB)
    return cfg


CONFIGS["llama4"] = _zoo("llama4")
CONFIGS["falcon_h1"] = _zoo("falcon_h1")
CONFIGS["llama_q"] = dict(CONFIGS["llama"], num_attention_heads=2, num_key_value_heads=1, head_dim=64)
CONFIGS["llama_draft"] = dict(CONFIGS["llama"], num_hidden_layers=1)
MODEL_NAMES = ("llama", "gemma3", "qwen3next", "mamba2", "llama4", "falcon_h1", "llama_q")
DRAFTS = {"llama": "llama_draft"}            # a model and the draft model the machine may serve it with

_built: dict = {}


def build(name: str, hollow: bool = False):
    """The model `name`, built once per process (float32, weights evaluated); `hollow`: its hollow
    twin (targets.mlx_lm.hollow: the same cache writes, no arithmetic)."""
    if hollow:
        if (name, "hollow") not in _built:
            from targets.mlx_lm.hollow import HollowModel
            _built[(name, "hollow")] = HollowModel(build(name), VOCAB)
        return _built[(name, "hollow")]
    if name not in _built:
        import mlx.core as mx
        cfg = dict(CONFIGS[name])
        mod = importlib.import_module("mlx_lm.models." + cfg["model_type"])
        mx.random.seed(SEED)
        model = mod.Model(mod.ModelArgs.from_dict(cfg))
        model.set_dtype(mx.float32)
        mx.eval(model.parameters())
        model.eval()
        _built[name] = model
    return _built[name]


def cache_kinds(model) -> list:
    from mlx_lm.models.cache import make_prompt_cache
    return [type(c).__name__ for c in make_prompt_cache(model)]


def server_path(model) -> str:
    """'batched' or 'sequential': the path mlx_lm.server takes for a text request on this model with
    the server's defaults (ModelProvider._load's is_batchable, ResponseGenerator._is_batchable)."""
    from mlx_lm.models.cache import make_prompt_cache
    return "batched" if all(hasattr(c, "merge") for c in make_prompt_cache(model)) else "sequential"
