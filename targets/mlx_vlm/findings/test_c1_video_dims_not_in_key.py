"""mlx-vlm 0.7.10, automatic prefix cache: two different videos with equal pixel_values_videos bytes share cached state.

Standalone (mlx-vlm's public API and its own numpy Qwen3VLVideoProcessor, numpy; no hub files):
    python -m pytest test_c1_video_dims_not_in_key.py -q      (both tests fail on mlx-vlm 0.7.10)

Three slides A, B, C of u x u pixels (u = 2 x patch, random content) make different clips whose
pixel_values_videos are byte-identical, because the processor lays out patches group by group
(temporal group, then rows and columns of 2 x 2 merged patches):
- a slideshow: 6 frames of u x u, each slide held for 2 frames: video_grid_thw (3, 2, 2);
- a wide strip: 2 frames of u x 3u, the slides side by side: (1, 2, 6);
- a tall strip: 2 frames of 3u x u, the slides stacked: (1, 6, 2).
Each is 3 video tokens after the 2 x 2 merge. The server's APC salt (`ResponseGenerator.generate`,
server/generation.py 1229-1241) hashes `pixel_values_videos` under media "video" but not
`video_grid_thw`, so the second clip is served the first clip's cached state: its first-token
log-probabilities equal the first clip's cold run, not its own. The salt here is the one the server
computes: `ResponseGenerator.generate` runs (on a generator holding the model, processor and APC
mode) and the queued request's `apc_semantic_hash` is read off the request queue.

- qwen2_vl (KV only, block mode): slideshow, then the wide strip after a restart (a memory prefix
  holding media is never restored; the disk tier, on by default, is).
- qwen3_5 (gated delta + KV, checkpoint mode; one vision block per temporal group, so the slideshow
  is a different token layout there): the wide strip, then the tall strip, the very next request.
The stored state each test needs is checked directly (`DiskBlockStore.has` and no memory block; the
checkpoint in `_exact_cache`). A fix that folds video_grid_thw into the salt makes both pass.
"""
import json
import os
import sys
import tempfile
import threading
import types
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

pytest.importorskip("mlx_vlm")
import mlx_vlm  # noqa: E402
from mlx_vlm import apc  # noqa: E402
from mlx_vlm.generate.ar import BatchGenerator  # noqa: E402
from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLVideoProcessor  # noqa: E402
from mlx_vlm.utils import StoppingCriteria, load_model, update_module_configs  # noqa: E402

VS, VIDEO = 499, 501
VISION = dict(model_type="qwen2_vl", depth=1, embed_dim=32, hidden_size=64, num_heads=2, patch_size=14,
              spatial_patch_size=14, spatial_merge_size=2, temporal_patch_size=2, mlp_ratio=2.0, in_channels=3)
QWEN2_VL = dict(model_type="qwen2_vl", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=512,
                rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=4096,
                rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, image_token_id=500,
                video_token_id=VIDEO, vision_start_token_id=VS, eos_token_id=[511], vision_config=VISION)
QWEN3_5 = dict(model_type="qwen3_5", image_token_id=500, video_token_id=VIDEO, vision_start_token_id=VS,
               vision_end_token_id=498, vocab_size=512, eos_token_id=[511], tie_word_embeddings=True,
               text_config=dict(model_type="qwen3_5_text", hidden_size=64, intermediate_size=128,
                                linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=16,
                                linear_value_head_dim=16, linear_conv_kernel_dim=4, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                                vocab_size=512, max_position_embeddings=4096, full_attention_interval=2,
                                tie_word_embeddings=True,
                                rope_parameters={"type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000,
                                                 "partial_rotary_factor": 1.0}),
               vision_config=dict(model_type="qwen3_5", depth=1, hidden_size=32, intermediate_size=64,
                                  out_hidden_size=64, num_heads=2, patch_size=16, spatial_merge_size=2,
                                  temporal_patch_size=2, num_position_embeddings=64, fullatt_block_indexes=[0],
                                  in_channels=3))
TEXT = [17, 18, 19, 20, 17, 18, 19, 20, 17]


