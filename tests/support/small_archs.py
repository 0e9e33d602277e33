"""Small builds of mlx-lm's architectures, for tests/impl/test_architectures.py.

``ARCHITECTURES`` names the model types mlx-lm's own tests/test_models.py builds (ml-explore/mlx-lm
at d78bf58, read, not copied: the configs here are written from each ModelArgs' fields).
``small_config(model_type)`` fills a ModelArgs with small sizes by field name (hidden size 32,
two layers, four heads, vocabulary 128, ...) plus a few per-architecture ``OVERRIDES``;
``build(model_type, seed)`` builds the model in float32 with fixed-seed weights. A model type the
rules cannot build raises ``NotBuilt`` with the reason (the test reports it, never hides it).
"""

from __future__ import annotations

import dataclasses
import typing

import mlx.core as mx

ARCHITECTURES = (
    "afm7 afmoe apertus baichuan_m1 bailing_moe bailing_moe_linear bitnet cohere cohere2 dbrx deepseek "
    "deepseek_v2 deepseek_v3 deepseek_v32 dots1 ernie4_5 ernie4_5_moe exaone exaone4 exaone_moe falcon_h1 "
    "falcon_mamba gemma gemma2 gemma3_text gemma3n gemma4 gemma4_text glm glm4 glm4_moe glm4_moe_lite "
    "gpt2 gpt_bigcode gpt_neox gpt_oss granite granitemoe granitemoehybrid helium hunyuan hunyuan_v1_dense "
    "internlm2 internlm3 iquestloopcoder jamba kimi_linear kimi_vl laguna lfm2 lfm2_moe llama llama4 "
    "llama4_text longcat_flash longcat_flash_ngram mamba mamba2 mimo mimo_v2_flash minicpm minimax "
    "mixtral nanochat nemotron nemotron_h olmo olmo2 olmo3 olmoe openelm phi3 phi3small phimoe pixtral "
    "plamo plamo2 qwen qwen2 qwen2_moe qwen3 qwen3_5 qwen3_5_moe qwen3_moe qwen3_next qwen3_vl "
    "qwen3_vl_moe recurrent_gemma rwkv7 seed_oss smollm3 stablelm starcoder2 step3p5 telechat3 youtu_llm"
).split()

VOCAB = 128
MAX_PARAMS = 2_000_000
WINDOW = 8

# Field name -> small value (applied whether or not the field has a default).
SIZES = {
    "hidden_size": 32, "d_model": 32, "n_embd": 32, "dim": 32, "hidden_dim": 64,
    "num_hidden_layers": 2, "n_layer": 2, "n_layers": 2, "num_layers": 2,
    "intermediate_size": 64, "ffn_hidden_size": 64, "n_inner": 64, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32, "expert_intermediate_size": 32, "block_ff_dim": 64,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_heads": 4,
    "num_key_value_heads": 2, "n_kv_heads": 2, "num_kv_heads": 2, "multi_query_group_num": 2,
    "head_dim": 8, "kv_channels": 8, "attention_head_dim": 8, "head_size": 8,
    "vocab_size": VOCAB, "max_position_embeddings": 512, "n_positions": 512, "n_ctx": 512,
    "seq_length": 512, "max_seq_len": 512,
    "num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "num_shared_experts": 1, "moe_topk": 2,
    "moe_k": 2, "topk_group": 1, "n_group": 1, "first_k_dense_replace": 1,
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 8, "index_head_dim": 8, "index_n_heads": 2, "index_topk": 4,
    "sliding_window": WINDOW, "attention_window_size": WINDOW, "window_size": WINDOW,
    "attention_chunk_size": WINDOW, "sliding_window_size": WINDOW,
    "state_size": 8, "ssm_state_size": 8, "mamba_d_state": 8, "d_state": 8,
    "conv_kernel": 4, "mamba_d_conv": 4, "d_conv": 4, "conv_L_cache": 3,
    "time_step_rank": 4, "mamba_d_head": 8, "mamba_n_heads": 8, "mamba_d_ssm": 64,
    "mamba_expand": 2, "mamba_chunk_size": 8, "chunk_size": 8,
    "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 8,
    "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
    "vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 8,
    "partial_rotary_factor": 0.5, "rotary_pct": 0.5, "rotary_emb_fraction": 0.5,
}
DEFAULTS_BY_TYPE = {int: 2, float: 1e-5, bool: False, str: "", list: [], dict: {}, typing.Any: None}


class NotBuilt(Exception):
    """The rules here cannot build this architecture small (the reason is the message)."""


def _base_type(t):
    origin = typing.get_origin(t)
    if origin is typing.Union:
        args = [a for a in typing.get_args(t) if a is not type(None)]
        return _base_type(args[0]) if args else None
    return origin or t


def _args_class(t):
    """The dataclass inside a hint like Union[TextArgs, dict] (None if there is none)."""
    for a in (typing.get_args(t) or (t,)):
        if dataclasses.is_dataclass(a):
            return a
    return None


