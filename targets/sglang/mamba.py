"""SGLang's Mamba radix cache (`MambaRadixCache`, 0.5.6 - 0.5.20) behind the target interface, driven
through its own `match_prefix(cow_mamba)` / `cache_unfinished_req` / `cache_finished_req`.

What is SGLang's and what is ours:
- the cache is SGLang's `MambaRadixCache`, built from `CacheInitParams` (page size 1, no extra buffer:
  the "v1" mode its constructor asserts for page size 1); every tree operation of a request goes through
  SGLang: `match_prefix(key, req=req, cow_mamba=True)` at admission (the scheduler's
  `Req.init_next_round_input`), `inc_lock_ref` on the matched node, `cache_unfinished_req(req)` after
  every prefill chunk, `cache_finished_req(req)` at close, `evict` (full tokens, mamba states) for a budget;
- the KV allocator is a TagAllocator that is an instance of SGLang's `TokenToKVPoolAllocator` (the
  constructor asserts that class); the mamba state pool is `MambaTagPool`: each state slot is tagged with
  the token prefix whose state it holds. It answers the calls the cache makes across releases
  (`alloc`, `free`, `fork_from`, `copy_from` as `mamba_pool` / `mamba_allocator`), and the request-side
  table `HybridRows` those of `HybridReqToTokenPool` (`req_to_token`, `write`, `free(idx, free_mamba_cache)`,
  `free_mamba_cache(req)`, `get_mamba_indices`, `translate_mamba_indices`);
- the forward is ours: a forward of tokens sets the request's state slot's tag to the evaluated prefix;
  a copy-on-write SGLang deferred to the forward stream (`mamba_cow_src_index`, 0.5.15 on) is done at
  admission, as the forward would before the first kernel.

Call shapes that changed (MatchPrefixParams / keyword arguments, EvictParams / evict + evict_mamba,
`kv_len_to_handle` / `pop_committed_kv_cache`, `req.kv`) are probed, never keyed on a version.
"""
from __future__ import annotations

import inspect
from types import SimpleNamespace

from targets.sglang.engine import KeyCalls
from targets.sglang.pool import TagAllocator
from targets.sglang.rules_mamba import NOT_APPLICABLE, RULES
from targets.sglang.swa import FakeReq, ReqToToken, SwaTarget, _ints

CHUNK = 64          # mamba_cache_chunk_size (server args): only the extra-buffer mode uses it
PER_STATE = 16      # budget tokens per cached state (the state pool's share of the budget)
SPARE = 3           # state slots beyond the budget's: the open request's own, its copy on write and one chunk
                    # fork; past them SGLang evicts states itself (_alloc_mamba_slot, the match's copy on
                    # write), as under a full pool


class MambaApi(KeyCalls):
    """SGLang's MambaRadixCache module, with the call shapes probed."""

    def __init__(self, mod, bp, cip, where: str):
        self.mod, self.where = mod, where
        self.Cache = mod.MambaRadixCache
        self.Alloc = mod.TokenToKVPoolAllocator
        self.RadixKey = getattr(mod, "RadixKey", None)
        self.params = {n: getattr(bp, n, None) for n in ("MatchPrefixParams", "EvictParams")}
        self.CacheInitParams = cip


    def make(self, alloc, rows):
        if "get_global_server_args" in vars(self.mod):       # 0.5.10 - 0.5.15 read it in __init__ / match
            import sys
            sa = sys.modules["sglang.srt.server_args"]
            sa.set_global_server_args_for_scheduler(SimpleNamespace(mamba_cache_chunk_size=CHUNK))
        return self.Cache(self.CacheInitParams(disable=False, req_to_token_pool=rows,
                                               token_to_kv_pool_allocator=alloc, page_size=1))

    def match(self, cache, tokens, req):
        """(slot indices served, last node); the request gets the matched state (copy on write)."""
        P = self.params["MatchPrefixParams"]
        k = self.key(tokens)
        r = cache.match_prefix(P(key=k, req=req, cow_mamba=True)) if P else \
            cache.match_prefix(key=k, req=req, cow_mamba=True)
        return [int(x) for x in r[0].tolist()], r[1]

    def evict(self, cache, full: int, mamba: int) -> None:
        P = self.params["EvictParams"]
        if P:
            cache.evict(P(num_tokens=full, mamba_num=mamba))
            return
        if full:
            cache.evict(full)
        if mamba:
            cache.evict_mamba(mamba)

    def finish(self, cache, req) -> None:
        if "kv_len_to_handle" in inspect.signature(cache.cache_finished_req).parameters:
            cache.cache_finished_req(req, kv_len_to_handle=req.committed)
        else:
            cache.cache_finished_req(req)