def build_model_dir(config) -> Path:
    import importlib
    arch = importlib.import_module("mlx_vlm.models." + config["model_type"])
    d = Path(tempfile.mkdtemp())
    cfg = json.loads(json.dumps(config))
    cfg.setdefault("text_config", {})
    mx.random.seed(20261206)
    model = arch.Model(update_module_configs(arch.ModelConfig.from_dict(cfg), arch, cfg, ["text", "vision"]))
    model.set_dtype(mx.float32)
    mx.save_safetensors(str(d / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (d / "config.json").write_text(json.dumps(config))
    return d


class Processor:
    def __init__(self, patch):
        self.tokenizer = type("Tokenizer", (), {})()
        self.tokenizer.stopping_criteria = StoppingCriteria([511], None)
        self.unit = u = 2 * patch
        self.video_processor = Qwen3VLVideoProcessor(patch_size=patch, temporal_patch_size=2, merge_size=2,
                                                     min_pixels=u * u, max_pixels=(16 * u) ** 2)


def clips(u):
    """Three random u x u slides as a slideshow (6 frames), a wide strip and a tall strip (2 frames each)."""
    slides = np.random.default_rng(7).integers(0, 256, (3, u, u, 3), dtype=np.uint8)
    return {"slideshow": np.repeat(slides, 2, axis=0),
            "wide": np.stack([np.concatenate(list(slides), axis=1)] * 2),
            "tall": np.stack([np.concatenate(list(slides), axis=0)] * 2)}


def prompt(processor, frames):
    out = processor.video_processor(videos=[frames])
    n = int(np.prod(out["video_grid_thw"][0])) // 4
    ids = [VS] + [VIDEO] * n + TEXT
    return ids, {"input_ids": mx.array([ids]), "attention_mask": mx.ones((1, len(ids)), dtype=mx.int32),
                 "pixel_values_videos": mx.array(out["pixel_values_videos"]),
                 "video_grid_thw": mx.array(out["video_grid_thw"])}


class Salt(Exception):
    pass


class TakeSalt:
    def put(self, queued):
        queued.rqueue.put(Salt(queued.apc_semantic_hash))


def server_generation():
    """mlx_vlm.server.generation without mlx_vlm/server/__init__.py (the HTTP app, mlx-audio)."""
    if "mlx_vlm.server" not in sys.modules:
        pkg = types.ModuleType("mlx_vlm.server")
        pkg.__path__ = [os.path.join(os.path.dirname(mlx_vlm.__file__), "server")]
        sys.modules["mlx_vlm.server"] = pkg
    import mlx_vlm.server.generation as generation
    return generation


def salt(model, processor, raw):
    """The salt the server's ResponseGenerator.generate queues for a request with these inputs."""
    g = server_generation()
    rg = object.__new__(g.ResponseGenerator)
    rg._ready, rg._load_error = threading.Event(), None
    rg._ready.set()
    rg.model, rg.processor, rg.config, rg.draft_model, rg.apc_mode = model, processor, model.config, None, "block"
    rg._preprocess_request = lambda *a, **k: raw
    rg.requests = TakeSalt()
    with pytest.raises(Salt) as taken:
        rg.generate("", args=g.GenerationArguments(max_tokens=1))
    return int(taken.value.args[0])


def serve(model, processor, manager, raw):
    """One request as the server's worker runs it (_gpu_embed, then the batch generator); the first
    token's log-probabilities."""
    gen = BatchGenerator(model.language_model, processor, max_tokens=1, apc_manager=manager, top_logprobs_k=512)
    if gen.apc is not None:                                  # the worker's admission step
        gen.apc.prepare_prefill(raw["input_ids"].shape[1], prefill_step_size=gen.prefill_step_size)
    data = {k: v for k, v in raw.items() if k not in ("input_ids", "pixel_values", "attention_mask")}
    emb = model.get_input_embeddings(raw["input_ids"], None, mask=raw["attention_mask"], **data)
    kw = {**data, **{k: v for k, v in emb.to_dict().items() if v is not None}}
    if manager is not None:
        kw["_apc_semantic_hash"] = salt(model, processor, raw)
    (uid,) = gen.insert([raw["input_ids"][0].tolist()], max_tokens=[1], prompt_kwargs=[kw])
    while True:
        for r in gen.next()[1]:
            if r.uid == uid:
                return np.array(sorted(r.top_logprobs))[:, 1]


def manager(disk: str):
    return apc.from_env(overrides={"enabled": True, "block_size": 4, "num_blocks": 64, "memory_reserve_gb": 0,
                                   "disk_enabled": True, "disk_path": disk})


def pair(config, first, second):
    """The model dir, processor, both clips' prompts and cold first-token log-probabilities."""
    d, processor = build_model_dir(config), Processor(config["vision_config"]["patch_size"])
    c = clips(processor.unit)
    ids_a, raw_a = prompt(processor, c[first])
    ids_b, raw_b = prompt(processor, c[second])
    assert ids_a == ids_b and raw_a["video_grid_thw"].tolist() != raw_b["video_grid_thw"].tolist()
    assert np.array_equal(np.asarray(raw_a["pixel_values_videos"]), np.asarray(raw_b["pixel_values_videos"]))
    cold_a = serve(load_model(d), processor, None, raw_a)                 # references: no cache, fresh models
    cold_b = serve(load_model(d), processor, None, raw_b)
    assert np.max(np.abs(cold_b - cold_a)) > 1e-3                          # the model tells the clips apart
    return d, processor, ids_a, raw_a, raw_b, cold_a, cold_b


def check(model, processor, raw_a, raw_b, warm_b, cold_a, cold_b):
    same_salt = salt(model, processor, raw_b) == salt(model, processor, raw_a)
    assert np.max(np.abs(warm_b - cold_b)) < 1e-4, (
        f"the second clip was served the first clip's state: max |warm - cold| = "
        f"{np.max(np.abs(warm_b - cold_b)):.4f}, max |warm - cold first clip| = {np.max(np.abs(warm_b - cold_a)):.4f}; "
        f"equal APC salts: {same_salt} (video_grid_thw is not in the salt)")


def test_qwen2_vl_wide_strip_is_not_served_the_slideshow_blocks(monkeypatch):
    monkeypatch.setenv("APC_DISK_MIN_FREE_RAM_GB", "0")      # disk restores regardless of the host's free RAM
    d, processor, ids_a, raw_a, raw_b, cold_a, cold_b = pair(QWEN2_VL, "slideshow", "wide")
    model, disk = load_model(d), tempfile.mkdtemp()
    first = manager(disk)
    serve(model, processor, first, raw_a)                               # stores the slideshow's blocks
    first.close()                                                       # flushes the disk tier; a restart
    second = manager(disk)
    parent, blocks = apc.SEED_PARENT_HASH, []
    for i in range(len(ids_a) // 4):
        parent = apc._hash_tokens(parent, tuple(ids_a[4 * i:4 * i + 4]), salt(model, processor, raw_a))
        blocks.append(parent)
    assert all(second.disk.has(h) for h in blocks) and not second.hash_table
    warm_b = serve(model, processor, second, raw_b)
    second.close()
    check(model, processor, raw_a, raw_b, warm_b, cold_a, cold_b)


def test_qwen3_5_tall_strip_is_not_served_the_wide_strip_checkpoint(monkeypatch):
    monkeypatch.setenv("APC_EXACT_MIN_TOKENS", "4")          # the default 16 needs a longer prompt; same path
    d, processor, ids_a, raw_a, raw_b, cold_a, cold_b = pair(QWEN3_5, "wide", "tall")
    model, m = load_model(d), manager(tempfile.mkdtemp())
    serve(model, processor, m, raw_a)
    held = [e.token_ids for e in m._exact_cache.values()]               # the wide strip's checkpoint,
    assert held and all(list(t) == ids_a[:len(t)] and len(t) > 4 for t in held)      # past the video
    warm_b = serve(model, processor, m, raw_b)
    m.close()
    check(model, processor, raw_a, raw_b, warm_b, cold_a, cold_b)
