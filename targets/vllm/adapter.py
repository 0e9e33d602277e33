"""VllmTarget: vLLM's KVCacheManager (with its coordinator, single-type managers and BlockPool)
behind the target interface of targets/base.py, driven as vLLM's scheduler drives it, one request
at a time, with no model: the adapter plays the forward by *tagging* what each block would hold.

Operations (tokens; the view speaks in blocks, see targets.vllm.view):
  reset(budget, layout, chunk)  a fresh manager for the layout's groups (engine.LAYOUTS) over a pool
                                of POOL blocks; set_budget(budget)
  begin(keys)                   Request(keys) with vLLM's block hasher; get_computed_blocks (the
                                lookup); allocate_slots(request, first chunk, hit, hit blocks) -- the
                                scheduler admits a request and schedules its first chunk in one step,
                                so nothing can evict the hit in between; the chunk is computed
  prefill(max_chunks)           further chunks: allocate_slots(request, chunk) each, computed; the
                                prompt's last token is in the last chunk (vLLM prefills it)
  step(key)                     the seed: nothing (prefill computed it); later keys: the request's
                                output token, appended and computed by allocate_slots(request, 1 +
                                drafts, num_lookahead_tokens=LOOKAHEAD) on "-spec" layouts, whose
                                draft tokens are then all rejected (num_computed_tokens rolls back)
  close()                       free(request)
  set_budget(b)                 blocks pinned (BlockPool.get_new_blocks) so that budget_blocks(b)
                                stay free for the prefix cache -- memory pressure as other requests
                                make it; eviction is vLLM's own (popping the free queue)
Computing tokens [p, q) of a request writes, for every group, a tag per position into the block
the request holds there (sliding window, full attention), and for a Mamba group the prefix
keys[:q] into the block at (q - 1) // BLOCK (align mode keeps the state in the block of the last
computed token); draft positions are tagged with the draft tokens. Tags are never cleared: a block
handed out again keeps its old tags until written, so serving unwritten or stale blocks shows.

A request the pool cannot take (allocate_slots returns None) is refused: freed at once, as a
scheduler that cannot admit it would leave it waiting; `refused` counts them.

Invariants: vLLM's objects are only called and read, never patched; `outcome` is what the last
operation returned (begin: (matched, resume) in blocks; prefill: (done,)); `engine` may be the
fake of targets.vllm.fake (CI), driven by the same code.
"""
from __future__ import annotations

from targets.vllm.engine import BLOCK, load, window_blocks
from targets.vllm.rules import NOT_APPLICABLE, RULES

POOL = 192                 # blocks in the pool
LOOKAHEAD = 2              # draft tokens per decode step on "-spec" layouts
DRAFT = 1000               # draft token ids: DRAFT + key (never a program key)


def wire(key) -> int:
    """A key as a token id: media fold values (>= 2**31) folded into [2**30, 2**31), since token ids are
    int32 in vLLM's buffers (0.34)."""
    key = int(key)
    return key if key < 1 << 31 else (1 << 30) + key % (1 << 30)


