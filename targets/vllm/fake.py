"""A small prefix-cache manager with the call surface of vLLM's KVCacheManager that the adapter uses,
and optional planted faults, so that CI exercises targets.vllm's adapter, view and rules without vLLM.

FakeEngine mirrors targets.vllm.engine.Engine (manager, request, cached, hashed, req_blocks,
block_hashes). The manager keeps one block list per group and a pool of POOL blocks with a free
queue (least recently freed first, a request's blocks freed tail first, as vLLM frees them);
a block gets a hash (its token prefix) when it fills, for full attention and sliding window; a Mamba
block only when a computed chunk ends exactly at its end (align mode). Lookup: the longest chain of
cached full-attention blocks up to (num_tokens - 1) // BLOCK, shortened to the deepest block end
where every other group has its block.

Faults (FakeEngine(faults=...)):
  "mamba-extend"   the Mamba group is looked up one block past the full-attention hit (past the
                   num_tokens - 1 cap too) and may lengthen the hit (the shape of vLLM 0.24's EAGLE
                   bug): C1
  "draft-cached"   blocks are cached up to the draft tokens too, so a block holding a rejected
                   draft gets a hash no request's tokens name: A1
  "stale-map"      eviction reuses a block without dropping its hash from the map: A1
"""
from __future__ import annotations

from collections import OrderedDict

from targets.vllm.engine import BLOCK, LAYOUTS

NULL = 0


class Block:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, i):
        self.block_id, self.ref_cnt, self.block_hash = i, 0, None


class Pool:
    def __init__(self, n, faults):
        self.blocks = [Block(i) for i in range(n)]
        self.free = OrderedDict((i, None) for i in range(1, n))
        self.map: dict = {}                      # (hash, group) -> block id
        self.faults = faults

    def get_num_free_blocks(self):
        return len(self.free)

    def get_new_blocks(self, n):
        out = []
        for _ in range(n):
            i, _ = self.free.popitem(last=False)
            b = self.blocks[i]
            if b.block_hash is not None:
                if "stale-map" not in self.faults:
                    self.map.pop(b.block_hash, None)
                b.block_hash = None
            b.ref_cnt = 1
            out.append(b)
        return out

    def free_blocks(self, blocks):
        for b in blocks:
            b.ref_cnt -= 1
            if b.ref_cnt == 0 and b.block_id != NULL:
                self.free[b.block_id] = None

    def touch(self, b):
        if b.ref_cnt == 0:
            self.free.pop(b.block_id, None)
        b.ref_cnt += 1


class Blocks:
    def __init__(self, groups):
        self.groups = groups

    def get_block_ids(self):
        return tuple([b.block_id for b in g] for g in self.groups)


class Request:
    def __init__(self, rid, tokens):
        self.request_id, self.prompt_token_ids = rid, list(tokens)
        self.all_token_ids = list(tokens)
        self.num_computed_tokens = 0
        self.spec_token_ids = []

    @property
    def num_tokens(self):
        return len(self.all_token_ids)

    @property
    def block_hashes(self):
        return [repr(tuple(self.all_token_ids[:e])).encode()
                for e in range(BLOCK, len(self.all_token_ids) + 1, BLOCK)]

    def append_output_token_ids(self, t):
        self.all_token_ids.append(t)


