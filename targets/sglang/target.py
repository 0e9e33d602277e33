"""SglangTarget: SGLang's RadixCache behind the target interface of targets/base.py.

The operations map onto the cache calls SGLang's scheduler makes for one request at a time
(ScheduleBatch / the tree cache's cache_unfinished_req and cache_finished_req, or checkpoint in
0.5.23), with a TagAllocator (targets.sglang.pool) standing for the KV pool:

  begin(keys)     match_prefix(keys[:-1]) (the scheduler always leaves the last prompt token to
                  evaluate); the matched slots are read off the path root -> last node;
                  inc_lock_ref(last node). Returns (matched, resume): matched = the longest common
                  prefix with the tree before the call (capped at len - 1), resume = the match length
  prefill(n)      chunks of `chunk` positions up to len(keys) - 1: alloc tagged slots; after each
                  chunk the chunked-prefill insert (cache_unfinished_req): insert(prefix, slots),
                  free the request's slots the tree already held [protected, prefix_len), match
                  again, adopt the tree's slots, move the lock to the new last node
  step(key)       one tagged slot at the live offset (the first step evaluates the prompt's last key)
  close()         cache_finished_req: insert(evaluated keys, slots), free the duplicates,
                  dec_lock_ref(last node); then the budget is enforced
  set_budget(b)   the pool's room for cached tokens: evict(cached - b // UNIT) when over; while a
                  request is open the change waits for its close (locked KV cannot be freed)
  view()          targets.sglang.view.view_of

`cache_factory(api, allocator)` builds the cache (default: SGLang's RadixCache); the CI fixture
passes a fake with a planted fault through the same code.

Invariants: the driver only calls the cache's public methods (engine.Api); it reads the tree
(children, key, value, lock_ref, last_access_time) for the view and never writes it.
"""
from __future__ import annotations

from spec.trie import common_prefix
from targets.sglang.pool import TagAllocator
from targets.sglang.rules import NOT_APPLICABLE, RULES
from targets.sglang.view import UNIT, view_of      # UNIT: bytes the view counts per cached token


