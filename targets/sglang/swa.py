"""SGLang's sliding-window radix cache (`SWARadixCache`, 0.4.10 - 0.5.x) behind the target interface,
driven through its own `cache_unfinished_req` / `cache_finished_req` with a minimal request.

What is SGLang's and what is ours:
- the cache is SGLang's `SWARadixCache`, built as its unit tests build it (the allocator passed in,
  page size 1, `sliding_window_size` = WINDOW); every tree operation of a request goes through SGLang:
  `match_prefix` at admission, `inc_lock_ref` on the matched node, `cache_unfinished_req(req)` after
  every prefill chunk, `cache_finished_req(req)` at close, `evict` for a budget;
- the KV pool is `SwaTagPool`: a subclass of SGLang's own `SWATokenToKVPoolAllocator` (so the cache's
  isinstance check holds) whose slots are not tensors but tags. Each full slot has an SWA slot
  (`full_to_swa_index_mapping`), both tagged with the key path they were written for; `free` releases
  both, `free_swa` only the SWA one (a tombstone), exactly as SGLang's allocator does;
- `FakeReq` carries the fields those two calls read (origin_input_ids, output_ids, fill_ids,
  req_pool_idx, prefix_indices, last_node, swa_uuid_for_lock, cache_protected_len, ...), and
  `ReqToToken` the request's row of slot indices (`req_to_token`, `write`, `free`);
- the driver reads back what SGLang decided: the request's row, `last_node`, `cache_protected_len`.

Call shapes that changed across releases (construction with keyword arguments / CacheInitParams with
or without `sliding_window_size`; Params objects or plain arguments) are probed, never keyed on a
version. The view (targets.sglang.swa_view) adds a windowed layer to the full-attention view.
"""
from __future__ import annotations

import inspect
from types import SimpleNamespace

from targets.sglang.engine import KeyCalls
from targets.sglang.pool import TagAllocator
from targets.sglang.rules_swa import NOT_APPLICABLE, RULES
from targets.sglang.target import SglangTarget

WINDOW = 4          # the sliding window, in tokens


class SwaApi(KeyCalls):
    """SGLang's SWARadixCache module, with the call shapes probed."""

    def __init__(self, mod, bp, cip, where: str):
        self.mod, self.where = mod, where
        self.Cache = mod.SWARadixCache
        self.Alloc = mod.SWATokenToKVPoolAllocator
        self.RadixKey = getattr(mod, "RadixKey", None)
        names = ("MatchPrefixParams", "InsertParams", "EvictParams", "DecLockRefParams")
        self.params = {n: getattr(bp, n, None) for n in names}
        self.CacheInitParams = cip


    def make(self, alloc, r2t, window: int = WINDOW):
        sig = inspect.signature(self.Cache.__init__).parameters
        if "params" in sig:
            fields = dict(disable=False, req_to_token_pool=r2t, token_to_kv_pool_allocator=alloc, page_size=1)
            if "sliding_window_size" in sig:
                return self.Cache(self.CacheInitParams(**fields), sliding_window_size=window)
            return self.Cache(self.CacheInitParams(**fields, sliding_window_size=window))
        return self.Cache(req_to_token_pool=r2t, token_to_kv_pool_allocator=alloc, sliding_window_size=window,
                          page_size=1, disable=False)

    def match(self, cache, tokens):
        """(slot indices served, last node)."""
        P = self.params["MatchPrefixParams"]
        r = cache.match_prefix(P(key=self.key(tokens))) if P else cache.match_prefix(key=self.key(tokens))
        return [int(x) for x in r[0].tolist()], r[1]

    def lock(self, cache, node):
        r = cache.inc_lock_ref(node)
        return getattr(r, "swa_uuid_for_lock", r)

    def evict(self, cache, full: int, swa: int) -> None:
        P = self.params["EvictParams"]
        cache.evict(P(num_tokens=full, swa_num_tokens=swa)) if P else cache.evict(full, swa)


def load_swa(src=None) -> SwaApi:
    from targets.sglang import engine
    api = engine.load(src)
    mod = engine.load_module("swa_radix_cache", src)
    return SwaApi(mod, api.bp, api.CacheInitParams, api.where)


