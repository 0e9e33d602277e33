"""mlx-vlm 0.7.10, automatic prefix cache: two different images with equal pixel_values bytes share cached state.

Standalone (mlx-vlm's public API, numpy, transformers' Qwen2VLImageProcessor; no hub files):
    python -m pytest test_c1_image_dims_not_in_key.py -q      (both tests fail on mlx-vlm 0.7.10)

A blank landscape page (u x 3u px) and a blank portrait page (3u x u px) of one grey, u = 2 x patch, are
different images: image_grid_thw (1, 2, 6) vs (1, 6, 2), so different vision and M-RoPE positions. Both
give 3 image tokens, and their pixel_values are byte-identical (every patch is the same).
The APC salt is `semantic_extra_hash(image_hash=hash_image_payload(pixel_values), ...)`, as
`server/generation.py`'s `generate` computes it (server/generation.py:1229): image_grid_thw is not in
it. The salt here is the server's own: `ResponseGenerator.generate` runs (on a generator holding the
model, processor and APC mode) and the queued request's `apc_semantic_hash` is read off its queue. So the portrait request is served the landscape request's cached state and answers with the
landscape page's: its first-token log-probabilities equal the landscape request's cold run, not its own.

- qwen3_5 (a gated-delta layer and a KV layer, APC's checkpoint mode; the Qwen3.5/3.6 family): the
  landscape request's checkpoint is restored from memory, the request right after it.
- qwen2_vl (KV only, APC's block mode, where a memory prefix holding an image is never restored): the
  landscape request's blocks are restored from the disk tier (on by default) after a restart.
The stored state each test needs is checked directly (the checkpoint in `_exact_cache`; the blocks on
disk with `DiskBlockStore.has` and none in memory). A fix that folds the grid (or any preprocessing
output the model reads) into the salt makes the portrait request run cold, and the tests pass.
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
from mlx_vlm.utils import StoppingCriteria, load_model, update_module_configs  # noqa: E402

VS, IMG = 499, 500
QWEN2_VL = dict(model_type="qwen2_vl", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=512,
              rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=4096,
              rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
              image_token_id=IMG, video_token_id=501, vision_start_token_id=VS, eos_token_id=[511],
              vision_config=dict(model_type="qwen2_vl", depth=1, embed_dim=32, hidden_size=64, num_heads=2,
                                 patch_size=14, spatial_patch_size=14, spatial_merge_size=2,
                                 temporal_patch_size=2, mlp_ratio=2.0, in_channels=3))
QWEN3_5 = dict(model_type="qwen3_5", image_token_id=IMG, video_token_id=501, vision_start_token_id=VS,
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
        from transformers import Qwen2VLImageProcessor
        self.tokenizer = type("Tokenizer", (), {})()
        self.tokenizer.stopping_criteria = StoppingCriteria([511], None)
        self.unit = 2 * patch
        self.image_processor = Qwen2VLImageProcessor(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                                     min_pixels=self.unit ** 2, max_pixels=(16 * self.unit) ** 2)


def prompt(processor, page):
    out = processor.image_processor(images=[page], return_tensors="np")
    n = int(np.prod(out["image_grid_thw"][0])) // 4
    ids = [VS] + [IMG] * n + TEXT
    return ids, {"input_ids": mx.array([ids]), "attention_mask": mx.ones((1, len(ids)), dtype=mx.int32),
                 "pixel_values": mx.array(out["pixel_values"]), "image_grid_thw": mx.array(out["image_grid_thw"])}


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
    """The salt the server's ResponseGenerator.generate queues for a request with these inputs: it runs
    on a generator holding the model, processor and APC mode, with `raw` as the preprocessing's output,
    and the queued request's apc_semantic_hash is read off the request queue."""
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
    """One request as the server's worker runs it; the first token's log-probabilities."""
    gen = BatchGenerator(model.language_model, processor, max_tokens=1, apc_manager=manager, top_logprobs_k=512)
    if gen.apc is not None:                                  # the worker's admission step
        gen.apc.prepare_prefill(raw["input_ids"].shape[1], prefill_step_size=gen.prefill_step_size)
    data = {"image_grid_thw": raw["image_grid_thw"]}
    emb = model.get_input_embeddings(raw["input_ids"], raw["pixel_values"], mask=raw["attention_mask"], **data)
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


def pages(config):
    """The model dir, processor, and the prompts and cold first-token log-probabilities of both pages."""
    d, processor = build_model_dir(config), Processor(config["vision_config"]["patch_size"])
    u = processor.unit
    ids_l, raw_l = prompt(processor, np.full((u, 3 * u, 3), 100, np.uint8))
    ids_p, raw_p = prompt(processor, np.full((3 * u, u, 3), 100, np.uint8))
    assert ids_l == ids_p and raw_l["image_grid_thw"].tolist() != raw_p["image_grid_thw"].tolist()
    cold_l = serve(load_model(d), processor, None, raw_l)                 # references: no cache, fresh models
    cold_p = serve(load_model(d), processor, None, raw_p)
    assert np.max(np.abs(cold_p - cold_l)) > 1e-3                          # the model tells the pages apart
    return d, processor, ids_l, raw_l, raw_p, cold_l, cold_p


def check(model, processor, raw_l, raw_p, warm_p, cold_l, cold_p):
    same_salt = salt(model, processor, raw_p) == salt(model, processor, raw_l)
    assert np.max(np.abs(warm_p - cold_p)) < 1e-4, (
        f"the portrait request was served the landscape page's state: max |warm - cold| = "
        f"{np.max(np.abs(warm_p - cold_p)):.4f}, max |warm - cold landscape| = {np.max(np.abs(warm_p - cold_l)):.4f}; "
        f"equal APC salts: {same_salt} (image_grid_thw is not in the salt)")


def test_qwen3_5_portrait_page_is_not_served_the_landscape_checkpoint(monkeypatch):
    monkeypatch.setenv("APC_EXACT_MIN_TOKENS", "4")          # the default 16 needs a longer prompt; same path
    d, processor, ids_l, raw_l, raw_p, cold_l, cold_p = pages(QWEN3_5)
    model, m = load_model(d), manager(tempfile.mkdtemp())
    serve(model, processor, m, raw_l)
    held = [e.token_ids for e in m._exact_cache.values()]               # the landscape request's checkpoint,
    assert held and all(list(t) == ids_l[:len(t)] and len(t) > 4 for t in held)      # past the image
    warm_p = serve(model, processor, m, raw_p)
    m.close()
    check(model, processor, raw_l, raw_p, warm_p, cold_l, cold_p)


def test_qwen2_vl_portrait_page_is_not_served_the_landscape_blocks(monkeypatch):
    monkeypatch.setenv("APC_DISK_MIN_FREE_RAM_GB", "0")      # disk restores regardless of the host's free RAM
    d, processor, ids_l, raw_l, raw_p, cold_l, cold_p = pages(QWEN2_VL)
    model, disk = load_model(d), tempfile.mkdtemp()
    first = manager(disk)
    serve(model, processor, first, raw_l)                               # stores the landscape request's blocks
    first.close()                                                       # flushes the disk tier; a restart
    second = manager(disk)
    parent, blocks = apc.SEED_PARENT_HASH, []
    for i in range(len(ids_l) // 4):
        parent = apc._hash_tokens(parent, tuple(ids_l[4 * i:4 * i + 4]), salt(model, processor, raw_l))
        blocks.append(parent)
    assert all(second.disk.has(h) for h in blocks) and not second.hash_table
    warm_p = serve(model, processor, second, raw_p)
    second.close()
    check(model, processor, raw_l, raw_p, warm_p, cold_l, cold_p)