class SglangTarget:
    name = "sglang"
    RULES = RULES
    NOT_APPLICABLE = NOT_APPLICABLE

    def __init__(self, api=None, cache_factory=None, chunk: int = 8, page_size: int = 1):
        self.api = api
        self.cache_factory = cache_factory
        self.chunk = chunk
        self.page_size = page_size
        if page_size > 1:             # a resume floors to a page boundary by design (see rules.PAGED)
            from targets.sglang.rules import PAGED
            self.RULES = frozenset(self.RULES) - set(PAGED)
            self.NOT_APPLICABLE = {**NOT_APPLICABLE, **PAGED}
        self.merges: list = []
        self.outcome = None
        self.reset()

    # ------------------------------------------------------------------ life cycle
    def reset(self, budget: int = 1 << 40, chunk: int | None = None, **_config):
        self.chunk = chunk or self.chunk
        self.alloc = TagAllocator(tensor=self.api.tensor)
        make = self.cache_factory or (lambda api, a: api.make(a, page_size=self.page_size))
        self.cache = make(self.api, self.alloc)
        self.budget = self.shown_budget = budget
        self.req = None
        self.outcome = None
        self.clock = 0
        self.victims: list = []
        self.used: dict = {}          # node -> newest last-use clock of its subtree so far (view.py)

    def shutdown(self) -> None:
        pass

    # ------------------------------------------------------------------ reading the tree
    def nodes(self):
        """(key path, start, node) for every node, root first (read-only walk)."""
        out, stack = [], [((), self.cache.root_node)]
        while stack:
            keys, n = stack.pop()
            out.append((keys, len(keys) - len(self.api.tokens(n.key)) if keys else 0, n))
            for c in n.children.values():
                stack.append((keys + tuple(self.api.tokens(c.key)), c))
        return out

    def path_of(self, node) -> list:
        chain = []
        while node is not None and node is not self.cache.root_node:
            chain.append(node)
            node = node.parent
        return chain[::-1]

    def keys_of(self, node) -> tuple:
        return tuple(k for n in self.path_of(node) for k in self.api.tokens(n.key))

    def slots_of(self, node) -> list:
        return [int(s) for n in self.path_of(node) for s in n.value.tolist()]

    def counted(self) -> int:
        """The tokens SGLang's own counters say the tree holds."""
        return int(self.cache.evictable_size_) + int(self.cache.protected_size_)

    def cached(self) -> int:
        return sum(len(n.value) for _, _, n in self.nodes() if n is not self.cache.root_node)

    # ------------------------------------------------------------------ operations
    def begin(self, keys, spans=()) -> tuple:
        if spans:
            raise ValueError("sglang target: non-causal media spans are not modelled")
        keys = tuple(int(k) for k in keys)
        self.clock += 1
        tree = [k for k, _, _ in self.nodes()]
        common = max([0] + [common_prefix(k, keys) for k in tree])
        matched = min(common, len(keys) - 1)
        node = self.api.match(self.cache, keys[:-1])
        slots = self.slots_of(node)
        self.cache.inc_lock_ref(node)
        self.req = {"keys": keys, "seq": list(keys[:len(slots)]), "slots": slots, "node": node,
                    "protected": len(slots), "resume": len(slots), "matched": matched, "prefilled": False,
                    "chunks": []}
        self.outcome = (matched, len(slots))
        return self.outcome

    def prefill(self, max_chunks: int | None = None) -> bool:
        r = self.req
        end = len(r["keys"]) - 1
        done = 0
        while len(r["seq"]) < end:
            if max_chunks is not None and done >= max_chunks:
                self.outcome = (False,)
                return False
            p = len(r["seq"])
            q = min(end, p + self.chunk)
            self._forward(r["keys"][p:q])
            r["chunks"].append((p, q))
            self._cache_unfinished()
            done += 1
        r["prefilled"] = True
        self.outcome = (True,)
        return True

    def step(self, key: int) -> None:
        self._forward([int(key)])

    def close(self) -> None:
        r, self.req = self.req, None
        self.clock += 1
        n = len(r["seq"]) // self.page_size * self.page_size      # the tree takes whole pages only
        slots = self.api.tensor(r["slots"])
        if n:
            prefix_len = self.api.insert(self.cache, r["seq"][:n], slots[:n])
            self.alloc.free(slots[r["protected"]:prefix_len])
        if len(r["slots"]) > max(n, r["protected"]):
            self.alloc.free(slots[max(n, r["protected"]):])
        self.cache.dec_lock_ref(r["node"])
        self.outcome = None
        self._enforce()

    def set_budget(self, budget: int) -> None:
        """The scheduler frees tree memory only while no running request locks it: a change made
        while a request is open takes effect at its close."""
        self.budget = budget
        if self.req is None:
            self._enforce()

    # ------------------------------------------------------------------ helpers
    def _forward(self, keys) -> None:
        r = self.req
        p = len(r["seq"])
        r["seq"].extend(int(k) for k in keys)
        r["slots"].extend(self.alloc.alloc_for(tuple(r["seq"]), p, len(r["seq"])).tolist())

    def _cache_unfinished(self) -> None:
        """The chunked-prefill insert: the tree takes the evaluated prefix; the request adopts the
        tree's slots for it and moves its lock to the new last node."""
        r = self.req
        n = len(r["seq"]) // self.page_size * self.page_size
        if n <= r["protected"]:
            return
        slots = self.api.tensor(r["slots"])
        prefix_len = self.api.insert(self.cache, r["seq"][:n], slots[:n])
        self.alloc.free(slots[r["protected"]:prefix_len])
        node = self.api.match(self.cache, r["seq"][:n])
        new = self.slots_of(node)
        r["slots"][r["protected"]:len(new)] = new[r["protected"]:]
        self.cache.dec_lock_ref(r["node"])
        self.cache.inc_lock_ref(node)
        r["node"], r["protected"] = node, len(new)

    def _enforce(self) -> None:
        self.shown_budget = self.budget
        limit = self.budget // UNIT
        over = self.cached() - limit
        if over > 0:
            before = {k for k, _, _ in self.nodes()}
            self.api.evict(self.cache, over)
            after = {k for k, _, _ in self.nodes()}
            self.victims += sorted(before - after, key=len, reverse=True)

    def view(self):
        return view_of(self)
