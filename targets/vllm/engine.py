"""vLLM's own prefix-cache objects, built as vLLM's unit tests build them (no model, no GPU).

`load(src=None)` imports vLLM -- the installed package, or a source checkout at `src` (put first on
sys.path, so older commits replay) -- with targets.vllm.stubs standing in for the serving-stack
packages the managers never call. It returns an `Engine`: the few calls the adapter makes, each a
thin wrapper over vLLM's public classes:

  manager(layout, num_blocks)       KVCacheManager over KVCacheConfig/KVCacheGroupSpec for the
                                    layout's groups (full attention, sliding window, Mamba "align")
  request(rid, tokens)              vllm.v1.request.Request with vLLM's own block hasher
  cached(manager)                   [(block hash, group id, block id)] from the BlockPool's hash map
  req_blocks(manager, rid)          per group, the request's block ids (0: the null block)
  hashed(manager)                   [(group id, block id)] of pool blocks whose metadata holds a hash

Invariants: vLLM is only called and read, never patched; keyword arguments a version does not take
are left out (inspect.signature), so the same code drives older releases; `version` names what ran.
"""
from __future__ import annotations

import inspect
import sys

from targets.vllm import stubs

STUB = ("xgrammar", "tvm_ffi", "fastapi", "partial_json_parser", "llguidance",      # 0.33, 0.34
        "gguf", "mistral_common", "diskcache", "blake3", "setproctitle", "jinja2")    # older releases
BLOCK = 2                   # tokens per block: small, so short programs span many blocks
WINDOW = 2 * BLOCK          # the sliding window, in tokens

# layout -> the groups after the full-attention one ("swa", "mamba"); "-spec" adds draft tokens and
# the lookahead to decode steps; "-eagle" builds the manager with use_eagle=True (EAGLE/MTP drafters:
# the lookup drops the last matched block, whose KV the drafter recomputes)
LAYOUTS = {"full": (), "swa": ("swa",), "mamba": ("mamba",), "hybrid": ("swa", "mamba"),
           "full-spec": (), "swa-spec": ("swa",),
           "full-eagle": (), "mamba-eagle": ("mamba",), "hybrid-eagle": ("swa", "mamba")}


def window_blocks() -> int:
    """Blocks a sliding-window state at a block end needs: the last WINDOW - 1 positions."""
    return -(-(WINDOW - 1) // BLOCK)


def _kw(fn, **kw):
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kw
    return {k: v for k, v in kw.items() if k in params}


class Engine:
    name = "vllm"

    def __init__(self, src: str | None = None):
        if src:
            sys.path.insert(0, src)
        self.stubbed = stubs.install(STUB)
        import torch
        import vllm
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core import kv_cache_utils as ku
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                                MambaSpec, SlidingWindowSpec)
        from vllm.v1.request import Request
        try:
            from vllm.utils.hashing import sha256
        except ImportError:                                   # older layouts
            from vllm.utils import sha256
        self.torch, self.ku, self.sha256 = torch, ku, sha256
        self.KVCacheManager, self.Request, self.SamplingParams = KVCacheManager, Request, SamplingParams
        self.specs = (FullAttentionSpec, SlidingWindowSpec, MambaSpec, KVCacheConfig, KVCacheGroupSpec)
        self.stubbed = sorted({n.split(".")[0] for n in stubs.STUBBED})     # answered by a stub, this process
        self.version = getattr(vllm, "__version__", "?")
        self.path = vllm.__file__
        ku.init_none_hash(sha256)

    # ------------------------------------------------------------------ building
    def kinds(self, layout: str) -> tuple:
        return ("full",) + LAYOUTS[layout]

    def manager(self, layout: str, num_blocks: int, max_len: int = 256):
        Full, Swa, Mamba, Config, Group = self.specs
        f32 = self.torch.float32
        groups = []
        for i, kind in enumerate(self.kinds(layout)):
            if kind == "full":
                spec = Full(**_kw(Full, block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=f32))
            elif kind == "swa":
                spec = Swa(**_kw(Swa, block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=f32,
                                 sliding_window=WINDOW))
            else:
                spec = Mamba(**_kw(Mamba, block_size=BLOCK, shapes=((1, 1),), dtypes=(f32,),
                                   mamba_cache_mode="align"))
            groups.append(Group([f"layer{i}"], spec))
        cfg = Config(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
        return self.KVCacheManager(cfg, **_kw(self.KVCacheManager, max_model_len=max_len, enable_caching=True,
                                              scheduler_block_size=BLOCK, hash_block_size=BLOCK,
                                              use_eagle=layout.endswith("-eagle")))

    def request(self, rid: str, tokens):
        sp = self.SamplingParams(max_tokens=1 << 20)
        if hasattr(sp, "update_from_generation_config"):
            try:
                sp.update_from_generation_config({}, eos_token_id=None)
            except TypeError:                                  # older: (config, model_eos_token_id)
                sp.update_from_generation_config({}, None)
        hasher = self.ku.get_request_block_hasher(BLOCK, self.sha256)
        return self.Request(**_kw(self.Request, request_id=rid, prompt_token_ids=list(tokens), sampling_params=sp,
                                  pooling_params=None, block_hasher=hasher, eos_token_id=None))

    # ------------------------------------------------------------------ reading
    def cached(self, manager) -> list:
        """(hash, group, block id) for every block the pool's hash map holds. The map's shape changed
        across releases: key -> block | {id: block} (<= 0.33), key -> id plus a duplicates table
        (0.34)."""
        m = manager.block_pool.cached_block_hash_to_block
        dups = getattr(m, "_dup_ids", {})
        out = []
        for key, v in m._cache.items():
            h, g = bytes(self.ku.get_block_hash(key)), self.ku.get_group_id(key)
            if key in dups:
                ids = list(dups[key])
            elif isinstance(v, int):
                ids = [v]
            elif isinstance(v, dict):
                ids = [b.block_id for b in v.values()]
            else:
                ids = [v.block_id]
            out += [(h, g, i) for i in ids]
        return out

    def hashed(self, manager) -> list:
        return [(self.ku.get_group_id(b.block_hash), b.block_id) for b in manager.block_pool.blocks
                if b.block_hash is not None]

    def req_blocks(self, manager, rid: str) -> list:
        return [[b.block_id for b in m.req_to_blocks.get(rid, ())]
                for m in manager.coordinator.single_type_managers]

    def block_hashes(self, request) -> list:
        return [bytes(h) for h in request.block_hashes]


def load(src: str | None = None) -> Engine:
    return Engine(src)
