"""SGLang 0.5.15's `UnifiedRadixCache` (Full + Mamba components), the first release that has it: its
request calls are still `cache_unfinished_req` / `cache_finished_req` with the request's flat fields
(`cache_protected_len`, `mamba_pool_idx`, ...), as MambaRadixCache's, and its tree lives in the cache
itself (`root_node`, `component_evictable_size_`). So `LegacyUnifiedTarget` is targets.sglang.mamba's
MambaTarget (the same FakeReq, pools and request driving) over the unified cache, with the tree read
through targets.sglang.unified's NodeViews. Used by `--cache unified` when the loaded cache has no
`checkpoint` (targets.sglang.hybrid_cli).
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace

from targets.sglang.mamba import MambaApi, MambaRows, MambaTarget, ReqToToken
from targets.sglang.rules_unified import NOT_APPLICABLE, RULES
from targets.sglang.unified import CacheView, NodeView


class LegacyUnifiedApi(MambaApi):
    def __init__(self, engine_api, where: str):
        from targets.sglang import stubs
        stubs.install()
        try:
            m = lambda n: importlib.import_module(f"sglang.srt.{n}")
            mod = m("mem_cache.unified_radix_cache")
            ct = m("mem_cache.unified_cache_components.tree_component").ComponentType
            self.HybridReqToTokenPool = m("mem_cache.memory_pool").HybridReqToTokenPool
            alloc = m("mem_cache.allocator").TokenToKVPoolAllocator
            m("server_args").set_global_server_args_for_scheduler(SimpleNamespace(mamba_cache_chunk_size=64))
        finally:
            stubs.settle()
        self.mod, self.where, self.Cache, self.Alloc = mod, where, mod.UnifiedRadixCache, alloc
        self.RadixKey = engine_api.RadixKey
        self.params = {n: getattr(engine_api.bp, n, None) for n in ("MatchPrefixParams", "EvictParams")}
        self.CacheInitParams = engine_api.CacheInitParams
        self.FULL, self.MAMBA = ct.FULL, ct.MAMBA

    def make(self, alloc, rows):
        return self.Cache(self.CacheInitParams(disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=alloc,
                                               page_size=1, tree_components=(self.FULL, self.MAMBA)))

    def rows(self, api, pool):
        class Rows(MambaRows, ReqToToken, self.HybridReqToTokenPool):
            def __init__(self):
                ReqToToken.__init__(self, api)
                self.attach(pool)

        return Rows()

    def finish(self, cache, req) -> None:
        cache.cache_finished_req(req)


def has_legacy_unified(src=None) -> bool:
    from targets.sglang import engine
    engine.load(src)
    mod = engine.load_module("unified_radix_cache", src)
    return not hasattr(mod.UnifiedRadixCache, "checkpoint")


def load_legacy_unified(src=None) -> LegacyUnifiedApi:
    from targets.sglang import engine
    api = engine.load(src)
    return LegacyUnifiedApi(api, api.where)


class LegacyUnifiedTarget(MambaTarget):
    name = "sglang-unified"
    RULES = RULES
    NOT_APPLICABLE = NOT_APPLICABLE

    def reset(self, budget: int = 1 << 40, chunk: int | None = None, **_config):
        self.views: dict = {}
        super().reset(budget, chunk)
        self.cache = CacheView(self, self.cache)

    # the tree through NodeViews; SGLang gets and returns its own nodes
    def view_node(self, node) -> NodeView:
        v = self.views.get(node.id)
        if v is None or v.node is not node:
            v = self.views[node.id] = NodeView(self, node)
        return v

    @property
    def root(self):
        return self.view_node(self.cache._cache.root_node)

    def path_of(self, node) -> list:
        chain = []
        while node is not None and node.node is not self.cache._cache.root_node:
            chain.append(node)
            node = node.parent
        return chain[::-1]

    def counted(self) -> int:
        c = self.cache._cache
        return int(c.component_evictable_size_[self.api.FULL]) + int(c.component_protected_size_[self.api.FULL])

    def mamba_counted(self) -> int:
        c = self.cache._cache
        return int(c.component_evictable_size_[self.api.MAMBA]) + int(c.component_protected_size_[self.api.MAMBA])

    def begin(self, keys, spans=()) -> tuple:
        out = super().begin(keys, spans)
        self.req["node"] = self.view_node(self.req["node"])
        return out

    def _adopt(self) -> None:
        super()._adopt()
        self.req["node"] = self.view_node(self.req["node"])
