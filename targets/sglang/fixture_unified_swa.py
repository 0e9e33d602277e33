"""targets/sglang/fixture_swa.py's sliding-window radix cache with the request calls of SGLang 0.5.23's
UnifiedRadixCache (`match_prefix(params)`, `lock` / `unlock`, `checkpoint(req, up_to)`, `free_kv_row`,
`on_release`, `evict(params)`, `evict_sliding_windows`, a tree core whose nodes carry per-component data
and counters), for CI (no sglang, no torch): `FakeUnifiedSwaApi(fault)` stands where
targets.sglang.unified_swa.UnifiedSwaApi stands (Full + SWA). The faults are fixture_swa's window bugs:
"tombstone-match" (C1), "swa-leak" (A2), "swa-counter" (A1).

checkpoint: insert the request's tokens [0, up_to) with its row (duplicates past cache_protected_len
freed, a tombstone given the request's slots back), match again, write the tree's slots into the row, move
the lock. The scheduler's window slide (`evict_sliding_windows`) releases nothing here: the fake keeps the
request's SWA slots until its close.
"""
from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

from targets.sglang.fixture import Vec
from targets.sglang.fixture_mamba import FakeRows
from targets.sglang.fixture_swa import FAULTS, AllocBase, FakeSwaCache, Node  # noqa: F401

FULL, SWA, MAMBA = 0, 1, 2


class UnifiedNode(Node):
    pool = None                            # the cache's allocator (set per cache by FakeUnifiedSwaCache)

    @property
    def component_data(self):
        swa = None if self.swa_tombstone else Vec([self.pool.mapping.get(int(s), 0) for s in self.value])
        return [SimpleNamespace(value=self.value), SimpleNamespace(value=swa), None]


class _FullOnlyWhenTombstoned:
    """fixture_swa frees a slot with `free` whether or not its SWA peer is still mapped (the older
    allocator skipped unmapped peers); 0.5.23 frees those full-only (FreeDeviceKVFullOnly)."""

    def __init__(self, alloc):
        self._a = alloc

    def free(self, idx) -> None:
        idx = [int(s) for s in idx]
        mapped = [s for s in idx if self._a.mapping.get(s, 0)]
        self._a.free_full(Vec([s for s in idx if s not in mapped]))
        self._a.free(Vec(mapped))

    def __getattr__(self, item):
        return getattr(self._a, item)


class FakeUnifiedSwaCache(FakeSwaCache):
    def __init__(self, alloc, rows, window, fault=None):
        self.node_class = type("Node", (UnifiedNode,), {"pool": alloc})
        super().__init__(alloc, rows, window, fault)
        self.alloc, self.rows = _FullOnlyWhenTombstoned(alloc), rows

    @property
    def tree_core(self):
        return self

    @property
    def component_evictable_size_(self):
        return {FULL: self.full_evictable_size_, SWA: self.swa_evictable_size_}

    @property
    def component_protected_size_(self):
        return {FULL: self.full_protected_size_, SWA: self.swa_protected_size_}

    def match_prefix(self, params):
        value, node = FakeSwaCache.match_prefix(self, list(params.key))
        return SimpleNamespace(last_device_node=node, device_prefix_len=len(value), swa_branching_seqlen=None)

    def path_device_indices(self, node):
        out = []
        while node is not self.root_node:
            out[:0] = list(node.value)
            node = node.parent
        return Vec(out)

    def lock(self, node):
        return SimpleNamespace(node=node, uuid=self.inc_lock_ref(node))

    def unlock(self, lock):
        if lock is not None:
            self.dec_lock_ref(lock.node, lock.uuid)

    def checkpoint(self, req, *, up_to):
        kv = req.kv
        tokens = list(req.full_untruncated_fill_ids[:up_to])
        self.insert(tokens, self.rows.req_to_token[kv.req_pool_idx, :up_to], kv.cache_protected_len)
        new, node = FakeSwaCache.match_prefix(self, tokens)
        self.rows.write((kv.req_pool_idx, slice(kv.cache_protected_len, len(new))), new[kv.cache_protected_len:])
        kv.cache_protected_len = len(new)
        self.unlock(req.lock)
        req.lock, req.last_node = self.lock(node), node

    def free_kv_row(self, kv, ranges):
        for a, b in ranges:
            self.alloc.free(self.rows.req_to_token[kv.req_pool_idx, a:b])

    def on_release(self, req, *, checkpointed):
        pass

    def evict_sliding_windows(self, req, pre_len, *, eviction_interval: int = 1):
        pass

    def evict(self, params, swa=None):
        if swa is not None:                                 # fixture_swa's own internal calls
            return FakeSwaCache.evict(self, params, swa)
        return FakeSwaCache.evict(self, params.num_tokens, params.swa_num_tokens)


class FakeUnifiedSwaApi:
    where = "fixture"
    FULL, SWA, MAMBA = FULL, SWA, MAMBA
    MatchPrefixParams = EvictParams = SimpleNamespace
    context = None
    mamba = False
    tensor = staticmethod(Vec)

    def __init__(self, fault=None):
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.fault = fault
        from targets.sglang.unified_swa import unified_pool_class
        self.Pool = unified_pool_class(AllocBase)

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
        return FakeRows(api, pool)

    def make(self, alloc, rows, window):
        return FakeUnifiedSwaCache(alloc, rows, window, self.fault)

    def evict(self, cache, full: int, swa: int, mamba: int = 0) -> None:
        cache.evict(SimpleNamespace(num_tokens=full, swa_num_tokens=swa, mamba_num=mamba))
