"""mlx-vlm 0.7.10, automatic prefix cache: two different images with equal pixel_values bytes share cached K/V.

Standalone (mlx-vlm's public API, numpy, transformers' Qwen2VLImageProcessor; no hub files):
    python -m pytest test_c1_image_dims_not_in_key.py -q      (fails on mlx-vlm 0.7.10)

A blank landscape page (28 x 84 px) and a blank portrait page (84 x 28 px) of one grey are different
images: image_grid_thw (1, 2, 6) vs (1, 6, 2), so different vision positions and M-RoPE positions. Both
give 3 image tokens, and their pixel_values are byte-identical (every 14 x 14 patch is the same).
The APC salt is `semantic_extra_hash(image_hash=hash_image_payload(pixel_values), ...)`, as
`server/generation.py`'s `generate` computes it: image_grid_thw is not in it. So a request with the
portrait page restores the blocks the landscape request stored (here from the disk tier, on by
default, after the memory copy was evicted: a restart, or LRU), and answers with the landscape page's
K/V: its first-token log-probabilities equal the landscape request's, not a cold run's.

The state the bug needs is built through public calls and checked directly: the disk tier holds the
landscape request's blocks (`DiskBlockStore.has`), memory holds none, and the salts of the two
requests are equal. A fix that puts the grid (or any preprocessing output the model reads) into the
salt makes the salts differ and the portrait request run cold.
"""
import json
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

pytest.importorskip("mlx_vlm")
from mlx_vlm import apc  # noqa: E402
from mlx_vlm.generate.ar import BatchGenerator  # noqa: E402
from mlx_vlm.utils import StoppingCriteria, load_model, update_module_configs  # noqa: E402

VS, IMG = 499, 500
CONFIG = dict(model_type="qwen2_vl", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=512,
              rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=4096,
              rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
              image_token_id=IMG, video_token_id=501, vision_start_token_id=VS, eos_token_id=[511],
              vision_config=dict(model_type="qwen2_vl", depth=1, embed_dim=32, hidden_size=64, num_heads=2,
                                 patch_size=14, spatial_patch_size=14, spatial_merge_size=2,
                                 temporal_patch_size=2, mlp_ratio=2.0, in_channels=3))
TEXT = [17, 18, 19, 20, 17, 18, 19, 20, 17]


def build_model_dir() -> Path:
    import mlx_vlm.models.qwen2_vl as arch
    d = Path(tempfile.mkdtemp())
    cfg = json.loads(json.dumps(CONFIG))
    cfg.setdefault("text_config", {})
    mx.random.seed(20261206)
    model = arch.Model(update_module_configs(arch.ModelConfig.from_dict(cfg), arch, cfg, ["text", "vision"]))
    model.set_dtype(mx.float32)
    mx.save_safetensors(str(d / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (d / "config.json").write_text(json.dumps(CONFIG))
    return d


class Processor:
    def __init__(self):
        from transformers import Qwen2VLImageProcessor
        self.tokenizer = type("Tokenizer", (), {})()
        self.tokenizer.stopping_criteria = StoppingCriteria([511], None)
        self.image_processor = Qwen2VLImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2,
                                                     min_pixels=28 * 28, max_pixels=448 * 448)


def prompt(processor, page):
    out = processor.image_processor(images=[page], return_tensors="np")
    n = int(np.prod(out["image_grid_thw"][0])) // 4
    ids = [VS] + [IMG] * n + TEXT
    return ids, {"input_ids": mx.array([ids]), "attention_mask": mx.ones((1, len(ids)), dtype=mx.int32),
                 "pixel_values": mx.array(out["pixel_values"]), "image_grid_thw": mx.array(out["image_grid_thw"])}


def salt(model, processor, raw):
    """The salt server/generation.py's generate() computes for a request."""
    return apc.semantic_extra_hash(tenant=None, image_hash=apc.hash_image_payload(pixel_values=raw["pixel_values"]),
                                   media={"audio": None, "video": None}, model=model.language_model,
                                   processor=processor)


def serve(model, processor, manager, raw):
    """One request as the server's worker runs it; the first token's log-probabilities."""
    gen = BatchGenerator(model.language_model, processor, max_tokens=1, apc_manager=manager, top_logprobs_k=512)
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


def test_portrait_page_is_not_served_the_landscape_pages_kv(monkeypatch):
    monkeypatch.setenv("APC_DISK_MIN_FREE_RAM_GB", "0")      # disk restores regardless of the host's free RAM
    d, processor, disk = build_model_dir(), Processor(), tempfile.mkdtemp()
    landscape = np.full((28, 84, 3), 100, np.uint8)
    portrait = np.full((84, 28, 3), 100, np.uint8)
    ids_l, raw_l = prompt(processor, landscape)
    ids_p, raw_p = prompt(processor, portrait)
    assert ids_l == ids_p and raw_l["image_grid_thw"].tolist() != raw_p["image_grid_thw"].tolist()

    cold_p = serve(load_model(d), processor, None, raw_p)             # references: no cache, fresh models
    cold_l = serve(load_model(d), processor, None, raw_l)
    assert np.max(np.abs(cold_p - cold_l)) > 1e-3                       # the model tells the pages apart

    model = load_model(d)
    first = manager(disk)
    serve(model, processor, first, raw_l)                               # stores the landscape request's blocks
    first.close()                                                       # flushes the disk tier; a restart
    second = manager(disk)
    landscape_blocks = []
    parent = apc.SEED_PARENT_HASH
    for i in range(len(ids_l) // 4):
        parent = apc._hash_tokens(parent, tuple(ids_l[4 * i:4 * i + 4]), salt(model, processor, raw_l))
        landscape_blocks.append(parent)
    assert all(second.disk.has(h) for h in landscape_blocks) and not second.hash_table

    warm_p = serve(model, processor, second, raw_p)
    second.close()
    same_salt = salt(model, processor, raw_p) == salt(model, processor, raw_l)
    assert np.max(np.abs(warm_p - cold_p)) < 1e-4, (
        f"the portrait request was served the landscape page's K/V: max |warm - cold| = "
        f"{np.max(np.abs(warm_p - cold_p)):.4f}, max |warm - cold landscape| = {np.max(np.abs(warm_p - cold_l)):.4f}; "
        f"equal APC salts: {same_salt} (image_grid_thw is not in the salt)")
