"""The real small models the project runs: SmolLM2-135M (GGUF, llama) and three fixed-seed hybrids.

Invariants:
- ``load(name)`` returns one ``LoadedModel`` per name per process (cached); weights are float32 and
  evaluated, and the allocator pool is released afterwards so only the weights stay held (A3).
  ``load(name, dtype)`` casts at load ("bfloat16", "float16"; "q4": SmolLM2's quantised GGUF
  weights as shipped); the default is $PREFIX_TRIE_DTYPE or float32 (the CPU's fast path,
  PLATFORM.md). One LoadedModel per (name, dtype); ``name`` stays the model's name. A half-precision
  load runs one token through the model first and raises ``DtypeUnsupported`` (naming the model, the
  dtype and the backend) where the backend cannot: MLX's CPU ``gather_mm``, which the MoE models
  (deepseek_v32, llama4) use, takes float32 only. Without it the first request would fail instead.
- ``layer_kinds`` lists, per model layer, the cache kind ``impl.caches.make_layer_caches`` builds for
  it ("kv" | "windowed" | "recurrent" | None for stateless layers).
- Every model uses the SmolLM2 tokenizer (the hybrids share its vocabulary size).
- After a load, ``gc.freeze()``: the tens of thousands of objects a model and its tokenizer create live
  as long as the process, and Python's full collections, triggered by allocation counts wherever
  they happen, otherwise rescan them all: ~14 ms each on the CPU with SmolLM2 and qwen3next loaded
  (78k objects), several times a bench case, landing in whatever verb allocated last (docs/caches.md).
"""

from __future__ import annotations

import gc
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

from mlx.utils import tree_flatten

MODEL_NAMES = ("smollm2", "gemma3", "qwen3next", "mamba2", "mamba", "falcon_h1", "deepseek_v32", "llama4")
DTYPES = ("float32", "bfloat16", "float16", "q4")


class DtypeUnsupported(RuntimeError):
    """The backend cannot run this model's operations in the dtype asked for (found at load)."""


def default_dtype() -> str:
    return os.environ.get("PREFIX_TRIE_DTYPE") or "float32"


@dataclass
class LoadedModel:
    name: str
    model: Any
    tokenizer: Any
    n_params: int
    weight_bytes: int
    context_length: int
    vocab_size: int
    layer_kinds: list = field(default_factory=list)
    dtype: str = "float32"

    def make_caches(self):
        from impl.caches import make_layer_caches

        return make_layer_caches(self.model)


_loaded: dict[str, LoadedModel] = {}
_lock = threading.Lock()
_tokenizer = None


def shared_tokenizer():
    """The SmolLM2 GGUF tokenizer (shared by every model), built from the GGUF metadata only."""
    global _tokenizer
    if _tokenizer is None:
        import mlx.core as mx

        from . import smollm2

        arrays, meta = mx.load(str(smollm2.gguf_path()), return_metadata=True)
        del arrays
        _tokenizer = smollm2.load_tokenizer(meta)
    return _tokenizer


def _checked(name: str, dtype: str | None) -> str:
    """The dtype a load of `name` uses (default_dtype() when None); KeyError naming what is unknown."""
    if name not in MODEL_NAMES:
        raise KeyError(f"unknown model {name!r}; known: {MODEL_NAMES}")
    dtype = dtype or default_dtype()
    if dtype not in DTYPES or (dtype == "q4" and name != "smollm2"):
        raise KeyError(f"dtype {dtype!r} for {name}; known: {DTYPES} (q4: smollm2's GGUF only)")
    return dtype


def _key(name: str, dtype: str) -> str:
    return name if dtype == "float32" else f"{name}@{dtype}"


def load(name: str, dtype: str | None = None) -> LoadedModel:
    dtype = _checked(name, dtype)
    key = _key(name, dtype)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        from impl.caches import layer_kinds, make_layer_caches
        from impl.memory import release_pool

        if name == "smollm2":
            from . import smollm2

            model, _meta = smollm2.load_weights(quantized=dtype == "q4")
            tok = shared_tokenizer()
            context = model.args.max_position_embeddings
            vocab = model.args.vocab_size
        else:
            from . import hybrid

            model, config = hybrid.load(name)
            tok = shared_tokenizer()
            context = int(config.get("max_position_embeddings", 8192))
            vocab = int(config["vocab_size"])
        if dtype in ("bfloat16", "float16"):
            import mlx.core as mx

            model.set_dtype(getattr(mx, dtype))
            mx.eval(model.parameters())
            _probe(model, name, dtype)
        params = tree_flatten(model.parameters())
        lm = LoadedModel(
            name=name,
            model=model,
            tokenizer=tok,
            n_params=sum(v.size for _, v in params),
            weight_bytes=sum(v.nbytes for _, v in params),
            context_length=context,
            vocab_size=vocab,
            layer_kinds=layer_kinds(make_layer_caches(model)),
            dtype=dtype,
        )
        release_pool()
        _loaded[key] = lm
        gc.freeze()      # the model's and tokenizer's objects live as long as the process (see below)
        return lm


def _probe(model, name: str, dtype: str) -> None:
    """One token through the model with fresh caches: a kernel the backend lacks in this dtype raises
    here, at load, as DtypeUnsupported, instead of in a request."""
    import mlx.core as mx

    from impl.caches import make_layer_caches

    try:
        mx.eval(model(mx.array([[0]]), cache=make_layer_caches(model)))
    except RuntimeError as e:
        device = "CPU" if mx.default_device().type == mx.cpu else "GPU"
        raise DtypeUnsupported(f"{name} cannot run in {dtype} on MLX's {device} backend: {e} "
                               "(load it in float32)") from None


def estimate_bytes(name: str, dtype: str | None = None) -> int:
    """Weight bytes a load of `name` in `dtype` (default: default_dtype(), as load) will hold, from its
    configuration alone: the model is built lazily (MLX does not evaluate the initial weights) and only
    its parameter sizes are read; "q4" counts SmolLM2's GGUF tensors as shipped. The scheduler's fit
    check (F1) uses this for a first load."""
    dtype = _checked(name, dtype)
    loaded = _loaded.get(_key(name, dtype))
    if loaded is not None:
        return loaded.weight_bytes
    import mlx.core as mx
    from mlx_lm.models import llama

    if name == "smollm2":
        from . import smollm2

        w, meta = mx.load(str(smollm2.gguf_path()), return_metadata=True)
        if dtype == "q4":
            return sum(v.nbytes for v in w.values())
        model = llama.Model(smollm2.model_args(meta, "output.weight" in w))
        del w
    else:
        from mlx_lm.utils import _get_classes

        from .hybrid import CONFIGS

        model_class, args_class = _get_classes(config=dict(CONFIGS[name]))
        model = model_class(args_class.from_dict(dict(CONFIGS[name])))
    params = dict(tree_flatten(model.parameters()))
    if name == "gemma3":
        params.pop("lm_head.weight", None)     # tied to the embedding, as hybrid.generate saves it
    return sum(v.size for v in params.values()) * (4 if dtype == "float32" else 2)
