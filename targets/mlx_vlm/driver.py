"""ServerDriver: one request at a time through mlx-vlm's own BatchGenerator and APCManager, in the
order `mlx_vlm.server.generation` makes the calls, plus the record of what each stored block holds.

Per request (`ResponseGenerator.generate` then its GPU worker):
  1. the APC salt, computed by the server's own `ResponseGenerator.generate` (`server_salt`): today
     `semantic_extra_hash(tenant=None, image_hash=hash_image_payload(pixel_values),
     media={"audio": input_features, "video": pixel_values_videos}, model=language_model, processor=...)`;
  2. the batch generator's coordinator `.prepare_prefill(prompt tokens, prefill_step_size=...)` (the
     byte budget is enforced here, evicting idle blocks);
  3. `model.get_input_embeddings(input_ids, pixel_values, mask=..., image_grid_thw=...)`, its outputs
     and `_apc_semantic_hash` as the prompt kwargs (pixel_values dropped), as `_gpu_embed` does;
  4. `BatchGenerator(model.language_model, ..., apc_manager=manager)` (one for the driver's life, as the
     worker keeps one while requests come) `.insert([ids], ...)`, then `.next()` until it finishes.
The lookup BatchGenerator makes (`_apc_pick_for`) is observed, not changed: the driver wraps the bound
method to record the prefix length it returns.

The manager is `apc.from_env(overrides=...)`: the server's constructor, with its defaults but for a
block size of 4 (small programs then store blocks), no memory reserve (the reserve is sized from the
host's free RAM), and the disk tier (on by default) in a temporary folder, with
APC_DISK_MIN_FREE_RAM_GB=0 so a disk restore does not depend on the host's free memory.

Contents (`content`, `exact`): block hash, or checkpoint (token ids, salt) -> the keys its state was
computed from. One present (in memory or on disk) before a request keeps its record; one the request
made present holds the request's own keys there. The state a request resumes from is the record of the
checkpoint (checkpoint mode) or of the blocks (block mode) it restored. APC_EXACT_MIN_TOKENS is set to
the block size, so short programs store checkpoints (default 16).
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import types

from targets.mlx_vlm import models

BLOCK = 4


class _Salt(Exception):
    """Carries the queued request's salt out of `ResponseGenerator.generate`."""


class _Queue:
    def put(self, queued) -> None:
        queued.rqueue.put(_Salt(queued.apc_semantic_hash))


def server_module():
    """`mlx_vlm.server.generation`, imported without running `mlx_vlm/server/__init__.py` (which loads the
    HTTP app, mlx-audio and the hub client; generation.py itself needs none of them)."""
    if "mlx_vlm.server.generation" not in sys.modules and "mlx_vlm.server" not in sys.modules:
        import mlx_vlm
        pkg = types.ModuleType("mlx_vlm.server")
        pkg.__path__ = [os.path.join(os.path.dirname(mlx_vlm.__file__), "server")]
        sys.modules["mlx_vlm.server"] = pkg
    import mlx_vlm.server.generation as generation
    return generation


def server_salt(model, processor, raw: dict) -> int:
    """The APC salt mlx-vlm's server gives a request with these preprocessed inputs: its own
    `ResponseGenerator.generate` runs on a generator holding only what that method reads (a ready
    flag, the model, its config, processor and an APC mode), with `raw` as the preprocessing's output and a queue
    that hands back the queued request's `apc_semantic_hash` instead of serving it."""
    g = server_module()
    rg = object.__new__(g.ResponseGenerator)
    rg._ready, rg._load_error = threading.Event(), None
    rg._ready.set()
    rg.model, rg.processor, rg.config, rg.draft_model, rg.apc_mode = model, processor, model.config, None, "block"
    rg._preprocess_request = lambda *args, **kwargs: raw
    rg.requests = _Queue()
    try:
        rg.generate("", args=g.GenerationArguments(max_tokens=1))
    except _Salt as s:
        return int(s.args[0])
    raise RuntimeError("ResponseGenerator.generate queued no request")