def load_mamba(src=None) -> MambaApi:
    from targets.sglang import engine
    api = engine.load(src)
    mod = engine.load_module("mamba_radix_cache", src)
    return MambaApi(mod, api.bp, api.CacheInitParams, api.where)


class MambaTagPool:
    """Mamba state slots that hold tags (the token prefix whose state the slot holds), with the calls
    SGLang's mamba pool and allocator take. Freeing a free slot is recorded (A2), never raised."""

    def __init__(self, size: int = 1 << 10, tensor=list):
        self.tensor = tensor
        self.free_slots = list(range(size - 1, -1, -1))
        self.allocated: set = set()
        self.tags: dict = {}
        self.double_frees: list = []
        self.replayssm_write_pos = None              # no ReplaySSM ring: the state is current

    def available_size(self) -> int:
        return len(self.free_slots)

    def schedulable_available_size(self) -> int:       # 0.5.23's evict_for_alloc (a static pool: the same)
        return len(self.free_slots)

    def alloc(self, n: int = 1):
        if n > len(self.free_slots):
            return None
        out = [self.free_slots.pop() for _ in range(n)]
        for s in out:
            self.allocated.add(s)
            self.tags[s] = None                      # allocated, nothing written yet
        return self.tensor(out)

    def free(self, index) -> None:
        for s in _ints(index):
            if s not in self.allocated:
                self.double_frees.append(s)
                continue
            self.allocated.discard(s)
            self.free_slots.append(s)

    def copy_from(self, src, dst) -> None:
        for a, b in zip(_ints(src), _ints(dst)):
            self.tags[b] = self.tags.get(a) if a in self.allocated else ("stale", a)

    def fork_from(self, src):
        out = self.alloc(len(_ints(src)))
        if out is not None:
            self.copy_from(src, out)
        return out

    def content(self, slot: int):
        """The prefix whose state `slot` holds, or a marker when the slot is free or unwritten."""
        t = self.tags.get(slot)
        if slot not in self.allocated or t is None or (t and t[0] == "stale"):
            return None
        return t


class MambaRows:
    """The mamba side of SGLang's HybridReqToTokenPool for one request (mixed into a request-to-token
    table: HybridRows here, the fixture's list-backed one in CI)."""

    def attach(self, pool: MambaTagPool):
        self.mamba_pool = self.mamba_allocator = pool
        self.req = None                                   # the open FakeReq
        return self

    def get_mamba_indices(self, req_pool_idx):
        return self.api.tensor([int(self.req.mamba_pool_idx)])[0]

    def translate_mamba_indices(self, x):
        return x

    def free(self, req_pool_idx, free_mamba_cache: bool = True) -> None:
        if free_mamba_cache:
            self.free_mamba_cache(self.req)

    def free_mamba_cache(self, req, mamba_ping_pong_track_buffer_to_keep=None) -> None:
        kv = getattr(req, "kv", req)                      # 0.5.20 on: the request's kv record
        if kv.mamba_pool_idx is not None:
            self.mamba_pool.free(self.api.tensor([int(kv.mamba_pool_idx)]))
            kv.mamba_pool_idx = None
            kv.holds_mamba = False


class HybridRows(MambaRows, ReqToToken):
    def __init__(self, api, pool: MambaTagPool, width: int = 4096):
        ReqToToken.__init__(self, api, width)
        self.attach(pool)


def kv_alloc_class(base):
    """A tagging KV allocator that is an instance of SGLang's TokenToKVPoolAllocator (`base`)."""
    return type("KvTagPool", (TagAllocator, base), {"__init__": TagAllocator.__init__})