def _fill(args_class, model_type: str, extra: dict) -> dict:
    config = {"model_type": model_type}
    hints = typing.get_type_hints(args_class)
    for f in dataclasses.fields(args_class):
        name = f.name
        if name in SIZES:
            config[name] = SIZES[name]
        elif name in extra:
            continue
        elif name in ("text_config", "vision_config") and _args_class(hints.get(name)) is not None:
            config[name] = _fill(_args_class(hints.get(name)), model_type, {})
            config[name].update(extra.get("text_config_extra", {}) if name == "text_config" else {})
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and name != "model_type":
            t = _base_type(hints.get(name, int))
            if t not in DEFAULTS_BY_TYPE:
                raise NotBuilt(f"no small value for the required field {name}: {hints.get(name)}")
            config[name] = DEFAULTS_BY_TYPE[t]
    for k in ("rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon", "norm_epsilon"):
        if k in config and not config[k]:
            config[k] = 1e-5
    if "rope_theta" in config:
        config["rope_theta"] = 10000.0
    config.update({k: v for k, v in extra.items() if k != "text_config_extra"})
    return config


# Per-architecture corrections where the field-name rules do not give a consistent config.
OVERRIDES: dict[str, dict] = {
    "mamba": {"use_bias": False, "use_conv_bias": True, "tie_word_embeddings": True},
    "falcon_mamba": {"use_bias": False, "use_conv_bias": True, "tie_word_embeddings": True},
    "mamba2": {"num_heads": 8, "head_dim": 8, "intermediate_size": 64, "n_groups": 1,
               "time_step_limit": [0.0, 1e9], "use_conv_bias": True},
    "gemma3_text": {"sliding_window_pattern": 2, "query_pre_attn_scalar": 8},
    "cohere2": {"sliding_window_pattern": 2},
    "olmo3": {"layer_types": ["sliding_attention", "full_attention"]},
    "afmoe": {"layer_types": ["sliding_attention", "full_attention"]},
    "lfm2": {"layer_types": ["conv", "full_attention"], "block_dim": 32, "block_ff_dim": 64,
             "block_auto_adjust_ff_dim": False},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    "nemotron_h": {"hybrid_override_pattern": ["M", "*"]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "qwen3_next": {"full_attention_interval": 2},
    "plamo": {"n_shared_head": 2},
    "longcat_flash": {"mla_scale_q_lora": True, "mla_scale_kv_lora": True, "zero_expert_type": "identity"},
    "longcat_flash_ngram": {"mla_scale_q_lora": True, "mla_scale_kv_lora": True,
                            "zero_expert_type": "identity"},
    "gemma4_text": {"sliding_window_pattern": 2, "num_hidden_layers": 4, "num_kv_shared_layers": 2},
    "qwen3": {"rope_theta": 10000.0},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"], "lru_width": 32, "logits_soft_cap": 30.0},
    "llama4_text": {"no_rope_layers": [1, 0], "interleave_moe_layer_step": 2},
    "llama4": {"text_config_extra": {"no_rope_layers": [1, 1, 1, 0], "interleave_moe_layer_step": 2,
                                    "num_experts_per_tok": 1, "num_hidden_layers": 4}},
}


def small_config(model_type: str) -> dict:
    from mlx_lm.utils import _get_classes

    try:
        _model_class, args_class = _get_classes(config={"model_type": model_type})
    except ValueError as e:
        raise NotBuilt(str(e)) from e
    return _fill(args_class, model_type, OVERRIDES.get(model_type, {}))


def build(model_type: str, seed: int = 0):
    """(model, config): the architecture built small, float32, fixed-seed weights, evaluated."""
    from mlx.utils import tree_map
    from mlx_lm.utils import _get_classes

    config = small_config(model_type)
    model_class, args_class = _get_classes(config=config)
    mx.random.seed(seed)
    try:
        model = model_class(args_class.from_dict(config))
    except Exception as e:   # noqa: BLE001 - any construction failure is reported, not hidden
        raise NotBuilt(f"{type(e).__name__}: {e}") from e
    from mlx.utils import tree_flatten

    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    if n_params > MAX_PARAMS:    # a default the rules did not shrink (a vision tower, a big table)
        raise NotBuilt(f"{n_params} parameters after the small-config rules (limit {MAX_PARAMS})")
    model.update(tree_map(lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p,
                          model.parameters()))
    mx.eval(model.parameters())
    model.eval()
    return model, config


if __name__ == "__main__":       # ./dev python tests/support/small_archs.py MODEL_TYPE...: one process each
    import sys

    from impl.caches import CacheError, make_layer_caches
    from tests.support.arch_compare import compare

    for a in sys.argv[1:] or ARCHITECTURES:
        try:
            m, _ = build(a)
            print(a, compare(m, make_layer_caches(m)) or "identical")
        except (NotBuilt, CacheError) as e:
            print(a, f"{type(e).__name__}: {e}")
