"""Small fixed-seed models for the cache kinds beyond gemma3 / qwen3next / mamba2 (issue #22).

- mamba:        ``mamba`` (v1): pure SSM; writes its state only into an ArraysCache, so it is the
                regression model for our RecurrentCache being one (RecurrentCache only).
- falcon_h1:    ``falcon_h1``: each layer a CacheList(ArraysCache, KVCache) -> StateListCache
                (a whole-state composite).
- deepseek_v32: ``deepseek_v32``: each layer a CacheList(KVCache, KVCache) (MLA keys + indexer
                keys) -> KVListCache (a sliceable composite).
- llama4:       ``llama4``: chunked attention (ChunkedKVCache, chunk 8) on three layers of four,
                full attention (KVCache) on the fourth.

Built, saved and loaded exactly like hybrid.py's models (its ``CONFIGS`` and ``SEEDS`` include these):
fixed seeds, float32, SmolLM2's vocabulary, hidden size 64, loaded through mlx-lm's loader.
"""

from __future__ import annotations

VOCAB = 49152
SEED = 20260201

CONFIGS: dict[str, dict] = {
    "mamba": {
        "model_type": "mamba", "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
        "state_size": 16, "num_hidden_layers": 2, "conv_kernel": 4, "time_step_rank": 4,
        "use_bias": False, "use_conv_bias": True, "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
    },
    "falcon_h1": {
        "model_type": "falcon_h1", "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "mamba_d_conv": 4, "mamba_d_head": 16, "mamba_n_heads": 8, "mamba_d_ssm": 128,
        "mamba_d_state": 16, "mamba_expand": 2, "mamba_chunk_size": 16, "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
    },
    "deepseek_v32": {
        "model_type": "deepseek_v32", "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "kv_lora_rank": 32, "q_lora_rank": 32,
        "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "index_head_dim": 16,
        "index_n_heads": 2, "index_topk": 16, "max_position_embeddings": 8192, "rope_theta": 10000.0,
    },
    "llama4": {
        "model_type": "llama4",
        "text_config": {
            "model_type": "llama4", "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
            "intermediate_size_mlp": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "attention_chunk_size": 8, "num_local_experts": 2,
            "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "no_rope_layers": [1, 1, 1, 0],
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None, "use_qk_norm": False,
            "attention_bias": False, "max_position_embeddings": 8192,
        },
        "vocab_size": VOCAB,
        "max_position_embeddings": 8192,
    },
}

SEEDS = {name: SEED + i for i, name in enumerate(CONFIGS)}