class MambaTarget(SwaTarget):
    """SwaTarget's request driving (FakeReq, the row, cache_*_req, read-back), with a mamba state pool
    instead of SWA slots and no window."""
    name = "sglang-mamba"
    RULES = RULES
    NOT_APPLICABLE = NOT_APPLICABLE

    def __init__(self, api=None, chunk: int = 8):
        super().__init__(api, window=0, chunk=chunk)

    def reset(self, budget: int = 1 << 40, chunk: int | None = None, **_config):
        self.chunk = chunk or self.chunk
        self.alloc = kv_alloc_class(self.api.Alloc)(tensor=self.api.tensor)
        self.mpool = MambaTagPool(min(1 << 10, budget // 4 // PER_STATE + SPARE), tensor=self.api.tensor)
        self.r2t = getattr(self.api, "rows", HybridRows)(self.api, self.mpool)
        self.cache = self.api.make(self.alloc, self.r2t)
        src = inspect.getsource(type(self.cache).cache_unfinished_req)
        self.protected_len = "cache_protected_len" in src
        self.releases_window = False
        self.decodes = 0
        self.budget = self.shown_budget = budget
        self.req = self.fake = self.outcome = None
        self.clock = 0
        self.victims: list = []
        self.used: dict = {}

    def counted(self) -> int:
        return int(self.cache.full_evictable_size_) + int(self.cache.full_protected_size_)

    def mamba_counted(self) -> int:
        return int(self.cache.mamba_evictable_size_) + int(self.cache.mamba_protected_size_)

    def mamba_nodes(self) -> list:
        return [n for _, _, n in self.nodes() if n is not self.cache.root_node and n.mamba_value is not None]

    # ------------------------------------------------------------------ operations
    def begin(self, keys, spans=()) -> tuple:
        if spans:
            raise ValueError("sglang target: non-causal media spans are not modelled")
        keys = tuple(int(k) for k in keys)
        self.clock += 1
        matched = self._longest(keys)
        f = self.fake = FakeReq(rid="r", req_pool_idx=0, origin_input_ids=list(keys), output_ids=[], fill_ids=[],
                                prefix_indices=self.api.tensor([]), last_node=None, extra_key=None,
                                cache_salt=None, session=None, cache_protected_len=0, committed=0, mamba_pool_idx=None,
                                holds_mamba=False, mamba_cow_src_index=None, mamba_needs_clear=True,
                                mamba_last_track_seqlen=None, extend_range=SimpleNamespace(end=0))
        f.kv = f
        self.r2t.req = f
        slots, node = self.api.match(self.cache, keys[:-1], f)
        self.cache.inc_lock_ref(node)
        if f.mamba_pool_idx is None:                      # alloc_req_slots: a fresh (zero) state
            if not self.mpool.available_size():           # the scheduler makes room first (evict mamba)
                self.api.evict(self.cache, 0, 1)
            f.mamba_pool_idx = self.mpool.alloc(1)[0]
            self.mpool.tags[int(f.mamba_pool_idx)] = ()
        f.holds_mamba = True
        if f.mamba_cow_src_index is not None:             # the forward stream's deferred copy on write
            self.mpool.copy_from(f.mamba_cow_src_index, self.api.tensor([int(f.mamba_pool_idx)]))
            f.mamba_cow_src_index = None
        f.prefix_indices = self.api.tensor(slots)
        f.last_node, f.cache_protected_len = node, len(slots)
        self.r2t.req_to_token[0, :len(slots)] = self.api.tensor(slots)
        self.decodes = 0
        self.req = {"keys": keys, "seq": list(keys[:len(slots)]), "slots": slots, "node": node,
                    "protected": len(slots), "resume": len(slots), "matched": matched, "prefilled": False,
                    "chunks": []}
        self.outcome = (matched, len(slots))
        return self.outcome

    def _forward(self, keys) -> None:
        super()._forward(keys)
        self.mpool.tags[int(self.fake.mamba_pool_idx)] = tuple(self.req["seq"])

    def close(self) -> None:
        self._sync_fake()
        self.clock += 1
        self.api.finish(self.cache, self.fake)
        self.req = self.fake = self.r2t.req = None
        self.outcome = None
        self._enforce()

    def set_budget(self, budget: int) -> None:
        """Both pools are brought to the budget at rest; a change made while a request is open waits for
        its close (its locked path can be freed of neither)."""
        self.budget = budget
        if self.req is None:
            self._enforce(states=True)

    def _enforce(self, states: bool = False) -> None:
        """Full budget: evict(full over); with `states` (a set_budget at rest) also the mamba states, one per
        PER_STATE budget tokens (tombstones are made). Not at close: SGLang evicts when it next needs room,
        never inside the finish, and a state evicted in the very operation that splits its node would
        read to S4 as a split moving whole-state (a state count is not in E1's bytes either)."""
        self.shown_budget = self.budget
        limit = self.budget // 4
        over = self.cached() - limit
        m_over = len(self.mamba_nodes()) - limit // PER_STATE if states else 0
        if over > 0 or m_over > 0:
            before = {k for k, _, _ in self.nodes()}
            self.api.evict(self.cache, max(over, 0), max(m_over, 0))
            after = {k for k, _, _ in self.nodes()}
            self.victims += sorted(before - after, key=len, reverse=True)

    def swa_cached(self) -> int:
        return 0

    def view(self):
        from targets.sglang.mamba_view import view_of
        return view_of(self)
