"""SGLang's full-attention RadixCache driven through its own request calls (`--cache req`),
optionally with EAGLE bigram keys (`--eagle`) and page sizes > 1.

Unlike targets.sglang.target (which re-expresses the scheduler's insert/free steps), every tree
operation of a request here goes through SGLang's own code, as its scheduler calls it, one request at
a time:
  begin     `match_prefix(prompt[:-1])`, `inc_lock_ref(last node)`; the request's `prefix_indices`,
            `last_node` and protected length (`last_matched_prefix_len` before 0.5.6,
            `cache_protected_len` from 0.5.6 on) set as `Req.init_next_round_input` sets them;
  prefill   chunks of `chunk` positions (rounded up to whole pages: the scheduler's PrefillAdder
            truncates a chunk to a page multiple); after a chunk that ends on a page boundary,
            `cache_unfinished_req(req)`; the driver then reads back the request's row, `last_node`
            and protected length (what SGLang decided);
  step      one tagged slot (a decode step; the first one evaluates the prompt's last token,
            which SGLang's last prefill chunk does);
  close     (an unfinished prompt completed first: the scheduler finishes a request only after its
            prefill) `cache_finished_req(req)`, with `fill_ids` = the prompt tokens evaluated (the scheduler
            sets fill_ids at prefill and leaves it during decode), `origin_input_ids + output_ids`
            = the evaluated tokens plus the sampled one, `pop_committed_kv_cache()` = the evaluated
            count; then the budget (`evict`).
With `eagle`, the cache is built with `is_eagle=True` (0.5.3 on): its keys are bigrams (t[i], t[i+1])
and a node's slot i holds the KV of position i. The view then speaks SGLang's own key alphabet: a
view key is a bigram (encoded as one int), a node's path is its bigram path, a slot's content is
the bigram at its position when the slot was written for that path's tokens [0, i] (else a marker),
and the request's evaluated sequence and live content are its bigrams (one fewer than its tokens:
the last evaluated position waits for its successor); its keys are the prompt's bigrams and, last,
(t[n-1], 0) (0 is no token: the prompt's last successor is unknown). The rules the bigram design changes
are listed in rules.EAGLE.

The request object is targets.sglang.swa.FakeReq; the row table is swa.ReqToToken; the KV pool is
targets.sglang.pool.TagAllocator (SGLang's RadixCache only calls free / free_segment on it).
"""
from __future__ import annotations

import inspect
from types import SimpleNamespace

from targets.sglang.pool import TagAllocator
from targets.sglang.rules import EAGLE, NOT_APPLICABLE, PAGED, RULES
from targets.sglang.swa import FakeReq, ReqToToken
from targets.sglang.target import SglangTarget


BASE = 1000         # a bigram (a, b) is the view key a * BASE + b (tokens are small ints)


def vkey(k) -> int:
    """A node key element as a view key: a token, or a bigram (t[i], t[i+1]) encoded as one key."""
    if isinstance(k, tuple):
        a, b = int(k[0]), int(k[1])
        assert 0 <= a < BASE and 0 <= b < BASE, f"token out of the bigram encoding's range: {k}"
        return a * BASE + b
    return int(k)


def bigrams(tokens) -> list:
    return [vkey((a, b)) for a, b in zip(tokens, tokens[1:])]


