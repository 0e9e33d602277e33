"""A tiny radix cache with SGLang's request calls and planted faults, for CI (no sglang, no torch).

`FakeReqApi(fault, eagle)` stands where engine.Api stands for targets.sglang.reqcalls.ReqTarget:
`RadixCache(req_to_token_pool=..., token_to_kv_pool_allocator=..., page_size=1, is_eagle=...)`
builds a FakeReqCache (targets.sglang.fixture's tree, page size 1) with `cache_unfinished_req` and
`cache_finished_req` written from the behaviour SGLang documents: insert the request's evaluated
keys (bigrams (t[i], t[i+1]) with `is_eagle`) with its slots, free the request's slots the tree
already held from its protected length on, and (unfinished) adopt the tree's slots, move the lock;
(finished) free the slots past the inserted keys and release the lock. With `fault=None` it breaks
no rule; each fault plants one bug:

  "stale-protected"  cache_finished_req frees duplicates from one past the protected length (the
                     shape of the 0.5.3 - 0.5.5 EAGLE page-size leak): A2
  "keep-tail"        cache_finished_req keeps the slots past the inserted keys: A2
"""
from __future__ import annotations

from targets.sglang.fixture import FakeRadixCache, Vec

FAULTS = ("stale-protected", "keep-tail")


class Table:
    """A one-row request-to-token table with the [0, a:b] indexing the calls use."""

    def __init__(self, api=None, width: int = 4096):
        self.row = [0] * width
        self.req_to_token = self

    def __getitem__(self, idx):
        _, s = idx
        return Vec(self.row[s])

    def __setitem__(self, idx, values):
        _, s = idx
        vals, a = list(values), s.start or 0
        self.row[a:a + len(vals)] = [int(v) for v in vals]

    def write(self, idx, values) -> None:
        self[idx] = values

    def free(self, req_pool_idx) -> None:
        pass


def _keys(tokens, eagle):
    return [(a, b) for a, b in zip(tokens, tokens[1:])] if eagle else list(tokens)


class FakeReqCache(FakeRadixCache):
    fault = None

    def __init__(self, req_to_token_pool, token_to_kv_pool_allocator, page_size=1, disable=False,
                 is_eagle=False):
        assert page_size == 1, "the fixture is page size 1"
        super().__init__(token_to_kv_pool_allocator, type(self).fault)
        self.table, self.is_eagle = req_to_token_pool, is_eagle

    def match_prefix(self, key):
        return super().match_prefix(_keys(list(key), self.is_eagle))

    def _path_slots(self, node):
        out = []
        while node is not self.root_node:
            out = list(node.value) + out
            node = node.parent
        return out

    def _insert(self, req, tokens):
        keys = _keys(tokens, self.is_eagle)
        row = self.table[0, slice(0, len(tokens))]
        return keys, row, (super().insert(keys, Vec(row[:len(keys)])) if keys else 0)

    def cache_unfinished_req(self, req, chunked=False):
        keys, row, prefix = self._insert(req, list(req.fill_ids))
        self.alloc.free(row[req.cache_protected_len:prefix])
        node = super().match_prefix(keys)[1]
        new = self._path_slots(node)
        self.table[0, slice(req.cache_protected_len, len(new))] = new[req.cache_protected_len:]
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(node)
        req.last_node, req.cache_protected_len = node, len(new)
        req.prefix_indices = Vec(new + list(row[len(new):]))

    def cache_finished_req(self, req):
        tokens = (req.origin_input_ids + req.output_ids)[:req.pop_committed_kv_cache()]
        keys, row, prefix = self._insert(req, tokens)
        start = req.cache_protected_len + (1 if self.fault == "stale-protected" else 0)
        self.alloc.free(row[start:prefix])
        if self.fault != "keep-tail":
            self.alloc.free(row[len(keys):])
        self.dec_lock_ref(req.last_node)


class FakeReqApi:
    where = "fixture"
    CacheInitParams = None

    def __init__(self, fault=None):
        assert fault is None or fault in FAULTS, fault
        self.fault = fault
        self.req_to_token = Table
        self.RadixCache = type("FakeReqCache", (FakeReqCache,), {"fault": fault})

    @staticmethod
    def tensor(values):
        return Vec(int(v) for v in values)

    def match(self, cache, tokens):
        return cache.match_prefix(list(tokens))[1]

    def evict(self, cache, n: int) -> None:
        cache.evict(n)

    @staticmethod
    def tokens(key) -> list:
        return [int(x) for x in key]
