"""A small fixed-seed qwen2_vl model, saved in mlx-vlm's format and loaded through its own loader,
and the requests our key streams become for it.

Invariants:
- `ARCHS`: mlx-vlm's `qwen2_vl` (two KV layers: APC's block mode) and `qwen3_5` (a gated-delta layer,
  ArraysCache, and a KV layer: APC's checkpoint mode), each made small (hidden size 64, 2 layers, a
  512-token vocabulary, a 1-layer vision tower); weights come from `mx.random.seed(SEED)`, float32, are written to
  `model.safetensors` with `config.json` and read back by `mlx_vlm.utils.load_model` (no hub files).
- The image processor is transformers' `Qwen2VLImageProcessor` built from arguments (the model's patch,
  14 or 16, merge 2, temporal patch 2), the one the Qwen-VL processors wrap. No tokenizer is
  needed: prompts are built as token ids directly (the processor's output is input_ids plus
  pixel_values and image_grid_thw).
- Keys map to token ids: a token key k (1 <= k < 483) is id k + TOKEN_BASE, below the special ids; a media item of L >= 2 positions (a run of one fold value) is the processor's placeholder run:
  `<|vision_start|>` then L - 1 image tokens, for an image of u x u(L - 1) pixels, u = 2 x patch (grid
  1 x 2 x 2(L-1): L - 1 tokens after the 2x2 merge). The image of a fold is the caller's (`images`), else random pixels
  made from the fold (`default_image`), so equal folds are equal images.
- Videos (`media="video"`: every item of the run is a video; one request never mixes images and
  videos, which both models' `get_input_embeddings` take one at a time): a video item of L positions
  is a clip of grid (t, h, w) patches with t x h x w / 4 = its video tokens, through mlx-vlm's own
  numpy `Qwen3VLVideoProcessor` (the one its Qwen-VL processors use): `VIDEO_SHAPES`. qwen2_vl: one
  `<|vision_start|>` then L - 1 video tokens, as wide (2 frames, u x u(L-1)), long (2(L-1) frames of
  u x u) or tall (2 frames, u(L-1) x u). qwen3_5 (one vision block per temporal group, as its
  get_rope_index expects): wide or tall with t = 1, and for L = 4 "groups", 4 frames of u x u, ids
  [vs, video, vs, video]. Random kind: the fold picks the shape, pixels seeded by it; solid kind:
  the index-th video fold of a length takes shape index % len(shapes) in grey 100 + index // len(shapes)
  (so the first folds of a length are one grey in different shapes: equal pixel_values_videos).
- `gemma3` (a sliding-window layer, RotatingKVCache of WINDOW tokens, and a global KV layer: a windowed
  layout, which APC stores as checkpoints) is driven with text-only programs (`media="none"`): its
  image processor gives every image a fixed `mm_tokens_per_image`, which the programs' item lengths
  (2-4 positions) do not fit.
- Both language models attend causally over image tokens (no bidirectional image mask);
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
WINDOW = 4                           # gemma3's sliding window here (tokens)
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
QWEN35 = dict(model_type="qwen3_5", image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VISION_START,
              vision_end_token_id=498, vocab_size=VOCAB, eos_token_id=[EOS], tie_word_embeddings=True,
              text_config=dict(model_type="qwen3_5_text", hidden_size=64, intermediate_size=128,
                               linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=16,
                               linear_value_head_dim=16, linear_conv_kernel_dim=4, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                               vocab_size=VOCAB, max_position_embeddings=4096, full_attention_interval=2,
                               tie_word_embeddings=True,
                               rope_parameters={"type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000,
                                                "partial_rotary_factor": 1.0}),
              vision_config=dict(model_type="qwen3_5", depth=1, hidden_size=32, intermediate_size=64,
                                 out_hidden_size=64, num_heads=2, patch_size=16, spatial_merge_size=2,
                                 temporal_patch_size=2, num_position_embeddings=64, fullatt_block_indexes=[0],
                                 in_channels=3))
GEMMA3 = dict(model_type="gemma3", vocab_size=VOCAB, image_token_index=IMAGE, pad_token_id=0, hidden_size=64,
              eos_token_id=[EOS],
              text_config=dict(model_type="gemma3_text", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=VOCAB,
                               query_pre_attn_scalar=16, sliding_window=WINDOW, sliding_window_pattern=2,
                               mm_tokens_per_image=1, rms_norm_eps=1e-6, max_position_embeddings=4096),
              vision_config=dict(model_type="siglip_vision_model", num_hidden_layers=1, hidden_size=32,
                                 intermediate_size=64, num_attention_heads=2, patch_size=14, image_size=28))
ARCHS = {"qwen2_vl": CONFIG, "qwen3_5": QWEN35, "gemma3": GEMMA3}
# layers: KV, KV | gated delta (ArraysCache), KV | sliding window (RotatingKVCache, WINDOW), KV


def patch(arch: str) -> int:
    return ARCHS[arch]["vision_config"]["patch_size"]


def unit(arch: str) -> int:
    """Pixels per merged image token along each side (patch x merge 2)."""
    return 2 * patch(arch)


def image_processor_args(arch: str) -> dict:
    u = unit(arch)
    return dict(patch_size=patch(arch), merge_size=2, temporal_patch_size=2, min_pixels=u * u,
                max_pixels=16 * u * 16 * u)

_saved: dict = {}


def save(arch: str = "qwen2_vl", directory: Path | None = None) -> Path:
    """Write the fixed-seed model (config.json, model.safetensors) once per process; return its folder."""
    if arch not in ARCHS:
        raise ValueError(f"model {arch!r}: one of {sorted(ARCHS)}")
    if directory is None and arch in _saved:
        return _saved[arch]
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import update_module_configs

    mod = importlib.import_module("mlx_vlm.models." + arch)
    d = Path(directory or tempfile.mkdtemp(prefix=f"mlxvlm-{arch}-"))
    cfg = json.loads(json.dumps(ARCHS[arch]))
    cfg.setdefault("text_config", {})
    model_cfg = update_module_configs(mod.ModelConfig.from_dict(cfg), mod, cfg, ["text", "vision"])
    mx.random.seed(SEED)
    model = mod.Model(model_cfg)
    model.set_dtype(mx.float32)
    mx.save_safetensors(str(d / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (d / "config.json").write_text(json.dumps(ARCHS[arch]))
    if directory is None:
        _saved[arch] = d
    return d


def load(arch: str = "qwen2_vl"):
    """A fresh model instance through mlx-vlm's own loader (a language model may keep per-request
    rope state, so a cold replay takes a fresh instance)."""
    from mlx_vlm.utils import load_model
    return load_model(save(arch))


class Processor:
    """What BatchGenerator reads of a processor: `.tokenizer.stopping_criteria` (mlx-vlm's own class),
    and the image and video processors."""

    def __init__(self, arch: str = "qwen2_vl"):
        from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLVideoProcessor
        from mlx_vlm.utils import StoppingCriteria
        from transformers import Qwen2VLImageProcessor
        self.tokenizer = type("Tokenizer", (), {})()
        self.tokenizer.stopping_criteria = StoppingCriteria([EOS], None)
        self.image_processor = Qwen2VLImageProcessor(**image_processor_args(arch))
        self.video_processor = Qwen3VLVideoProcessor(**image_processor_args(arch))
        self.unit, self.arch = unit(arch), arch


MEDIA = ("image", "video", "none")            # none: text-only programs (a media item is an error)
VIDEO_SHAPES = {"qwen2_vl": ("wide", "long", "tall"), "qwen3_5": ("wide", "tall", "groups")}


def video_shapes(arch: str, length: int) -> tuple:
    """The shapes a video item of `length` positions can take on `arch` (module docstring)."""
    return tuple(s for s in VIDEO_SHAPES[arch] if s != "groups" or length == 4)


def video_layout(arch: str, length: int, shape: str, u: int) -> tuple:
    """(ids of the item, (frames, height, width) of the clip) for a video item."""
    n = length - 1
    if shape == "groups":
        return [VISION_START, VIDEO] * 2, (4, u, u)
    frames, h, w = {"wide": (2, u, u * n), "long": (2 * n, u, u), "tall": (2, u * n, u)}[shape]
    return [VISION_START] + [VIDEO] * n, (frames, h, w)


def default_video(fold: int, length: int, arch: str, kind: str = "random", index: int = 0, u: int = 28) -> tuple:
    """(shape, frames (T, H, W, 3) uint8) of a video fold with `length` positions."""
    shapes = video_shapes(arch, length)
    if kind == "solid":
        shape = shapes[index % len(shapes)]
        _, size = video_layout(arch, length, shape, u)
        return shape, np.full(size + (3,), 100 + index // len(shapes), np.uint8)
    if kind != "random":
        raise ValueError(f"image kind {kind!r}: one of {IMAGE_KINDS}")
    shape = shapes[(fold >> 8) % len(shapes)]
    _, size = video_layout(arch, length, shape, u)
    return shape, np.random.default_rng(fold & 0xFFFFFFFF).integers(0, 256, size + (3,), dtype=np.uint8)


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


def default_image(fold: int, length: int, kind: str = "random", index: int = 0, u: int = 28) -> np.ndarray:
    """The image of a fold with `length` positions (n = length - 1 placeholder tokens).
    "random": pixels seeded by the fold (distinct folds, distinct pixels).
    "solid": blank pages, the `index`-th distinct fold of this length in a program: grey level
    100 + index // 2, landscape (u x un) for even index, portrait (un x u) for odd. Folds 0 and 1
    of a length are one grey, landscape and portrait: equal pixel_values bytes, equal placeholder
    counts, different image_grid_thw. Distinct folds get distinct (pixels, dims)."""
    n = length - 1
    if kind == "solid":
        value = 100 + (index // 2 if n > 1 else index)
        return solid(u * n, u, value) if index % 2 and n > 1 else solid(u, u * n, value)
    if kind != "random":
        raise ValueError(f"image kind {kind!r}: one of {IMAGE_KINDS}")
    rng = np.random.default_rng(fold & 0xFFFFFFFF)
    return rng.integers(0, 256, (u, u * n, 3), dtype=np.uint8)


class Image:
    """An image (or, with `shape`, a video: frames) the run assigned to a fold (its length kept, to
    number the folds of a length)."""

    def __init__(self, pixels: np.ndarray, length: int, shape: str | None = None):
        self.pixels, self.length, self.shape = pixels, length, shape


def solid(height: int, width: int, value: int = 200) -> np.ndarray:
    return np.full((height, width, 3), value, np.uint8)


def request(keys, processor: Processor, images: dict | None = None, kind: str = "random", media: str = "image"):
    """(input ids, raw inputs) for a key stream, as the processor would give them; `media`: every item
    is an image or every item is a video."""
    import mlx.core as mx
    if media not in MEDIA:
        raise ValueError(f"media {media!r}: one of {MEDIA}")
    keys = [int(k) for k in keys]
    ids = []
    for k in keys:
        if not k & FOLD_BIT and not 1 <= k < VISION_START - TOKEN_BASE:
            raise ValueError(f"token key {k} is outside [1, {VISION_START - TOKEN_BASE})")
        ids.append(k + TOKEN_BASE if not k & FOLD_BIT else None)
    pics, want = [], []
    if media == "none" and items_of(keys):
        raise ValueError(f"media items in a text-only run (media='none', {processor.arch})")
    for pos, end, fold in items_of(keys):
        if end - pos < 2:
            raise ValueError(f"media item [{pos}, {end}) has {end - pos} position(s): qwen2_vl needs 2 or more "
                             "(vision start and at least one image token)")
        if images is not None and fold not in images:          # a fold keeps its image for the run
            index = sum(1 for f, im in images.items() if getattr(im, "length", None) == end - pos)
            if media == "video":
                shape, frames = default_video(fold, end - pos, processor.arch, kind, index, processor.unit)
                images[fold] = Image(frames, end - pos, shape)
            else:
                images[fold] = Image(default_image(fold, end - pos, kind, index, processor.unit), end - pos)
        if media == "video":
            if images is None:
                shape, frames = default_video(fold, end - pos, processor.arch, kind, u=processor.unit)
            img = images[fold] if images is not None else Image(frames, end - pos, shape)
            item_ids, _ = video_layout(processor.arch, end - pos, img.shape, processor.unit)
        else:
            img = images[fold] if images is not None else default_image(fold, end - pos, kind, u=processor.unit)
            item_ids = [VISION_START] + [IMAGE] * (end - pos - 1)
        pics.append(getattr(img, "pixels", img))
        want.append(sum(1 for t in item_ids if t != VISION_START))
        ids[pos:end] = item_ids
    raw = {}
    if pics and media == "video":
        out = processor.video_processor(videos=pics)
        thw = out["video_grid_thw"]
        raw = {"pixel_values_videos": mx.array(out["pixel_values_videos"]), "video_grid_thw": mx.array(thw)}
    elif pics:
        out = processor.image_processor(images=pics, return_tensors="np")
        thw = out["image_grid_thw"]
        raw = {"pixel_values": mx.array(out["pixel_values"]), "image_grid_thw": mx.array(thw)}
    if pics:
        got = [int(np.prod(t)) // 4 for t in thw]
        if got != want:
            raise ValueError(f"{media}s give {got} placeholder tokens, the key stream has {want}")
    raw["input_ids"] = mx.array([ids])
    raw["attention_mask"] = mx.ones((1, len(ids)), dtype=mx.int32)
    return ids, raw