def pool_class(base):
    """A tagging pool that is an instance of SGLang's SWATokenToKVPoolAllocator (`base`)."""

    class SwaTagPool(TagAllocator, base):
        def __init__(self, size: int = 1 << 12, tensor=list):
            TagAllocator.__init__(self, size, tensor=tensor)
            self.swa_free = list(range(size - 1, 0, -1))
            self.swa_allocated: set = set()
            self.swa_tags: dict = {}
            self.mapping: dict = {}                         # full slot -> swa slot (0: none)
            self.swa_double_frees: list = []

        # ---- the allocator calls SGLang's SWA caches make
        def free(self, free_index) -> None:
            self.free_swa(free_index)
            TagAllocator.free(self, free_index)

        def free_full(self, free_index) -> None:
            TagAllocator.free(self, free_index)

        def free_swa(self, free_index) -> None:
            for s in _ints(free_index):
                w = self.mapping.get(s, 0)
                if not w:
                    continue
                self.mapping[s] = 0
                if w not in self.swa_allocated:
                    self.swa_double_frees.append(w)
                    continue
                self.swa_allocated.discard(w)
                self.swa_free.append(w)

        def free_segment(self, free_index, *, start_pos: int = 0) -> None:
            self.free(free_index)

        def free_full_segment(self, free_index, *, start_pos: int = 0) -> None:
            self.free_full(free_index)

        def free_swa_segment(self, free_index, *, start_pos: int = 0) -> None:
            self.free_swa(free_index)

        def clear_full_to_swa_mapping(self, full_indices) -> None:
            for s in _ints(full_indices):
                self.mapping[s] = 0

        def full_available_size(self) -> int:
            return len(self.free_slots)

        def swa_available_size(self) -> int:
            return len(self.swa_free)

        # ---- the driver's (a forward writing K/V into both pools)
        def alloc_for(self, seq: tuple, start: int, end: int):
            out = TagAllocator.alloc_for(self, seq, start, end)
            for i, s in enumerate(_ints(out)):
                w = self.swa_free.pop()
                self.swa_allocated.add(w)
                self.swa_tags[w] = tuple(seq[:start + i + 1])
                self.mapping[s] = w
            return out

        def swa_content(self, slot: int, pos: int):
            w = self.mapping.get(slot, 0)
            t = self.swa_tags.get(w)
            if not w or w not in self.swa_allocated or t is None or len(t) != pos + 1:
                return ("stale-swa", slot)
            return t[-1]

    return SwaTagPool


