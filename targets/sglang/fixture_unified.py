"""targets/sglang/fixture_mamba.py's Mamba radix cache with the request calls of SGLang 0.5.23's
UnifiedRadixCache (`match_prefix(params)` with a deferred copy on write, `lock` / `unlock`,
`checkpoint(req, up_to)`, `free_kv_row`, `on_release`, `evict(params)`, a tree core with per-component
node data and counters), for CI (no sglang, no torch): `FakeUnifiedApi(fault)` stands where
targets.sglang.unified.UnifiedApi stands. The faults are fixture_mamba's.

checkpoint: an unfinished request inserts a fork of its state, a finished one donates its own slot (and
frees it when the tree already had a state there); the insert frees the row's duplicates past
cache_protected_len; the row takes the tree's slots; the lock moves to the insert's end.
"""
from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

from targets.sglang.fixture import Vec
from targets.sglang.fixture_mamba import FAULTS, AllocBase, FakeMambaCache, FakeRows  # noqa: F401

FULL, MAMBA = 0, 2


class FakeUnifiedCache(FakeMambaCache):
    @property
    def tree_core(self):
        return self

    @property
    def component_evictable_size_(self):
        return {FULL: self.full_evictable_size_, MAMBA: self.mamba_evictable_size_}

    @property
    def component_protected_size_(self):
        return {FULL: self.full_protected_size_, MAMBA: self.mamba_protected_size_}

    def match_prefix(self, params):
        value, (n, node) = self._walk(list(params.key))
        self._touch(node)
        kv = params.req.kv
        if params.cow_mamba and node.mamba_value is not None:
            if not kv.holds_mamba:
                if not self.rows.mamba_allocator.available_size():
                    self.inc_lock_ref(node)
                    self.evict(0, 1)
                    self.dec_lock_ref(node)
                kv.mamba_pool_idx = self.rows.mamba_allocator.alloc(1)[0]
            kv.mamba_cow_src_index = node.mamba_value
        return SimpleNamespace(last_device_node=node, device_prefix_len=n)

    def path_device_indices(self, node):
        out = []
        while node is not self.root_node:
            out[:0] = list(node.value)
            node = node.parent
        return Vec(out)

    def lock(self, node):
        self.inc_lock_ref(node)
        return SimpleNamespace(node=node)

    def unlock(self, lock):
        if lock is not None:
            self.dec_lock_ref(lock.node)

    def checkpoint(self, req, *, up_to):
        kv, done = req.kv, req.finished()
        tokens = list(req.full_untruncated_fill_ids[:up_to])
        row = self.rows.req_to_token[kv.req_pool_idx, :up_to]
        own = Vec([int(kv.mamba_pool_idx)])
        state = own if done or self.fault == "no-fork" else self.rows.mamba_pool.fork_from(own)
        if state is None:
            self.evict(0, 1)
            state = self.rows.mamba_pool.fork_from(own)
        _, exist = self.insert(tokens, row, state, kv.cache_protected_len)
        if exist and not done and self.fault != "no-fork":
            self.rows.mamba_pool.free(state)
        if exist and done:
            self.rows.free_mamba_cache(req)
        _, (_, node) = self._walk(tokens)
        new = self.path_device_indices(node)
        self.rows.write((kv.req_pool_idx, slice(kv.cache_protected_len, len(new))), new[kv.cache_protected_len:])
        kv.cache_protected_len = len(new)
        self.unlock(req.lock)
        req.lock = self.lock(node)
        req.last_node = node

    def free_kv_row(self, kv, ranges):
        for a, b in ranges:
            self.alloc.free(self.rows.req_to_token[kv.req_pool_idx, a:b])

    def on_release(self, req, *, checkpointed):
        pass

    def evict(self, params, mamba=None):
        if mamba is not None:                               # fixture_mamba's own internal calls
            return FakeMambaCache.evict(self, params, mamba)
        return FakeMambaCache.evict(self, params.num_tokens, params.mamba_num)


class UnifiedRows(FakeRows):
    def free(self, req) -> None:                            # 0.5.23: the row only
        pass


class FakeUnifiedApi:
    Alloc = AllocBase
    where = "fixture"
    FULL, MAMBA = FULL, MAMBA
    MatchPrefixParams = EvictParams = SimpleNamespace
    context = None
    tensor = staticmethod(Vec)

    def __init__(self, fault=None):
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.fault = fault

    @staticmethod
    def use_context(_ctx):
        return nullcontext()

    @staticmethod
    def RadixKey(tokens):
        return list(tokens)

    @staticmethod
    def tokens(key):
        return [int(x) for x in key]

    @staticmethod
    def rows(api, pool):
        return UnifiedRows(api, pool)

    def make(self, alloc, rows):
        return FakeUnifiedCache(alloc, rows, self.fault)
