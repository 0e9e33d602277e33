"""targets/sglang/fixture.py's radix cache with the request calls of SGLang 0.5.23's RadixCache
(`checkpoint(req, up_to)`, `lock` / `unlock`, `free_kv_row`), for CI (no sglang, no torch):
`FakeCheckpointApi(fault)` stands where engine.Api stands for targets.sglang.full_req.CheckpointTarget.

checkpoint: insert the request's tokens [0, up_to) with its row, free the row's duplicates in
[cache_protected_len, prefix), match again, write the tree's slots into the row, move the lock.
Faults: those of fixture.py, and
  "keep-duplicates"  checkpoint frees none of the row's duplicates (A2: leaked slots)
"""
from __future__ import annotations

from types import SimpleNamespace

from targets.sglang import fixture
from targets.sglang.fixture import FakeApi, FakeRadixCache, Vec
from targets.sglang.fixture_swa import FakeReqToToken

FAULTS = fixture.FAULTS + ("keep-duplicates",)


class FakeCheckpointCache(FakeRadixCache):
    def __init__(self, params, fault=None):
        super().__init__(params.token_to_kv_pool_allocator, fault)
        self.rows = params.req_to_token_pool

    def lock(self, node):
        self.inc_lock_ref(node)
        return SimpleNamespace(node=node)

    def unlock(self, lock):
        if lock is not None:
            self.dec_lock_ref(lock.node)

    def _path(self, node) -> list:
        out = []
        while node is not self.root_node:
            out[:0] = list(node.value)
            node = node.parent
        return out

    def checkpoint(self, req, *, up_to):
        kv = req.kv
        tokens = list(req.full_untruncated_fill_ids[:up_to])
        row = self.rows.req_to_token[kv.req_pool_idx, :up_to]
        prefix = self.insert(tokens, row)
        if self.fault != "keep-duplicates":
            self.alloc.free(row[kv.cache_protected_len:prefix])
        _, node = self.match_prefix(tokens)
        new = self._path(node)
        self.rows.write((kv.req_pool_idx, slice(kv.cache_protected_len, len(new))), Vec(new[kv.cache_protected_len:]))
        kv.cache_protected_len = len(new)
        self.unlock(req.lock)
        req.lock = self.lock(node)
        req.last_node = node

    def free_kv_row(self, kv, ranges):
        for a, b in ranges:
            self.alloc.free(self.rows.req_to_token[kv.req_pool_idx, a:b])


class FakeCheckpointApi(FakeApi):
    req_to_token = FakeReqToToken
    CacheInitParams = SimpleNamespace

    def __init__(self, fault=None):
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        super().__init__(fault if fault in fixture.FAULTS else None)
        self.fault = fault

    def RadixCache(self, params):
        return FakeCheckpointCache(params, self.fault)