class Manager:
    def __init__(self, kinds, n, faults):
        self.kinds, self.faults = kinds, faults
        self.block_pool = Pool(n, faults)
        self.req_to_blocks = [dict() for _ in kinds]

    def _cached(self, h, g):
        i = self.block_pool.map.get((h, g))
        return None if i is None else self.block_pool.blocks[i]

    def get_computed_blocks(self, req):
        hashes = req.block_hashes[:(req.num_tokens - 1) // BLOCK]
        full = []
        for h in hashes:
            b = self._cached(h, 0)
            if b is None:
                break
            full.append(b)
        hit = len(full)
        others = [g for g, k in enumerate(self.kinds) if k != "full"]
        reach = hit + 1 if "mamba-extend" in self.faults else hit
        while hit > 0:
            ok = all(self._cached(hashes[hit - 1], g) is not None for g in others if self.kinds[g] == "mamba") and \
                all(self._cached(hashes[i], g) is not None for g in others if self.kinds[g] == "swa"
                    for i in range(max(0, hit - 2), hit))
            if ok:
                break
            hit -= 1
        every = req.block_hashes
        if "mamba-extend" in self.faults and "mamba" in self.kinds and reach <= len(every) and reach > hit:
            g = self.kinds.index("mamba")
            if self._cached(every[reach - 1], g) is not None:
                hit = reach
                hashes = every
        groups = []
        for g, k in enumerate(self.kinds):
            if k == "full":
                groups.append(full[:hit])
            elif k == "swa":
                groups.append([self._cached(hashes[i], g) or self.block_pool.blocks[NULL] for i in range(hit)])
            else:
                groups.append([self.block_pool.blocks[NULL]] * max(0, hit - 1) +
                              ([self._cached(hashes[hit - 1], g)] if hit else []))
        return Blocks(groups), hit * BLOCK, 0

    def allocate_slots(self, req, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None,
                       num_lookahead_tokens=0, **_):
        rid, pool = req.request_id, self.block_pool
        if new_computed_blocks is not None:
            for g, blocks in enumerate(new_computed_blocks.groups):
                for b in blocks:
                    if b.block_id != NULL:
                        pool.touch(b)
                self.req_to_blocks[g][rid] = list(blocks)
        start = req.num_computed_tokens + num_new_computed_tokens
        end = start + num_new_tokens + num_lookahead_tokens
        need = sum(max(0, -(-end // BLOCK) - len(self.req_to_blocks[g].get(rid, []))) for g in range(len(self.kinds)))
        if need > pool.get_num_free_blocks():
            return None
        for g in range(len(self.kinds)):
            have = self.req_to_blocks[g].setdefault(rid, [])
            have += pool.get_new_blocks(max(0, -(-end // BLOCK) - len(have)))
        upto = start + num_new_tokens
        if "draft-cached" not in self.faults:
            upto = min(upto, req.num_tokens)
        hashes = req.block_hashes if "draft-cached" not in self.faults else \
            [repr(tuple((req.all_token_ids + req.spec_token_ids)[:e])).encode()
             for e in range(BLOCK, len(req.all_token_ids) + len(req.spec_token_ids) + 1, BLOCK)]
        for g, k in enumerate(self.kinds):
            have = self.req_to_blocks[g][rid]
            for i in range(upto // BLOCK):
                if k == "mamba" and (i + 1) * BLOCK != upto:
                    continue
                b = have[i]
                if b.block_id != NULL and b.block_hash is None and i < len(hashes) \
                        and (hashes[i], g) not in pool.map:          # one block per hash (vLLM keeps duplicates)
                    b.block_hash = (hashes[i], g)
                    pool.map[(hashes[i], g)] = b.block_id
        return Blocks([[] for _ in self.kinds])

    def free(self, req):
        for g in range(len(self.kinds)):
            blocks = self.req_to_blocks[g].pop(req.request_id, [])
            self.block_pool.free_blocks([b for b in reversed(blocks) if b.block_id != NULL])


class FakeEngine:
    name = "fake"
    version = "fake"
    path = __file__
    stubbed: list = []

    def __init__(self, faults=()):
        self.faults = frozenset(faults)

    def kinds(self, layout):
        return ("full",) + LAYOUTS[layout]

    def manager(self, layout, num_blocks, max_len=256):
        return Manager(self.kinds(layout), num_blocks, self.faults)

    def request(self, rid, tokens):
        return Request(rid, tokens)

    def cached(self, m):
        return [(h, g, i) for (h, g), i in m.block_pool.map.items()]

    def hashed(self, m):
        return [(b.block_hash[1], b.block_id) for b in m.block_pool.blocks if b.block_hash is not None]

    def req_blocks(self, m, rid):
        return [[b.block_id for b in m.req_to_blocks[g].get(rid, [])] for g in range(len(m.kinds))]

    def block_hashes(self, request):
        return request.block_hashes