class ReqTarget(SglangTarget):
    name = "sglang-req"

    def __init__(self, api=None, page_size: int = 1, eagle: bool = False, chunk: int = 8):
        self.eagle = eagle
        super().__init__(api, chunk=chunk, page_size=page_size)
        off = {**(PAGED if page_size > 1 else {}), **(EAGLE if eagle else {})}
        self.RULES = frozenset(RULES) - set(off)
        self.NOT_APPLICABLE = {**NOT_APPLICABLE, **off}
        if eagle:
            self.name = "sglang-req-eagle"

    def reset(self, budget: int = 1 << 40, chunk: int | None = None, **_config):
        self.chunk = chunk or self.chunk
        self.alloc = TagAllocator(tensor=self.api.tensor)
        self.r2t = getattr(self.api, "req_to_token", ReqToToken)(self.api)
        self.cache = make_cache(self.api, self.alloc, self.r2t, self.page_size, self.eagle)
        if not hasattr(self.cache, "cache_unfinished_req"):
            raise ValueError("this sglang's RadixCache has no cache_unfinished_req / cache_finished_req "
                             "(0.5.23 replaced them with checkpoint); use --cache full")
        src = inspect.getsource(type(self.cache).cache_unfinished_req)
        self.protected_field = "cache_protected_len" if "cache_protected_len" in src else \
            "last_matched_prefix_len" if "last_matched_prefix_len" in src else None
        self.budget = self.shown_budget = budget
        self.req = self.fake = self.outcome = None
        self.clock = 0
        self.victims: list = []
        self.used: dict = {}

    # ------------------------------------------------------------------ reading the tree
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

    # ------------------------------------------------------------------ operations
    def begin(self, keys, spans=()) -> tuple:
        if spans:
            raise ValueError("sglang target: non-causal media spans are not modelled")
        keys = tuple(int(k) for k in keys)
        self.clock += 1
        from spec.trie import common_prefix
        rk = bigrams(keys) if self.eagle else list(keys)
        matched = min(max([0] + [common_prefix(k, rk) for k, _, _ in self.nodes()]), len(rk) - 1)
        node = self.api.match(self.cache, keys[:-1])
        slots = self.slots_of(node)
        self.cache.inc_lock_ref(node)
        self.r2t.req_to_token[0, :len(slots)] = self.api.tensor(slots)
        m = len(slots)
        self.fake = FakeReq(rid="r", req_pool_idx=0, origin_input_ids=list(keys), output_ids=[],
                            fill_ids=list(keys), prefix_indices=self.api.tensor(slots), last_node=node,
                            extra_key=None, cache_salt=None, priority=0, cache_protected_len=m,
                            last_matched_prefix_len=m, committed=0, swa_evicted_seqlen=0,
                            extend_range=SimpleNamespace(end=0))
        self.fake.kv = self.fake
        self.req = {"keys": keys, "seq": list(keys[:m]), "slots": slots, "node": node, "protected": m,
                    "resume": m, "matched": matched, "prefilled": False, "chunks": []}
        self.outcome = (matched, m)
        return self.outcome

    def view(self):
        from spec.view import View
        from targets.sglang.view import view_dict
        d = view_dict(self)
        if self.eagle:
            to_bigrams(self, d)
        return View.from_dict(d)

    def prefill(self, max_chunks: int | None = None) -> bool:
        r = self.req
        end = len(r["keys"]) - 1
        ps = self.page_size
        chunk = -(-self.chunk // ps) * ps
        done = 0
        while len(r["seq"]) < end:
            if max_chunks is not None and done >= max_chunks:
                self.outcome = (False,)
                return False
            p = len(r["seq"])
            q = min(end, p + chunk)
            self._forward(r["keys"][p:q])
            r["chunks"].append((p, q))
            if q % ps == 0:                  # SGLang cuts a chunk only on a page boundary
                self._cache_unfinished()
            done += 1
        r["prefilled"] = True
        self.outcome = (True,)
        return True

    def _forward(self, keys) -> None:
        super()._forward(keys)
        r = self.req
        self.r2t.req_to_token[0, :len(r["slots"])] = self.api.tensor(r["slots"])

    def _sync_fake(self, closing: bool = False) -> None:
        r, f = self.req, self.fake
        seq, n = list(r["seq"]), len(r["keys"])
        f.origin_input_ids = seq[:n]
        f.output_ids = seq[n:] + [0]                 # the evaluated tokens + the one just sampled
        f.fill_ids = seq[:n] if closing else seq     # at close: what the last prefill chunk filled
        f.committed = len(seq)
        f.extend_range.end = len(seq)

    def _cache_unfinished(self) -> None:
        self._sync_fake()
        fn = self.cache.cache_unfinished_req
        fn(self.fake, chunked=True) if "chunked" in inspect.signature(fn).parameters else fn(self.fake)
        r, f = self.req, self.fake
        r["slots"] = [int(x) for x in self.r2t.req_to_token[0, :len(r["seq"])].tolist()]
        r["node"] = f.last_node
        r["protected"] = int(getattr(f, self.protected_field)) if self.protected_field else len(f.prefix_indices)

    def close(self) -> None:
        """A request the scheduler admitted runs its whole prompt before it can finish (an abort takes
        effect at its first output): an unfinished prefill is completed, and the prompt's last token
        evaluated, before cache_finished_req."""
        r = self.req
        if len(r["seq"]) < len(r["keys"]):
            self.prefill()
            self._forward(r["keys"][len(r["seq"]):])
        self._sync_fake(closing=True)
        self.clock += 1
        self.cache.cache_finished_req(self.fake)
        self.req = self.fake = None
        self.outcome = None
        self._enforce()


def make_cache(api, alloc, r2t, page_size: int, eagle: bool):
    """RadixCache with the request table (its cache_*_req read it) and, with `eagle`, bigram keys."""
    RC = api.RadixCache
    sig = inspect.signature(RC.__init__).parameters
    extra = {"is_eagle": True} if eagle else {}
    if api.CacheInitParams is not None and "params" in sig:
        if eagle and "is_eagle" not in inspect.signature(api.CacheInitParams).parameters:
            raise ValueError("this sglang's CacheInitParams has no is_eagle (EAGLE bigram keys came in 0.5.3)")
        return RC(api.CacheInitParams(disable=False, req_to_token_pool=r2t, token_to_kv_pool_allocator=alloc,
                                      page_size=page_size, **extra))
    if eagle and "is_eagle" not in sig:
        raise ValueError("this sglang's RadixCache has no is_eagle (EAGLE bigram keys came in 0.5.3)")
    return RC(req_to_token_pool=r2t, token_to_kv_pool_allocator=alloc, page_size=page_size, disable=False,
              **extra)


def to_bigrams(t, d: dict) -> None:
    """Rewrite targets.sglang.view's dict into the bigram alphabet (see the module doc): a slot's
    content is the bigram at its position when it is allocated and was written for exactly the
    tokens [0, i] its path (or the request) stands for, else a marker; the request's fields become
    its bigrams over the tokens it knows (the prompt, then the evaluated ones)."""
    a = t.alloc

    def content(slot, i, key, toks):
        return key if slot in a.allocated and a.tags.get(slot) == tuple(toks[:i + 1]) else ("stale", slot)

    for (keys, start, node), n in zip(t.nodes(), d["nodes"]):
        toks = [k // BASE for k in keys]
        for sn in n["snaps"]:
            slots = [int(x) for x in node.value.tolist()]
            sn["content"] = [content(s, start + i, keys[start + i], toks) for i, s in enumerate(slots)]
    r = t.req
    if r is None:
        return
    seq = list(r["seq"])
    known = seq if len(seq) > len(r["keys"]) else list(r["keys"])
    off = min(len(seq), len(known) - 1)
    bs = bigrams(known)
    d["seq"], d["offset"] = bs[:off], off
    d["live"] = [[content(r["slots"][i], i, bs[i], known) for i in range(off)]]
    q = d["request"]
    q["keys"] = bigrams(list(r["keys"])) + [vkey((r["keys"][-1], 0))]     # last: successor unknown (0)
    q["chunks"] = [[min(p, off), min(e, off)] for p, e in q["chunks"]]
