"""SGLang 0.5.23's `UnifiedRadixCache` with its SWA component: Full + SWA (`--cache unified --swa`) and
Full + SWA + Mamba (`--cache unified --swa --mamba`), driven as targets.sglang.unified drives Full + Mamba.

What is SGLang's and what is ours:
- the cache is SGLang's, `CacheInitParams(tree_components=(FULL, SWA[, MAMBA]), sliding_window_size=W,
  tree_core_backend="python")`; every tree operation of a request goes through its own calls:
  `match_prefix(MatchPrefixParams(key, req[, cow_mamba]))` (its SWA match validator: a node ends a match
  only with W live SWA tokens since the last tombstone), `lock`, `checkpoint(req, up_to)` per chunk and at
  the finish (inserts, tombstone recovery, `free_out_of_window_slots` during chunked prefill),
  `free_kv_row` (SGLang splits the row into SWA-dead and SWA-live segments), `unlock`, `on_release`,
  `evict(EvictParams(num_tokens, swa_num_tokens[, mamba_num]))`;
- the scheduler's window slide (`ScheduleBatch.maybe_evict_swa` -> the cache's own
  `evict_sliding_windows(req, seqlen - 1)`) is called before every decode step after the first (the
  scheduler's cadence is SGLANG_SWA_EVICTION_INTERVAL; SGLang's helper gates itself);
- the allocator is `SwaTagPool` (targets.sglang.swa) made an instance of 0.5.23's
  `allocator.swa.SWATokenToKVPoolAllocator` (the component asserts it), with the calls 0.5.23 adds
  (`translate_*_to_swa`, `set_full_to_swa_mapping`) and its contract that `free` / `free_swa*` are
  only for slots with a mapped SWA peer: a violation is recorded as an SWA slot released twice (A2);
- the request's kv record is targets.sglang.unified.KvRecord (evicted seqlens per component, dead_lo).

The view is targets.sglang.swa_view's windowed layer over the unified tree's node views (tombstone =
the SWA component's value is None; a node's own SWA indices are compared with the pool's mapping), plus
targets.sglang.mamba_view's recurrent layer with the Mamba component.
"""
from __future__ import annotations

import importlib

from spec.view import View

from targets.sglang.mamba import PER_STATE, SPARE, MambaTagPool
from targets.sglang.swa import _ints, pool_class
from targets.sglang.rules_unified_swa import NOT_APPLICABLE, RULES
from targets.sglang.unified import CacheView, NodeView, UnifiedApi, UnifiedTarget

WINDOW = 4


class SwaNodeView(NodeView):
    @property
    def swa_value(self):
        return self.node.component_data[self.t.api.SWA].value

    @property
    def swa_tombstone(self) -> bool:
        return self.swa_value is None


def unified_pool_class(base):
    class UnifiedSwaPool(pool_class(base)):
        def __init__(self, size: int = 1 << 12, tensor=list):
            super().__init__(size, tensor=tensor)
            self.unmapped_frees: list = []

        def translate_loc_from_full_to_swa(self, kv_indices):
            return self.tensor([self.mapping.get(s, 0) for s in _ints(kv_indices)])

        translate_swa_indices_for_transfer = translate_loc_from_full_to_swa

        def set_full_to_swa_mapping(self, full_indices, swa_indices) -> None:
            for f, w in zip(_ints(full_indices), _ints(swa_indices)):
                self.mapping[f] = w

        @property
        def full_attn_allocator(self):
            return _FullSide(self)

        def free_swa(self, free_index) -> None:
            for s in _ints(free_index):
                if not self.mapping.get(s, 0):
                    self.unmapped_frees.append(s)          # 0.5.23: expect(swa.peer_mapped), FATAL
            super().free_swa(free_index)

    return UnifiedSwaPool


class _FullSide:
    """The pool's full-attention side (`full_attn_allocator`: the Full component frees through it)."""

    def __init__(self, pool):
        self.pool = pool

    def free_segment(self, free_index, *, start_pos: int = 0) -> None:
        self.pool.free_full(free_index)

    free = free_segment

    def available_size(self) -> int:
        return self.pool.full_available_size()


class UnifiedSwaApi(UnifiedApi):
    def __init__(self, engine_api, where: str, mamba: bool = False):
        super().__init__(engine_api, where)
        ct = importlib.import_module("sglang.srt.mem_cache.unified_cache.component_type").ComponentType
        self.SWA, self.mamba = ct.SWA, mamba
        self.Pool = unified_pool_class(importlib.import_module("sglang.srt.mem_cache.allocator.swa")
                                       .SWATokenToKVPoolAllocator)

    def make(self, alloc, rows, window: int = WINDOW):
        comps = (self.FULL, self.SWA) + ((self.MAMBA,) if self.mamba else ())
        with self.use_context(self.context):
            return self.mod.UnifiedRadixCache(self.CacheInitParams(
                disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=alloc, page_size=1,
                sliding_window_size=window, tree_components=comps, tree_core_backend="python"))

    def evict(self, cache, full: int, swa: int, mamba: int = 0) -> None:
        with self.use_context(self.context):
            cache.evict(self.EvictParams(num_tokens=full, swa_num_tokens=swa, mamba_num=mamba))