class ServerDriver:
    def __init__(self, arch: str = "qwen2_vl", block_size: int = BLOCK, num_blocks: int = 256, disk: bool = True,
                 images=None, disk_path: str | None = None, image_kind: str = "random", media: str = "image"):
        os.environ["APC_DISK_MIN_FREE_RAM_GB"] = "0"
        os.environ["APC_EXACT_MIN_TOKENS"] = str(block_size)
        from mlx_vlm import apc
        from mlx_vlm.generate.ar import BatchGenerator
        self.apc, self.arch = apc, arch
        self.model = models.load(arch)
        self.processor = models.Processor(arch)
        self.images, self.image_kind, self.media = dict(images or {}), image_kind, media
        self.disk_path = disk_path or (tempfile.mkdtemp(prefix="mlxvlm-apc-") if disk else None)
        over = {"enabled": True, "block_size": block_size, "num_blocks": num_blocks, "memory_reserve_gb": 0,
                "disk_enabled": bool(self.disk_path), "disk_path": self.disk_path or ""}
        self.manager = apc.from_env(overrides=over)
        self.gen = BatchGenerator(self.model.language_model, self.processor, max_tokens=1,
                                  apc_manager=self.manager)
        self.block = block_size
        self.content: dict = {}            # block hash -> keys its K/V were computed from
        self.exact: dict = {}              # checkpoint (token ids, salt) -> keys its state was computed from
        self.links: dict = {}              # block hash -> parent hash
        self.picks: list = []              # prefix lengths the generator's lookups returned
        pick = self.gen._apc_pick_for

        def observed(sequence):
            p = pick(sequence)
            self.picks.append(0 if p is None else int(p["prefix_len"]))
            return p
        self.gen._apc_pick_for = observed
        self.uid = None

    # ------------------------------------------------------------ one request
    def salt(self, raw) -> int:
        return server_salt(self.model, self.processor, raw)

    def start(self, keys) -> int:
        """Insert the request and run the generator's first step (its APC lookup); the resume offset."""
        ids, raw = models.request(keys, self.processor, self.images, self.image_kind, self.media)
        self.keys, self.ids, self.extra = list(keys), ids, self.salt(raw)
        if self.gen.apc is not None:                    # the worker's admission step, before embedding
            self.gen.apc.prepare_prefill(len(ids), prefill_step_size=self.gen.prefill_step_size)
        self.present_before = {h for h in self.chain(ids, self.extra) if self.present(h)}
        self.exact_before = {e for e in self.exact if self.present_exact(e)}
        data = {k: v for k, v in raw.items() if k not in ("input_ids", "pixel_values", "attention_mask")}
        emb = self.model.get_input_embeddings(raw["input_ids"], raw.get("pixel_values"),
                                              mask=raw["attention_mask"], **data)
        kw = {**data, **{k: v for k, v in emb.to_dict().items() if v is not None},
              "_apc_semantic_hash": self.extra}
        seen = len(self.picks)
        (self.uid,) = self.gen.insert([ids], max_tokens=[1], prompt_kwargs=[kw])
        self.done = False
        self.advance()
        self.resume = self.picks[seen] if len(self.picks) > seen else 0
        return self.resume

    def advance(self, steps: int | None = None) -> None:
        """next() until the request finishes (or `steps` times)."""
        n = 0
        while not self.done and (steps is None or n < steps):
            _, gens = self.gen.next()
            n += 1
            self.done = any(r.uid == self.uid and r.finish_reason is not None for r in gens)
            if not gens and self.gen._prompt_batch is None and not self.gen._unprocessed_sequences \
                    and len(self.gen._generation_batch) == 0:
                self.done = True
        if self.done:
            self.settle()

    def cancel(self) -> None:
        if not self.done:
            self.gen.remove(self.uid)
            self.done = True
            self.settle()

    def settle(self) -> None:
        if self.manager.disk is not None:
            self.manager.disk.flush()
        parent = self.apc.SEED_PARENT_HASH
        for i, h in enumerate(self.chain(self.ids, self.extra)):
            if self.present(h) and h not in self.present_before:
                self.content[h] = tuple(self.keys[i * self.block:(i + 1) * self.block])
                self.links[h] = parent
            parent = h
        for n in sorted(set(self.checkpoint_lengths()) | {len(self.ids)}):      # and the full-prompt commit
            e = (tuple(self.ids[:n]), self.extra)
            if self.present_exact(e) and e not in self.exact_before:
                self.exact[e] = tuple(self.keys[:n])

    def checkpoint_lengths(self) -> list:
        c = self.gen.apc
        return [] if c is None else list(c.checkpoint_lengths(self.ids, self.gen._apc_media_token_ids()))

    # ------------------------------------------------------------ the cache's state
    def chain(self, ids, extra) -> list:
        out, parent = [], self.apc.SEED_PARENT_HASH
        for i in range(len(ids) // self.block):
            parent = self.apc._hash_tokens(parent, tuple(ids[i * self.block:(i + 1) * self.block]), extra)
            out.append(parent)
        return out

    def present(self, h) -> bool:
        return h in self.manager.hash_table or (self.manager.disk is not None and self.manager.disk.has(h))

    def present_exact(self, e) -> bool:
        tokens, extra = e
        if any(x.token_ids == tokens and x.extra_hash == extra for x in self.manager._exact_cache.values()):
            return True
        disk = self.manager.disk
        return disk is not None and self.apc._sequence_hash(tokens, extra, self.block) in disk._exact_index

    def restored(self) -> tuple:
        """What the open request's resumed state holds: the records of the checkpoint or the blocks it
        resumed from."""
        r = self.resume
        for (tokens, extra), content in self.exact.items():
            if extra == self.extra and len(tokens) >= r and list(tokens[:r]) == self.ids[:r] and r and \
                    (tokens, extra) in self.exact_before:
                return tuple(content[:r])
        hs = self.chain(self.ids, self.extra)[:self.resume // self.block]
        return tuple(k for h in hs for k in self.content.get(h, (None,) * self.block))

    def close(self) -> None:
        if self.manager.disk is not None:
            self.manager.disk.flush()
            self.manager.close()
