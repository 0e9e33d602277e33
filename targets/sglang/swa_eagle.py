"""SGLang's SWARadixCache with EAGLE bigram keys and page sizes > 1 (`--cache swa --eagle`,
`--cache swa --page-size N`): targets.sglang.swa's SwaTarget, with what those two settings change in
how the scheduler calls the cache.

- the cache is built with `page_size` and, with `eagle`, `is_eagle=True` (0.5.4 on for SWA);
- prefill chunks end on page boundaries only, and `cache_unfinished_req` follows a chunk only there
  (the scheduler's PrefillAdder truncates a chunk to a page multiple); a request finishes only
  after its whole prompt ran (targets.sglang.reqcalls.ReqTarget's prefill and close);
- the request carries `last_matched_prefix_len` (0.5.4 / 0.5.5's name of the protected length) and
  the driver reads the protected length back from whichever field the release's calls use;
- with `eagle` the tree's keys are bigrams: the view's node paths are SGLang's bigram keys
  (reqcalls.vkey) and only the rules that do not read KV content in the token alphabet are judged
  (rules_swa.EAGLE_RULES: slot ownership A2, counters A1, T1 and eviction E1, E2, E4); the content
  rules are judged with token keys (no --eagle).
"""
from __future__ import annotations

import inspect

from targets.sglang.reqcalls import ReqTarget, vkey
from targets.sglang.rules_swa import EAGLE_NOT_APPLICABLE, EAGLE_RULES, NOT_APPLICABLE, RULES
from targets.sglang.rules import PAGED
from targets.sglang.swa import ReqToToken, SwaTarget, WINDOW, pool_class


class SwaPagedTarget(SwaTarget):
    name = "sglang-swa-paged"

    def __init__(self, api=None, window: int = WINDOW, chunk: int = 8, page_size: int = 1, eagle: bool = False):
        self.eagle = eagle
        self._page = page_size
        super().__init__(api, window=window, chunk=chunk)
        self.page_size = page_size
        if eagle:
            self.RULES, self.NOT_APPLICABLE = EAGLE_RULES, EAGLE_NOT_APPLICABLE
        elif page_size > 1:
            self.RULES = frozenset(RULES) - set(PAGED)
            self.NOT_APPLICABLE = {**NOT_APPLICABLE, **{r: PAGED[r] for r in PAGED if r in RULES}}

    def reset(self, budget: int = 1 << 40, chunk: int | None = None, **_config):
        super().reset(budget=budget, chunk=chunk)
        self.alloc = pool_class(self.api.Alloc)(tensor=self.api.tensor)
        self.r2t = getattr(self.api, "req_to_token", ReqToToken)(self.api)
        self.cache = make(self.api, self.alloc, self.r2t, self.window, self._page, self.eagle)
        src = inspect.getsource(type(self.cache).cache_unfinished_req)
        self.protected_field = "cache_protected_len" if "cache_protected_len" in src else \
            "last_matched_prefix_len" if "last_matched_prefix_len" in src else None

    # ---- the tree in SGLang's own key alphabet (bigrams with eagle)
    def nodes(self):
        out, stack = [], [((), self.cache.root_node)]
        while stack:
            keys, n = stack.pop()
            out.append((keys, len(keys) - len(n.value) if keys else 0, n))
            for c in n.children.values():
                stack.append((keys + tuple(vkey(k) for k in c.key), c))
        return out

    def keys_of(self, node) -> tuple:
        return tuple(vkey(k) for n in self.path_of(node) for k in n.key)

    def begin(self, keys, spans=()) -> tuple:
        out = super().begin(keys, spans)
        self.fake.last_matched_prefix_len = self.req["protected"]
        return out

    def prefill(self, max_chunks: int | None = None) -> bool:
        return ReqTarget.prefill(self, max_chunks)

    def _adopt(self) -> None:
        super()._adopt()
        if self.protected_field:
            self.req["protected"] = int(getattr(self.fake, self.protected_field))

    def close(self) -> None:
        r = self.req
        if len(r["seq"]) < len(r["keys"]):
            self.prefill()
            self._forward(r["keys"][len(r["seq"]):])
        super().close()


def make(api, alloc, r2t, window: int, page_size: int, eagle: bool):
    sig = inspect.signature(api.Cache.__init__).parameters
    extra = {"is_eagle": True} if eagle else {}
    if "params" in sig:
        if eagle and "is_eagle" not in inspect.signature(api.CacheInitParams).parameters:
            raise ValueError("this sglang's CacheInitParams has no is_eagle")
        fields = dict(disable=False, req_to_token_pool=r2t, token_to_kv_pool_allocator=alloc, page_size=page_size,
                      **extra)
        if "sliding_window_size" in sig:
            return api.Cache(api.CacheInitParams(**fields), sliding_window_size=window)
        return api.Cache(api.CacheInitParams(**fields, sliding_window_size=window))
    if eagle and "is_eagle" not in sig:
        raise ValueError("this sglang's SWARadixCache has no is_eagle (EAGLE bigram keys came to it in 0.5.4)")
    return api.Cache(req_to_token_pool=r2t, token_to_kv_pool_allocator=alloc, sliding_window_size=window,
                     page_size=page_size, disable=False, **extra)