def load_unified_swa(src=None, mamba: bool = False) -> UnifiedSwaApi:
    from targets.sglang import engine
    api = engine.load(src)
    engine.load_module("unified_radix_cache", src)
    return UnifiedSwaApi(api, api.where, mamba)


class UnifiedSwaTarget(UnifiedTarget):
    name = "sglang-unified-swa"
    RULES = RULES
    NOT_APPLICABLE = NOT_APPLICABLE

    def __init__(self, api=None, chunk: int = 8, window: int = WINDOW):
        self.has_mamba, self.W = bool(api.mamba), window
        super().__init__(api, chunk=chunk)

    def reset(self, budget: int = 1 << 40, chunk: int | None = None, **_config):
        self.chunk = chunk or self.chunk
        self.window = self.W
        self.alloc = self.api.Pool(tensor=self.api.tensor)
        self.mpool = MambaTagPool(min(1 << 10, budget // 4 // PER_STATE + SPARE), tensor=self.api.tensor)
        self.r2t = self.api.rows(self.api, self.mpool)
        self.views: dict = {}
        self.releases_window = True
        self.cache = CacheView(self, self.api.make(self.alloc, self.r2t, self.window))
        self.budget = self.shown_budget = budget
        self.req = self.fake = self.outcome = None
        self.clock = self.decodes = 0
        self.victims: list = []
        self.used: dict = {}

    def view_node(self, node) -> SwaNodeView:
        v = self.views.get(node.id)
        if v is None or v.node is not node:
            v = self.views[node.id] = SwaNodeView(self, node)
        return v

    def swa_counted(self) -> int:
        tc = self.cache.tree_core
        return int(tc.component_evictable_size_[self.api.SWA]) + int(tc.component_protected_size_[self.api.SWA])

    def swa_cached(self) -> int:
        return sum(len(n.value) for _, _, n in self.nodes() if n.node is not self.cache.tree_core.root_node
                   and not n.swa_tombstone)

    # ------------------------------------------------------------------ operations
    def begin(self, keys, spans=()) -> tuple:
        """With Mamba, room for the request's state slot is made before the match (the scheduler's
        evict_for_alloc): SGLang's match would otherwise evict a state inside the call that may split its
        node, which S4 (judged per operation) reads as the split moving the state off the tail."""
        self.decodes = 0
        if self.has_mamba and not self.mpool.available_size():
            self.api.evict(self.cache, 0, 0, 1)
        return super().begin(keys, spans)

    def step(self, key: int) -> None:
        """A decode step: from the second one on, the scheduler's window slide first; then, before the
        step's slot is allocated, the SWA part of the budget (alloc_for_decode -> evict_to_free_tokens)."""
        self.decodes += 1
        if self.decodes >= 2:
            self.call(self.cache.evict_sliding_windows, self.fake, len(self.req["seq"]) - 1)
        self._swa_pressure()
        super().step(key)

    def _swa_pressure(self) -> None:
        """SWA tokens over half the budget are tombstoned (SGLang's pressure on its SWA pool)."""
        swa_over = self.swa_cached() - self.budget // 4 // 2
        if swa_over > 0:
            self.api.evict(self.cache, 0, swa_over)

    def set_budget(self, budget: int) -> None:
        """At rest: full tokens, SWA tokens to half the budget (tombstones), states. While a request is
        open, the SWA part at once (SGLang tombstones SWA outside the locked window under pressure)."""
        self.budget = budget
        if self.req is None:
            self._enforce(states=True)
            return
        self._swa_pressure()

    def _enforce(self, states: bool = False) -> None:
        """At close (states False) full tokens only; at set_budget also SWA tokens and states. SGLang
        evicts only to allocate (never when a request finishes), and the close's checkpoint may split
        a node: a tombstone (or a state evicted) in the same operation would read, to S4 (judged per
        operation), as the split taking the window off the tail."""
        self.shown_budget = self.budget
        limit = self.budget // 4
        over = self.cached() - limit
        swa_over = self.swa_cached() - limit // 2 if states else 0
        m_over = len(self.mamba_nodes()) - limit // PER_STATE if states and self.has_mamba else 0
        if over > 0 or swa_over > 0 or m_over > 0:
            before = {k for k, _, _ in self.nodes()}
            self.api.evict(self.cache, max(over, 0), max(swa_over, 0), max(m_over, 0))
            after = {k for k, _, _ in self.nodes()}
            self.victims += sorted(before - after, key=len, reverse=True)

    def mamba_nodes(self) -> list:
        return super().mamba_nodes() if self.has_mamba else []

    def view(self):
        from targets.sglang.mamba_view import add_states
        from targets.sglang.swa_view import add_window
        from targets.sglang.view import view_dict
        d = add_window(view_dict(self), self, 1)
        for w in self.alloc.unmapped_frees:
            d["released"] += [("swa peer of", w), ("swa peer of", w)]
        if self.has_mamba:
            add_states(d, self, 2)
        return View.from_dict(d)

