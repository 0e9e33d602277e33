"""A finding as a standalone pytest test against vLLM's public API (a maintainer pastes it into
tests/v1/core/).

Invariants of every exported test:
- it imports only vLLM (KVCacheManager, KVCacheConfig/KVCacheGroupSpec and the specs, Request,
  SamplingParams, the block hasher) and torch, and builds the manager as vLLM's own
  tests/v1/core/test_prefix_caching.py does; no model runs;
- it replays the shrunk program with the scheduler's calls (get_computed_blocks, allocate_slots per
  chunk, append_output_token_ids + allocate_slots per decode step, free) and plays the forward by
  tagging each block with the tokens written into it (the Mamba block of the last computed token
  with the prefix whose state it holds);
- it decides what is cached by reading the BlockPool's hash map and the request's blocks, and
  asserts the finding's rule after every lookup: C1 -- every block a hit serves holds the prefix it
  claims; S1/S2 -- every cached block holds its hash's tokens; it fails on the affected version
  and passes once the bug is fixed.
"""
from __future__ import annotations

from targets.vllm.engine import BLOCK, LAYOUTS, WINDOW

TEMPLATE = '''"""{title}

Found by prefix-trie-mlx (targets/vllm) on vLLM {version}; rule {rule}: {rule_text}
Responsible: {where}
{why}
"""
import inspect

import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec,
                                        SlidingWindowSpec)
from vllm.v1.request import Request
try:
    from vllm.utils.hashing import sha256
except ImportError:
    from vllm.utils import sha256

BLOCK, WINDOW, POOL, CHUNK = {block}, {window}, 192, {chunk}
GROUPS = {groups}            # kinds of the KV cache groups
USE_EAGLE = {eagle}
DRAFTS = {drafts}            # draft tokens per decode step (all rejected)
PROGRAM = {program}


def make_manager():
    f32 = torch.float32
    specs = {{"full": lambda: FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=f32),
             "swa": lambda: SlidingWindowSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=f32,
                                              sliding_window=WINDOW),
             "mamba": lambda: MambaSpec(block_size=BLOCK, shapes=((1, 1),), dtypes=(f32,),
                                        mamba_cache_mode="align")}}
    groups = [KVCacheGroupSpec([f"layer{{i}}"], specs[k]()) for i, k in enumerate(GROUPS)]
    cfg = KVCacheConfig(num_blocks=POOL, kv_cache_tensors=[], kv_cache_groups=groups)
    kw = dict(max_model_len=256, enable_caching=True, scheduler_block_size=BLOCK, hash_block_size=BLOCK,
              use_eagle=USE_EAGLE)
    params = inspect.signature(KVCacheManager.__init__).parameters      # older releases take fewer
    return KVCacheManager(cfg, **{{k: v for k, v in kw.items() if k in params}})


def make_request(rid, tokens):
    sp = SamplingParams(max_tokens=1 << 20)
    return Request(request_id=rid, prompt_token_ids=list(tokens), sampling_params=sp, pooling_params=None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


class Driver:
    def __init__(self):
        self.m = make_manager()
        self.tags, self.mtags, self.paths = {{}}, {{}}, {{}}

    def new_step(self):
        """A scheduler step starts (vLLM's scheduler calls this before it schedules)."""
        if hasattr(self.m, "new_step_starts"):
            self.m.new_step_starts()

    def blocks(self, rid):
        return [[b.block_id for b in mgr.req_to_blocks.get(rid, ())]
                for mgr in self.m.coordinator.single_type_managers]

    def write(self, req, tokens, p):
        q = p + len(tokens)
        for g, kind in enumerate(GROUPS):
            ids = self.blocks(req.request_id)[g]
            if kind == "mamba":
                i = (q - 1) // BLOCK
                if i < len(ids) and ids[i]:
                    self.mtags[ids[i]] = tuple(req.all_token_ids[:q])
                continue
            for pos in range(p, q):
                if pos // BLOCK < len(ids) and ids[pos // BLOCK]:
                    self.tags.setdefault(ids[pos // BLOCK], {{}})[pos] = tokens[pos - p]
        for i, h in enumerate(req.block_hashes):
            self.paths.setdefault(bytes(h), tuple(req.all_token_ids[:(i + 1) * BLOCK]))

    def block_holds(self, kind, bid, prefix):
        """Does block `bid` hold what a block ending at len(prefix) holds?"""
        if kind == "mamba":
            return self.mtags.get(bid) == tuple(prefix)
        e = len(prefix)
        return tuple(self.tags.get(bid, {{}}).get(pos) for pos in range(e - BLOCK, e)) == tuple(prefix[-BLOCK:])

    def check_hit(self, req, served, hit):
        """C1: every block the hit serves holds the prefix it claims, in every group that needs it."""
        nb = hit // BLOCK
        for g, kind in enumerate(GROUPS):
            ids = list(served[g]) + [0] * max(0, nb - len(served[g]))
            need = range(nb) if kind == "full" else (
                range(max(0, nb - -(-(WINDOW - 1) // BLOCK)), nb) if kind == "swa" else range(max(0, nb - 1), nb))
            for i in need:
                prefix = req.all_token_ids[:(i + 1) * BLOCK]
                assert ids[i] and self.block_holds(kind, ids[i], prefix), (
                    f"C1: hit of {{hit}} tokens; group {{g}} ({{kind}}) block {{i}} (id {{ids[i]}}) does not hold "
                    f"tokens {{list(prefix[-BLOCK:])}} of the prefix it is served for")

    def check_cached(self):
        """S1/S2: every block in the hash map holds the tokens (state) of the prefix its hash names."""
        from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id
        pool = self.m.block_pool
        for key, v in pool.cached_block_hash_to_block._cache.items():
            h, g = bytes(get_block_hash(key)), get_group_id(key)
            ids = [v] if isinstance(v, int) else [b.block_id for b in v.values()] if isinstance(v, dict) else [v.block_id]
            prefix = self.paths.get(h)
            for bid in ids:
                assert prefix is not None and self.block_holds(GROUPS[g], bid, prefix), (
                    f"S1/S2: block {{bid}} of group {{g}} is cached under the hash of {{prefix}} but holds other tokens")

    def run(self, rule):
        n, req, seeded = 0, None, False
        for op in PROGRAM:
            name = op["op"]
            if name == "begin":
                n += 1
                req = make_request(f"r{{n}}", op["keys"])
                self.new_step()
                got = self.m.get_computed_blocks(req)
                blocks, hit = got[0], got[1]
                served = blocks.get_block_ids()
                if rule == "C1":
                    self.check_hit(req, served, hit)
                seeded = False
                if hit < len(op["keys"]):
                    q = min(len(op["keys"]), hit + CHUNK)
                    assert self.m.allocate_slots(req, q - hit, hit, blocks) is not None
                    self.write(req, op["keys"][hit:q], hit)
                    req.num_computed_tokens = q
            elif name == "prefill":
                k = op.get("max_chunks") or None
                while req.num_computed_tokens < len(op_keys(req)) and (k is None or k > 0):
                    p = req.num_computed_tokens
                    q = min(len(op_keys(req)), p + CHUNK)
                    self.new_step()
                    assert self.m.allocate_slots(req, q - p) is not None
                    self.write(req, op_keys(req)[p:q], p)
                    req.num_computed_tokens = q
                    k = None if k is None else k - 1
            elif name == "step":
                if not seeded:
                    seeded = True
                    continue
                req.append_output_token_ids(op["key"])
                drafts = [1000 + op["key"] + i for i in range(DRAFTS)]
                req.spec_token_ids = list(drafts)
                p = req.num_computed_tokens
                self.new_step()
                assert self.m.allocate_slots(req, 1 + DRAFTS, num_lookahead_tokens=DRAFTS) is not None
                self.write(req, [op["key"]] + drafts, p)
                req.num_computed_tokens = p + 1
                req.spec_token_ids = []
            elif name == "close":
                self.m.free(req)
                req = None
            if rule in ("S1", "S2"):
                self.check_cached()


def op_keys(req):
    return list(req.prompt_token_ids)


def test_{name}():
    init_none_hash(sha256)
    Driver().run("{rule}")
'''

