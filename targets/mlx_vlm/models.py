"""A small fixed-seed qwen2_vl model, saved in mlx-vlm's format and loaded through its own loader,
and the requests our key streams become for it.

Invariants:
- `CONFIG` is an mlx-vlm `qwen2_vl` config made small (hidden size 64, 2 layers, a 512-token vocabulary,
  a 1-layer vision tower); weights come from `mx.random.seed(SEED)`, float32, are written to
  `model.safetensors` with `config.json` and read back by `mlx_vlm.utils.load_model` (no hub files).
- The image processor is transformers' `Qwen2VLImageProcessor` built from arguments (patch 14, merge 2,
  temporal patch 2; min_pixels 28*28), the one mlx-vlm's Qwen2-VL processor wraps. No tokenizer is
  needed: prompts are built as token ids directly (the processor's output is input_ids plus
  pixel_values and image_grid_thw).
- Keys map to token ids: a token key k (1 <= k < 483) is id k + TOKEN_BASE, below the special ids; a media item of L >= 2 positions (a run of one fold value) is the processor's placeholder run:
  `<|vision_start|>` then L - 1 image tokens, for an image of 28 x 28(L - 1) pixels (grid 1 x 2 x 2(L-1):
  L - 1 tokens after the 2x2 merge). The image of a fold is the caller's (`images`), else random pixels
  made from the fold (`default_image`), so equal folds are equal images.
- mlx-vlm's qwen2_vl language model attends causally over image tokens (no bidirectional image mask);
  the vision tower sees a whole image in one forward inside `get_input_embeddings`.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from spec.media import FOLD_BIT

SEED = 20261206
VOCAB = 512
TOKEN_BASE = 16                      # token key k -> id k + TOKEN_BASE (ids below 16 unused)
VISION_START, IMAGE, VIDEO = 499, 500, 501
EOS = 511
CONFIG = dict(model_type="qwen2_vl", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=VOCAB,
              rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=4096,
              rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
              image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VISION_START,
              eos_token_id=[EOS],
              vision_config=dict(model_type="qwen2_vl", depth=1, embed_dim=32, hidden_size=64, num_heads=2,
                                 patch_size=14, spatial_patch_size=14, spatial_merge_size=2,
                                 temporal_patch_size=2, mlp_ratio=2.0, in_channels=3))
IMAGE_PROCESSOR = dict(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=28 * 28,
                       max_pixels=448 * 448)

_saved: dict = {}


def save(directory: Path | None = None) -> Path:
    """Write the fixed-seed model (config.json, model.safetensors) once per process; return its folder."""
    if directory is None and "dir" in _saved:
        return _saved["dir"]
    import mlx.core as mx
    from mlx.utils import tree_flatten
    import mlx_vlm.models.qwen2_vl as arch
    from mlx_vlm.utils import update_module_configs

    d = Path(directory or tempfile.mkdtemp(prefix="mlxvlm-qwen2vl-"))
    cfg = json.loads(json.dumps(CONFIG))
    cfg.setdefault("text_config", {})
    model_cfg = update_module_configs(arch.ModelConfig.from_dict(cfg), arch, cfg, ["text", "vision"])
    mx.random.seed(SEED)
    model = arch.Model(model_cfg)
    model.set_dtype(mx.float32)
    mx.save_safetensors(str(d / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (d / "config.json").write_text(json.dumps(CONFIG))
    if directory is None:
        _saved["dir"] = d
    return d


def load(directory: Path | None = None):
    """A fresh model instance through mlx-vlm's own loader (its language model keeps per-request
    rope state, so a cold replay takes a fresh instance)."""
    from mlx_vlm.utils import load_model
    return load_model(Path(directory or save()))


class Processor:
    """What BatchGenerator reads of a processor: `.tokenizer.stopping_criteria` (mlx-vlm's own class),
    and the image processor."""

    def __init__(self):
        from mlx_vlm.utils import StoppingCriteria
        from transformers import Qwen2VLImageProcessor
        self.tokenizer = type("Tokenizer", (), {})()
        self.tokenizer.stopping_criteria = StoppingCriteria([EOS], None)
        self.image_processor = Qwen2VLImageProcessor(**IMAGE_PROCESSOR)


def items_of(keys) -> list:
    """The media items of a key stream: maximal runs of one fold value, as (pos, end, fold)."""
    out, i = [], 0
    while i < len(keys):
        if keys[i] & FOLD_BIT:
            j = i
            while j < len(keys) and keys[j] == keys[i]:
                j += 1
            out.append((i, j, keys[i]))
            i = j
        else:
            i += 1
    return out


IMAGE_KINDS = ("random", "solid")


def default_image(fold: int, length: int, kind: str = "random", index: int = 0) -> np.ndarray:
    """The image of a fold with `length` positions (n = length - 1 placeholder tokens).
    "random": pixels seeded by the fold (distinct folds, distinct pixels).
    "solid": blank pages, the `index`-th distinct fold of this length in a program: grey level
    100 + index // 2, landscape (28 x 28n) for even index, portrait (28n x 28) for odd. Folds 0 and 1
    of a length are one grey, landscape and portrait: equal pixel_values bytes, equal placeholder
    counts, different image_grid_thw. Distinct folds get distinct (pixels, dims)."""
    n = length - 1
    if kind == "solid":
        value = 100 + (index // 2 if n > 1 else index)
        return solid(28 * n, 28, value) if index % 2 and n > 1 else solid(28, 28 * n, value)
    if kind != "random":
        raise ValueError(f"image kind {kind!r}: one of {IMAGE_KINDS}")
    rng = np.random.default_rng(fold & 0xFFFFFFFF)
    return rng.integers(0, 256, (28, 28 * n, 3), dtype=np.uint8)


class Image:
    """An image the run assigned to a fold (its length kept, to number the folds of a length)."""

    def __init__(self, pixels: np.ndarray, length: int):
        self.pixels, self.length = pixels, length


def solid(height: int, width: int, value: int = 200) -> np.ndarray:
    return np.full((height, width, 3), value, np.uint8)


def request(keys, processor: Processor, images: dict | None = None, kind: str = "random"):
    """(input ids, raw inputs) for a key stream, as the processor would give them."""
    import mlx.core as mx
    keys = [int(k) for k in keys]
    ids = []
    for k in keys:
        if not k & FOLD_BIT and not 1 <= k < VISION_START - TOKEN_BASE:
            raise ValueError(f"token key {k} is outside [1, {VISION_START - TOKEN_BASE})")
        ids.append(k + TOKEN_BASE if not k & FOLD_BIT else None)
    pics = []
    for pos, end, fold in items_of(keys):
        if end - pos < 2:
            raise ValueError(f"media item [{pos}, {end}) has {end - pos} position(s): qwen2_vl needs 2 or more "
                             "(vision start and at least one image token)")
        if images is not None and fold not in images:          # a fold keeps its image for the run
            index = sum(1 for f, im in images.items() if getattr(im, "length", None) == end - pos)
            images[fold] = Image(default_image(fold, end - pos, kind, index), end - pos)
        img = images[fold] if images is not None else default_image(fold, end - pos, kind)
        img = getattr(img, "pixels", img)
        pics.append(img)
        ids[pos:end] = [VISION_START] + [IMAGE] * (end - pos - 1)
    raw = {}
    if pics:
        out = processor.image_processor(images=pics, return_tensors="np")
        thw = out["image_grid_thw"]
        want = [end - pos - 1 for pos, end, _ in items_of(keys)]
        got = [int(np.prod(t)) // 4 for t in thw]
        if got != want:
            raise ValueError(f"images give {got} placeholder tokens, the key stream has {want}")
        raw = {"pixel_values": mx.array(out["pixel_values"]), "image_grid_thw": mx.array(thw)}
    raw["input_ids"] = mx.array([ids])
    raw["attention_mask"] = mx.ones((1, len(ids)), dtype=mx.int32)
    return ids, raw
