"""Small fixed-seed models of three mlx-lm architectures, for exercising every cache kind.

- gemma3:    ``gemma3_text``: sliding-window attention layers (WindowedCache, window 8) interleaved
             with full-attention layers (KVCache).
- qwen3next: ``qwen3_next``: gated-delta linear attention (RecurrentCache) + full attention (KVCache).
- mamba2:    ``mamba2``: pure SSM (RecurrentCache only).

Invariants:
- Weights are generated once per seed (``mx.random.seed``) on the CPU stream (the same bits whatever
  the process's default device), saved in mlx-lm's on-disk format
  (config.json + model.safetensors) under ``$PREFIX_TRIE_CACHE`` or ``<repo>/.cache/models``, and
  always loaded back through mlx-lm's own loader (``mlx_lm.utils.load_model``), so what the tests run
  is exactly what mlx-lm would run from disk.
- float32 throughout; vocab = SmolLM2's (49152) so the SmolLM2 tokenizer serves every model.
- Hidden size 64 and a handful of layers: a 256-token forward takes tens of milliseconds here.
- The window is small (8) so ordinary test prompts wrap it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from . import zoo as _zoo

VOCAB = 49152
WINDOW = 8
SEED = 20260101
FORMAT_VERSION = 2  # bump to regenerate every cached model (2: generated on the CPU stream)

CONFIGS: dict[str, dict] = {
    "gemma3": {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "sliding_window": WINDOW,
        "sliding_window_pattern": 2,
        "max_position_embeddings": 8192,
    },
    "qwen3next": {
        "model_type": "qwen3_next",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_experts": 0,
        "num_experts_per_tok": 1,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 0,
        "mlp_only_layers": [],
        "moe_intermediate_size": 0,
        "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB,
        "rope_theta": 10_000.0,
        "partial_rotary_factor": 0.5,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "full_attention_interval": 2,
    },
    "mamba2": {
        "model_type": "mamba2",
        "num_heads": 4,
        "head_dim": 16,
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 64,
        "state_size": 16,
        "num_hidden_layers": 2,
        "layer_norm_epsilon": 1e-5,
        "conv_kernel": 4,
        "n_groups": 1,
        "use_bias": False,
        "use_conv_bias": True,
        "tie_word_embeddings": True,
        "time_step_limit": [0.0, 1e9],
        "time_step_rank": "auto",
        "max_position_embeddings": 8192,
    },
}

SEEDS = {"gemma3": SEED, "qwen3next": SEED + 1, "mamba2": SEED + 2}
CONFIGS.update(_zoo.CONFIGS)     # mamba, falcon_h1, deepseek_v32, llama4 (impl/models/zoo.py)
SEEDS.update(_zoo.SEEDS)


def cache_root() -> Path:
    if os.environ.get("PREFIX_TRIE_CACHE"):
        return Path(os.environ["PREFIX_TRIE_CACHE"])
    return Path(__file__).resolve().parents[2] / ".cache" / "models"


def model_dir(name: str) -> Path:
    return cache_root() / f"{name}-v{FORMAT_VERSION}-s{SEEDS[name]}"


def generate(name: str, path: Path) -> None:
    """Build the architecture with fixed-seed random weights and save it in mlx-lm's format."""
    from mlx_lm.utils import _get_classes

    config = dict(CONFIGS[name])
    model_class, args_class = _get_classes(config=config)
    # On the CPU stream whatever the default device: the same seed gives the same bits in every process
    # of a machine (a GPU's random kernels round otherwise, and workers on both devices share the files)
    with mx.stream(mx.cpu):
        mx.random.seed(SEEDS[name])
        model = model_class(args_class.from_dict(config))
        weights = dict(tree_flatten(model.parameters()))
        if name == "gemma3":
            weights.pop("lm_head.weight", None)  # gemma3_text ties the head when lm_head is absent
        weights = {k: v.astype(mx.float32) for k, v in weights.items()}
        mx.eval(weights)
    path.mkdir(parents=True, exist_ok=True)
    # Per-process temporary names and atomic renames: test workers and runners may generate
    # concurrently, and the content is deterministic, so the last rename wins with identical bytes.
    # The temporary files live beside the model's directory, not in it: mlx-lm's loader reads every
    # model*.safetensors it finds there, a half-written one included.
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp.safetensors"
    mx.save_safetensors(str(tmp), weights, metadata={"format": "mlx"})
    os.replace(tmp, path / "model.safetensors")
    tmp_config = path.parent / f".{path.name}.{os.getpid()}.tmp.json"
    tmp_config.write_text(json.dumps(config, indent=2))
    os.replace(tmp_config, path / "config.json")


def load(name: str):
    """(model, config) loaded through mlx-lm's loader, generating the files on first use."""
    from mlx_lm.utils import load_model

    if name not in CONFIGS:
        raise KeyError(f"unknown hybrid model {name!r}; known: {sorted(CONFIGS)}")
    path = model_dir(name)
    if not (path / "model.safetensors").exists() or not (path / "config.json").exists():
        generate(name, path)
    model, config = load_model(path)
    model.eval()
    return model, config