RULE_TEXT = {
    "C1": "the blocks a prefix-cache hit serves hold exactly the prefix the hit claims (content identity)",
    "C2": "the hit is the deepest block end every group can serve",
    "S1": "a cached full-attention block holds the tokens of its own block",
    "S2": "a cached sliding-window or Mamba block holds the state at its block end",
}


def export(finding: dict) -> str | None:
    """The finding as a pytest module, or None where the test cannot state its rule (T*, A*)."""
    rule = finding["rule"]
    if rule not in ("C1", "S1", "S2"):
        return None
    ops = [o for o in finding["ops"] if o["op"] in ("begin", "prefill", "step", "close")]
    from targets.vllm.adapter import LOOKAHEAD, wire
    ops = [{"op": "begin", "keys": [wire(k) for k in o["keys"]]} if o["op"] == "begin" else
           ({"op": "step", "key": wire(o["key"])} if o["op"] == "step" else
            {k: v for k, v in o.items() if k in ("op", "max_chunks")}) for o in ops]
    layout = finding["layout"]
    reset = next((o for o in finding["ops"] if o["op"] == "reset"), {})
    name = f"{rule.lower()}_{layout.replace('-', '_')}"
    return TEMPLATE.format(
        title=f"vLLM prefix cache: {rule} violation on the {layout} layout", version=finding.get("version", "?"),
        rule=rule, rule_text=RULE_TEXT[rule], where=finding.get("where", ""), why=finding.get("why", ""),
        block=BLOCK, window=WINDOW, chunk=reset.get("chunk", 8), groups=repr(("full",) + LAYOUTS[layout]),
        eagle=layout.endswith("-eagle"), drafts=LOOKAHEAD if layout.endswith("-spec") else 0,
        program=repr(ops), name=name)
