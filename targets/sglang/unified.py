"""SGLang 0.5.23's `UnifiedRadixCache` with its Full and Mamba components behind the target interface,
driven through its own request calls: `match_prefix(MatchPrefixParams(key, req, cow_mamba=True))`,
`lock`, `checkpoint(req, up_to)` after every prefill chunk and at the finish, `free_kv_row`, `unlock`,
`on_release`, and `evict(EvictParams(num_tokens, mamba_num))` for a budget.

What is SGLang's and what is ours:
- the cache is SGLang's, built from `CacheInitParams(tree_components=(FULL, MAMBA),
  tree_core_backend="python")`: the pure-Python tree core. The default Rust core (a compiled extension
  shipped in the wheel) does not expose its tree (`root_node` raises NotImplementedError), so the view
  could not read it; both cores implement the same interface and components;
- its components read the process's runtime context (mamba chunk size, exec flags): a context is built
  from `ServerArgs(model_path="dummy")` with SGLang's own `create_context` and made current with
  `use_context` around every call into the cache (`Ctx`);
- the KV allocator and the mamba state pool are targets.sglang.mamba's tagging ones; the request table is
  a subclass of SGLang's `HybridReqToTokenPool` (the Mamba component asserts that class) over MambaRows;
- the tree is read through `NodeView`s (key, value = the Full component's slots, mamba_value = the
  Mamba component's slot, children, parent, last_access_time) kept one per tree node, so the views of
  targets.sglang.mamba_view / view.py read it unchanged.
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace

from targets.sglang.engine import KeyCalls
from targets.sglang.mamba import PER_STATE, SPARE, MambaRows, MambaTagPool, MambaTarget, ReqToToken, kv_alloc_class
from targets.sglang.rules_unified import NOT_APPLICABLE, RULES


class NodeView:
    """One tree node as targets.sglang.view reads it."""

    def __init__(self, t, node):
        self.t, self.node = t, node

    @property
    def key(self):
        return self.node.key if self.node.key is not None else []

    @property
    def value(self):
        v = self.node.component_data[self.t.api.FULL].value
        return v if hasattr(v, "tolist") else self.t.api.tensor(v or [])

    @property
    def mamba_value(self):
        return self.node.component_data[self.t.api.MAMBA].value

    @property
    def children(self):
        return {k: self.t.view_node(c) for k, c in self.node.children.items()}

    @property
    def parent(self):
        return None if self.node.parent is None else self.t.view_node(self.node.parent)

    @property
    def last_access_time(self):
        return self.node.last_access_time


class UnifiedApi(KeyCalls):
    """sglang.srt.mem_cache.unified_radix_cache and what building it takes."""

    def __init__(self, engine_api, where: str):
        from targets.sglang import stubs
        stubs.install()
        try:
            m = lambda n: importlib.import_module(f"sglang.srt.{n}")
            self.mod = m("mem_cache.unified_radix_cache")
            ct = m("mem_cache.unified_cache.component_type").ComponentType
            self.HybridReqToTokenPool = m("mem_cache.memory_pool").HybridReqToTokenPool
            self.Alloc = m("mem_cache.allocator").TokenToKVPoolAllocator
            rc, sa = m("runtime_context"), m("server_args")
            args = sa.ServerArgs(model_path="dummy", skip_tokenizer_init=True)
            args._mamba_cache_chunk_size = 64
            self.context, self.use_context = rc.create_context(args, role="scheduler"), rc.use_context
        finally:
            stubs.settle()
        bp = engine_api.bp
        self.MatchPrefixParams, self.EvictParams = bp.MatchPrefixParams, bp.EvictParams
        self.RadixKey, self.CacheInitParams = engine_api.RadixKey, engine_api.CacheInitParams
        self.FULL, self.MAMBA, self.where = ct.FULL, ct.MAMBA, where


    def rows(self, api, pool):
        base = self.HybridReqToTokenPool

        class Rows(MambaRows, ReqToToken, base):
            def __init__(self):
                ReqToToken.__init__(self, api)
                self.attach(pool)

            def free(self, req) -> None:          # 0.5.23: the row only (release_kv_cache's last call)
                pass

        return Rows()

    def make(self, alloc, rows):
        with self.use_context(self.context):
            return self.mod.UnifiedRadixCache(self.CacheInitParams(
                disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=alloc, page_size=1,
                tree_components=(self.FULL, self.MAMBA), tree_core_backend="python"))


def load_unified(src=None) -> UnifiedApi:
    from targets.sglang import engine
    api = engine.load(src)
    engine.load_module("unified_radix_cache", src)
    return UnifiedApi(api, api.where)


class CacheView:
    """The cache as the views read it: `root_node` is the root's NodeView; the rest is the cache's."""

    def __init__(self, t, cache):
        self._t, self._cache = t, cache

    @property
    def root_node(self):
        return self._t.root

    def __getattr__(self, item):
        return getattr(self._cache, item)


class FakeReq(SimpleNamespace):
    """The request fields UnifiedRadixCache's calls read (`kv` is the request's kv record)."""

    def finished(self) -> bool:
        return self.done

    def get_fill_ids(self):
        return self.full_untruncated_fill_ids


class KvRecord(SimpleNamespace):
    """The request's kv record as the cache and SGLang's window helpers read it: per component, the
    position below which the request's own slots were released (`get/set_evicted_seqlen`), the lowest
    position it may release itself (above its tree-owned prefix and `swa_evict_floor`), `holds_kv`."""

    def get_evicted_seqlen(self, component) -> int:
        return self.evicted.get(component, 0)

    def set_evicted_seqlen(self, component, n: int) -> None:
        self.evicted[component] = int(n)

    def swa_dead_lo(self, page_size: int) -> int:
        return max(self.cache_protected_len, self.swa_evict_floor)      # page size 1

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None


class UnifiedTarget(MambaTarget):
    name = "sglang-unified"
    RULES = RULES
    NOT_APPLICABLE = NOT_APPLICABLE
    has_mamba = True

    def reset(self, budget: int = 1 << 40, chunk: int | None = None, **_config):
        self.chunk = chunk or self.chunk
        self.alloc = kv_alloc_class(self.api.Alloc)(tensor=self.api.tensor)
        self.mpool = MambaTagPool(min(1 << 10, budget // 4 // PER_STATE + SPARE), tensor=self.api.tensor)
        self.r2t = self.api.rows(self.api, self.mpool)
        self.views: dict = {}
        self.releases_window = False
        self.cache = CacheView(self, self.api.make(self.alloc, self.r2t))
        self.budget = self.shown_budget = budget
        self.req = self.fake = self.outcome = None
        self.clock = 0
        self.victims: list = []
        self.used: dict = {}

    def call(self, f, *a, **kw):
        with self.api.use_context(self.api.context):
            return f(*a, **kw)

    # ------------------------------------------------------------------ reading the tree
    def view_node(self, node) -> NodeView:
        v = self.views.get(node.id)
        if v is None or v.node is not node:
            v = self.views[node.id] = NodeView(self, node)
        return v

    @property
    def root(self):
        return self.view_node(self.cache.tree_core.root_node)


    def nodes(self):
        out, stack = [], [((), self.root)]
        while stack:
            keys, n = stack.pop()
            out.append((keys, len(keys) - len(self.api.tokens(n.key)) if keys else 0, n))
            for c in n.children.values():
                stack.append((keys + tuple(self.api.tokens(c.key)), c))
        return out

    def path_of(self, node) -> list:
        chain = []
        while node is not None and node.node is not self.cache.tree_core.root_node:
            chain.append(node)
            node = node.parent
        return chain[::-1]

    def counted(self) -> int:
        tc = self.cache.tree_core
        return int(tc.component_evictable_size_[self.api.FULL]) + int(tc.component_protected_size_[self.api.FULL])

    def mamba_counted(self) -> int:
        tc = self.cache.tree_core
        return int(tc.component_evictable_size_[self.api.MAMBA]) + int(tc.component_protected_size_[self.api.MAMBA])

    def mamba_nodes(self) -> list:
        return [n for _, _, n in self.nodes() if n.node is not self.cache.tree_core.root_node
                and n.mamba_value is not None]

    def _node(self, node_id):
        return self.view_node(self.cache.tree_core.node_by_id(node_id) if isinstance(node_id, int) else node_id)

    # ------------------------------------------------------------------ operations
    def begin(self, keys, spans=()) -> tuple:
        if spans:
            raise ValueError("sglang target: non-causal media spans are not modelled")
        keys = tuple(int(k) for k in keys)
        self.clock += 1
        matched = self._longest(keys)
        kv = KvRecord(req_pool_idx=0, cache_protected_len=0, cache_inserted_len=0, mamba_pool_idx=None,
                      holds_mamba=False, mamba_cow_src_index=None, mamba_needs_clear=True,
                      mamba_last_track_seqlen=None, mamba_prev_track_seqlen=None, swa_evict_floor=0, evicted={})
        f = self.fake = FakeReq(rid="r", kv=kv, origin_input_ids=list(keys), output_ids=[], done=False,
                                full_untruncated_fill_ids=[], extra_key=None, cache_salt=None, priority=None,
                                session_id=None, session=None, kv_rotation_base=None, finished_reason=None, lock=None,
                                last_node=None, swa_branching_seqlen=None)
        self.r2t.req = kv
        res = self.call(self.cache.match_prefix, self.api.MatchPrefixParams(
            key=self.api.RadixKey(list(keys[:-1])), req=f, cow_mamba=True))
        f.last_node = res.last_device_node
        f.swa_branching_seqlen = getattr(res, "swa_branching_seqlen", None)     # match_prefix_for_req's copy
        n = int(res.device_prefix_len)
        slots = [int(x) for x in self.call(self.cache.path_device_indices, f.last_node)[:n].tolist()]
        f.lock = self.call(self.cache.lock, f.last_node)
        if self.has_mamba:
            self._state_for(kv)
        kv.cache_protected_len = len(slots)
        self.r2t.req_to_token[0, :len(slots)] = self.api.tensor(slots)
        node = self._node(f.last_node)
        self.req = {"keys": keys, "seq": list(keys[:len(slots)]), "slots": slots, "node": node,
                    "protected": len(slots), "resume": len(slots), "matched": matched, "prefilled": False,
                    "chunks": []}
        self.outcome = (matched, len(slots))
        return self.outcome

    def _state_for(self, kv) -> None:
        """alloc_req_slots' mamba part: the request's state slot, and the deferred copy on write."""
        if kv.mamba_pool_idx is None:                     # alloc_req_slots: a fresh (zero) state
            if not self.mpool.available_size():
                self.call(self.cache.evict, self.api.EvictParams(num_tokens=0, mamba_num=1))
            kv.mamba_pool_idx = self.mpool.alloc(1)[0]
            self.mpool.tags[int(kv.mamba_pool_idx)] = ()
        kv.holds_mamba = True
        if kv.mamba_cow_src_index is not None:            # the forward stream's deferred copy on write
            self.mpool.copy_from(kv.mamba_cow_src_index, self.api.tensor([int(kv.mamba_pool_idx)]))
            kv.mamba_cow_src_index = None

    def _forward(self, keys) -> None:
        r = self.req
        p = len(r["seq"])
        r["seq"].extend(int(k) for k in keys)
        r["slots"].extend(self.alloc.alloc_for(tuple(r["seq"]), p, len(r["seq"])).tolist())
        self.r2t.req_to_token[0, :len(r["slots"])] = self.api.tensor(r["slots"])
        if self.has_mamba:
            self.mpool.tags[int(self.fake.kv.mamba_pool_idx)] = tuple(r["seq"])

    def _checkpoint(self, up_to: int) -> None:
        r, f = self.req, self.fake
        f.full_untruncated_fill_ids = list(r["seq"])
        self.call(self.cache.checkpoint, f, up_to=up_to)
        r["slots"] = [int(x) for x in self.r2t.req_to_token[0, :len(r["seq"])].tolist()]
        r["node"], r["protected"] = self._node(f.last_node), int(f.kv.cache_protected_len)

    def _cache_unfinished(self) -> None:
        self._checkpoint(len(self.req["seq"]))

    def close(self) -> None:
        f, n = self.fake, len(self.req["seq"])
        f.done = True
        f.output_ids = list(self.req["seq"][len(self.req["keys"]):])
        self._checkpoint(n)
        self.call(self.cache.free_kv_row, f.kv, [(int(f.kv.cache_protected_len), n)])
        self.call(self.cache.unlock, f.lock)
        f.lock = None
        self.call(self.cache.on_release, f, checkpointed=True)
        self.req = self.fake = self.r2t.req = None
        self.clock += 1
        self.outcome = None
        self._enforce()

    def _enforce(self, states: bool = False) -> None:
        """As MambaTarget._enforce."""
        self.shown_budget = self.budget
        limit = self.budget // 4
        over = self.cached() - limit
        m_over = len(self.mamba_nodes()) - limit // PER_STATE if states else 0
        if over > 0 or m_over > 0:
            before = {k for k, _, _ in self.nodes()}
            self.call(self.cache.evict, self.api.EvictParams(num_tokens=max(over, 0), mamba_num=max(m_over, 0)))
            after = {k for k, _, _ in self.nodes()}
            self.victims += sorted(before - after, key=len, reverse=True)