def budget_blocks(budget: int) -> int:
    """Free blocks left to the cache under a byte budget (one block = 8 budget units)."""
    return max(64, min(POOL, budget // 8 + 64))


class VllmTarget:
    name = "vllm"

    NOT_APPLICABLE = NOT_APPLICABLE

    @staticmethod
    def wire(key) -> int:
        return wire(key)

    @property
    def RULES(self):                     # noqa: N802 -- the target interface's name
        """The -eagle layouts drop the last matched block by design: C2 is not judged there."""
        return RULES - {"C2"} if getattr(self, "layout", "").endswith("-eagle") else RULES

    def __init__(self, engine=None, src: str | None = None):
        self.engine = engine if engine is not None else load(src)
        self.outcome = None
        self.merges = ()
        self.refused = 0
        self.reset()

    # ------------------------------------------------------------------ life cycle
    def reset(self, budget: int = 1 << 40, layout: str = "full", chunk: int = 8, **_):
        self.layout, self.chunk = layout, max(BLOCK, chunk - chunk % BLOCK)
        self.kinds = self.engine.kinds(layout)
        self.spec_decode = layout.endswith("-spec")
        self.m = self.engine.manager(layout, POOL)
        self.tags: dict = {}          # block id -> {position: key}
        self.mtags: dict = {}         # block id -> the token prefix whose state it holds (Mamba)
        self.paths: dict = {}         # block hash -> the token prefix it names
        self.last: dict = {}          # token prefix (a block end) -> clock of its last use (hit, compute, free)
        self.clock = 0
        self.nreq = 0
        self.ids: dict = {}           # token tuple (a block's) -> the view's key for it
        self.req = None               # the open request's state (dict) or None
        self.ballast = []
        self.outcome = None
        self.set_budget(budget)
        self.outcome = None

    def shutdown(self) -> None:
        pass

    # ------------------------------------------------------------------ helpers
    def _write(self, rid, tokens, p, q):
        """Play the forward over positions [p, q) holding `tokens` (token p first)."""
        blocks = self.engine.req_blocks(self.m, rid)
        for g, kind in enumerate(self.kinds):
            ids = blocks[g]
            if kind == "mamba":
                i = (q - 1) // BLOCK
                if i < len(ids) and ids[i]:
                    self.mtags[ids[i]] = self._prefix(q)
                continue
            for pos in range(p, q):
                i = pos // BLOCK
                if i < len(ids) and ids[i]:
                    self.tags.setdefault(ids[i], {})[pos] = tokens[pos - p]

    def _prefix(self, q):
        return tuple(self.req["all"][:q])

    def _record_hashes(self):
        r = self.req
        seq = r["all"]
        for i, h in enumerate(self.engine.block_hashes(r["request"])):
            self.paths.setdefault(h, tuple(seq[:(i + 1) * BLOCK]))

    def _touch(self, n_tokens):
        r = self.req
        for e in range(BLOCK, n_tokens - n_tokens % BLOCK + 1, BLOCK):
            self.last[tuple(r["all"][:e])] = self.clock

    def _new_step(self):
        """The scheduler's step boundary: vLLM's scheduler tells the manager a step starts (Mamba
        refuses, within one step, a hit on a block cached in that same step)."""
        hook = getattr(self.m, "new_step_starts", None)
        if hook is not None:
            hook()

    def _alloc(self, n_new, hit=0, hit_blocks=None, lookahead=0):
        r = self.req
        if hit_blocks is None:
            self._new_step()
        kw = {}
        if hit_blocks is not None:
            kw = dict(num_new_computed_tokens=hit, new_computed_blocks=hit_blocks)
        if lookahead:
            kw["num_lookahead_tokens"] = lookahead
        return self.m.allocate_slots(r["request"], n_new, **kw)

    def _refuse(self):
        self.refused += 1
        self.m.free(self.req["request"])
        self.req["refused"] = True

    def _chunk(self, hit_blocks=None, hit=0) -> bool:
        """Schedule and compute the next prefill chunk; False if the pool refused it."""
        r = self.req
        req = r["request"]
        p = req.num_computed_tokens + hit
        q = min(len(r["keys"]), p + self.chunk)
        if self._alloc(q - p, hit, hit_blocks) is None:
            self._refuse()
            return False
        self._write(r["id"], r["keys"][p:q], p, q)
        req.num_computed_tokens = q
        r["chunks"].append((p, q))
        self._record_hashes()
        return True

    # ------------------------------------------------------------------ operations
    def begin(self, keys, spans=()) -> tuple:
        assert self.req is None, "begin while a request is open"
        keys = [wire(k) for k in keys]
        self.clock += 1
        self.nreq += 1
        rid = f"r{self.nreq}"
        request = self.engine.request(rid, keys)
        self.req = dict(id=rid, keys=keys, all=list(keys), request=request, chunks=[], seeded=False,
                        refused=False, prefilled=False)
        self._new_step()
        got = self.m.get_computed_blocks(request)
        blocks, hit = got[0], got[1]
        boundary = got[2] if len(got) > 2 else 0
        served = [list(g) for g in blocks.get_block_ids()]
        self.req.update(hit=hit, served=[[b for b in g] for g in served], boundary=boundary,
                        live=self._live(served, hit))
        self._record_hashes()
        self._touch(hit)
        matched = max(hit, boundary) // BLOCK
        self.outcome = self.outcome_begin = (matched, hit // BLOCK)
        if hit < len(keys):
            self._chunk(blocks, hit)
            self.req["chunks"] = []                     # the admission step's chunk: still "begun"
        if self.req["refused"]:
            self.outcome = None                         # not admitted: the lookup restored nothing
        return self.outcome

    def _live(self, served, hit) -> list:
        """Per group, what the served blocks hold for positions [0, hit) (state_content's shape)."""
        out = []
        nb = hit // BLOCK
        for g, kind in enumerate(self.kinds):
            ids = served[g] + [0] * max(0, nb - len(served[g]))
            if kind == "full":
                out.append(tuple(tuple(self.tags.get(ids[i], {}).get(i * BLOCK + j) for j in range(BLOCK))
                                 if ids[i] else None for i in range(nb)))
            elif kind == "swa":
                wb = window_blocks()
                out.append(tuple(tuple(self.tags.get(ids[i], {}).get(i * BLOCK + j) for j in range(BLOCK))
                                 if ids[i] else None for i in range(max(0, nb - wb), nb)))
            else:
                out.append(("state", self.mtags.get(ids[nb - 1])) if nb else ("state", ()))
        return out

    def prefill(self, max_chunks: int | None = None) -> bool:
        r = self.req
        done = 0
        while not r["refused"] and r["request"].num_computed_tokens < len(r["keys"]):
            if max_chunks is not None and done >= max_chunks:
                break
            if not self._chunk():
                break
            done += 1
        r["prefilled"] = not r["refused"] and r["request"].num_computed_tokens >= len(r["keys"])
        self.outcome = (r["prefilled"],)
        return r["prefilled"]

    def step(self, key: int) -> None:
        r = self.req
        self.outcome = None
        if r["refused"]:
            return
        if not r["seeded"]:
            r["seeded"] = True                          # the last prompt token: computed by prefill
            return
        req = r["request"]
        req.append_output_token_ids(int(key))
        r["all"].append(int(key))
        drafts = [DRAFT + int(key) + i for i in range(LOOKAHEAD)] if self.spec_decode else []
        req.spec_token_ids = list(drafts)
        p = req.num_computed_tokens
        if self._alloc(1 + len(drafts), lookahead=LOOKAHEAD if drafts else 0) is None:
            req.spec_token_ids = []
            self._refuse()
            return
        self._write(r["id"], [int(key)] + drafts, p, p + 1 + len(drafts))
        req.num_computed_tokens = p + 1
        req.spec_token_ids = []
        self._record_hashes()

    def close(self) -> None:
        r = self.req
        self.clock += 1
        if not r["refused"]:
            self._record_hashes()
            self._touch(r["request"].num_computed_tokens)
            self.m.free(r["request"])
        self.req = None
        self.outcome = None

    def set_budget(self, budget: int) -> None:
        pool = self.m.block_pool
        want_pinned = POOL - 1 - budget_blocks(budget)
        if len(self.ballast) > want_pinned:
            give = self.ballast[want_pinned:]
            self.ballast = self.ballast[:want_pinned]
            pool.free_blocks(give)
        elif len(self.ballast) < want_pinned:
            n = min(want_pinned - len(self.ballast), pool.get_num_free_blocks())
            if n > 0:
                self.ballast += list(pool.get_new_blocks(n))
        self.budget = budget
        self.outcome = None

    # ------------------------------------------------------------------ view
    def view(self):
        from targets.vllm.view import view_of
        return view_of(self)