def _ints(x) -> list:
    return [int(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]


class ReqToToken:
    """The request-to-slot table SGLang's cache_*_req read and write (one request at a time)."""

    def __init__(self, api, width: int = 4096):
        import torch
        self.req_to_token = torch.zeros((1, width), dtype=torch.int64)
        self.api = api

    def write(self, index, values) -> None:
        self.req_to_token[index] = values

    def free(self, req_pool_idx) -> None:
        pass


class FakeReq(SimpleNamespace):
    """The request fields SGLang's cache_unfinished_req / cache_finished_req read, over releases
    (`kv` aliases the request itself: 0.5.20 moved some fields there)."""

    def pop_committed_kv_cache(self) -> int:
        return self.committed

    def get_fill_ids(self):
        return self.fill_ids


class SwaTarget(SglangTarget):
    name = "sglang-swa"
    RULES = RULES
    NOT_APPLICABLE = NOT_APPLICABLE

    def __init__(self, api=None, window: int = WINDOW, chunk: int = 8):
        self.window = window
        super().__init__(api, chunk=chunk)

    def reset(self, budget: int = 1 << 40, chunk: int | None = None, **_config):
        self.chunk = chunk or self.chunk
        self.alloc = pool_class(self.api.Alloc)(tensor=self.api.tensor)
        self.r2t = getattr(self.api, "req_to_token", ReqToToken)(self.api)
        self.cache = self.api.make(self.alloc, self.r2t, self.window)
        self.protected_len = "cache_protected_len" in inspect.getsource(type(self.cache).cache_unfinished_req)
        self.releases_window = "swa_evicted_seqlen" in inspect.getsource(type(self.cache).cache_finished_req)
        self.decodes = 0
        self.budget = self.shown_budget = budget
        self.req = self.fake = self.outcome = None
        self.clock = 0
        self.victims: list = []
        self.used: dict = {}

    def counted(self) -> int:
        return int(self.cache.full_evictable_size_) + int(self.cache.full_protected_size_)

    def swa_counted(self) -> int:
        return int(self.cache.swa_evictable_size_) + int(self.cache.swa_protected_size_)

    # ------------------------------------------------------------------ operations
    def begin(self, keys, spans=()) -> tuple:
        if spans:
            raise ValueError("sglang target: non-causal media spans are not modelled")
        keys = tuple(int(k) for k in keys)
        self.clock += 1
        matched = self._longest(keys)
        slots, node = self.api.match(self.cache, keys[:-1])
        uuid = self.api.lock(self.cache, node)
        self.r2t.req_to_token[0, :len(slots)] = self.api.tensor(slots)
        self.fake = FakeReq(rid="r", req_pool_idx=0, origin_input_ids=list(keys), output_ids=[], fill_ids=[],
                            prefix_indices=self.api.tensor(slots), last_node=node, swa_uuid_for_lock=uuid,
                            extra_key=None, cache_salt=None, cache_protected_len=len(slots),
                            swa_evicted_seqlen=0, swa_prefix_lock_released=False, committed=0,
                            extend_range=SimpleNamespace(end=0))
        self.fake.kv = self.fake
        self.decodes = 0
        self.req = {"keys": keys, "seq": list(keys[:len(slots)]), "slots": slots, "node": node,
                    "protected": len(slots), "resume": len(slots), "matched": matched, "prefilled": False,
                    "chunks": []}
        self.outcome = (matched, len(slots))
        return self.outcome

    def step(self, key: int) -> None:
        """A decode step; where SGLang's cache takes `swa_evicted_seqlen` (0.5.8 on), the scheduler's
        ScheduleBatch._evict_swa is replayed first, at its cadence (every W-th decode): the request's
        own SWA slots below len - W and above its protected prefix are released (free_swa)."""
        if self.releases_window:
            self.decodes += 1
            if self.decodes % self.window == 1:
                self._release_window(len(self.req["seq"]))
        super().step(key)

    def _release_window(self, pre_len: int) -> None:
        f, r = self.fake, self.req
        f.swa_evicted_seqlen = max(f.swa_evicted_seqlen, r["protected"])
        new = max(f.swa_evicted_seqlen, pre_len - self.window)
        ps = int(getattr(self.cache, "page_size", 1))
        new = new // ps * ps                                      # the scheduler frees whole pages only
        if new > f.swa_evicted_seqlen:
            self.alloc.free_swa(self.api.tensor(r["slots"][f.swa_evicted_seqlen:new]))
            f.swa_evicted_seqlen = new

    def _longest(self, keys) -> int:
        from spec.trie import common_prefix
        tree = [k for k, _, _ in self.nodes()]
        return min(max([0] + [common_prefix(k, keys) for k in tree]), len(keys) - 1)

    def set_budget(self, budget: int) -> None:
        """At rest: both pools are brought to the budget. While a request is open, the SWA pool at once
        (SGLang tombstones SWA outside the request's window under pool pressure, its locked path
        included), the full pool at its close (locked KV cannot be freed)."""
        self.budget = budget
        if self.req is None:
            self._enforce()
            return
        swa_over = self.swa_cached() - budget // 4 // 2
        if swa_over > 0:
            self.api.evict(self.cache, 0, swa_over)

    def _forward(self, keys) -> None:
        super()._forward(keys)
        r = self.req
        self.r2t.req_to_token[0, :len(r["slots"])] = self.api.tensor(r["slots"])

    def _sync_fake(self) -> None:
        """The request's token fields for what has been evaluated (r["seq"]): SGLang inserts
        (origin + output)[:-1] (old releases) or [:committed] (0.5.6 on); both are seq."""
        r, f = self.req, self.fake
        seq, n = list(r["seq"]), len(r["keys"])
        f.origin_input_ids = seq[:n] if len(seq) >= n else seq
        f.output_ids = seq[n:] + [0]
        f.fill_ids = seq
        f.committed = len(seq)
        f.extend_range.end = len(seq)

    def _adopt(self) -> None:
        """Read back what SGLang decided: the request's row, its locked node, its protected prefix
        (`cache_protected_len` from 0.5.6 on, len(prefix_indices) before)."""
        r, f = self.req, self.fake
        r["slots"] = [int(x) for x in self.r2t.req_to_token[0, :len(r["seq"])].tolist()]
        r["node"] = f.last_node
        r["protected"] = int(f.cache_protected_len) if self.protected_len else len(f.prefix_indices)

    def _cache_unfinished(self) -> None:
        self._sync_fake()
        self.cache.cache_unfinished_req(self.fake)
        self._adopt()

    def close(self) -> None:
        self._sync_fake()
        self.clock += 1
        self.cache.cache_finished_req(self.fake)
        self.req = self.fake = None
        self.outcome = None
        self._enforce()

    def _enforce(self) -> None:
        """Full budget: evict(full over); SWA pool: half the budget's tokens (tombstones)."""
        self.shown_budget = self.budget
        limit = self.budget // 4
        over = self.cached() - limit
        swa_over = self.swa_cached() - limit // 2
        if over > 0 or swa_over > 0:
            before = {k for k, _, _ in self.nodes()}
            self.api.evict(self.cache, max(over, 0), max(swa_over, 0))
            after = {k for k, _, _ in self.nodes()}
            self.victims += sorted(before - after, key=len, reverse=True)

    def swa_cached(self) -> int:
        return sum(len(n.value) for _, _, n in self.nodes()
                   if n is not self.cache.root_node and not getattr(n, "swa_tombstone", False))

    def view(self):
        from targets.sglang.swa_view import view_of
        return view_of(self)

