"""The prefix cache: one model's live layer caches, paged in and out of a trie.

Mirrors spec/cache.py verb for verb on real MLX layer caches: begin(keys,
spans, boundaries) -> for each chunk from next_chunk(): the caller runs the
model, then evaluated(keys) -> prefilled() -> decode steps, reported by
evaluated(keys) (each step, or all at once before close) -> close(). This
class does the bookkeeping only.

Invariants kept here (REFERENCE ids; checked after every operation when
`check=True`, through impl.invariants):
  T3  all layer caches rest at one offset; after begin and close the frontier ends there.
  S3  close pages out every stateful layer the frontier is missing.
  M1-M3  no chunk ends, capture lands or resume starts strictly inside a non-causal span.
  P1  a resume strictly inside an edge splits it at the live offset; the head is the touched frontier.
  P2  compaction merges a non-user single-child path node (not root or frontier)
      holding no whole-state snapshot; a checkpoint leaves only by eviction.
  E1-E4  bytes <= budget unless all is protected; only root, frontier and branch
      points are; LRU first (ties deeper, larger, key path); a leaf is removed,
      a one-child node merged into its child.
  A1  no KV row is held twice: owned KV on the active path becomes a view of the live rows.
The A1 and P2 scans of the active path skip the nodes they settled before (impl/settled.py).
Where captures go and chunks end: impl/plan.py; which node eviction takes: impl/eviction.py.
"""
from __future__ import annotations

import time
from bisect import bisect_left, bisect_right

from impl import dump, invariants
from impl.caches.evaluation import deferred_eval
from impl.eviction import Eviction, EvictionOrder
from impl.plan import _chunk_end, _inside, schedule
from impl.request import Request, Stats
from impl.settled import Settled
from impl.trie import Node, Trie, common_prefix, match


class PrefixCache(Eviction):
    def __init__(self, caches, *, budget: int = 1 << 62, interval: int = 0, near_end: int = 4, check: bool = False):
        if budget < 0:
            raise ValueError(f"budget {budget} < 0")
        self.caches = list(caches)
        self._stateful = tuple(i for i, c in enumerate(self.caches) if c is not None)
        self._kv = tuple((i, c) for i, c in enumerate(self.caches) if c is not None and c.kind == "kv")
        self.trie = Trie(self.caches)
        self.budget, self.interval, self.near_end = budget, interval, near_end
        self.check = check
        self.seq: list = []
        self.path: list = [self.trie.root]
        self.order = EvictionOrder(self.trie.changed, self.trie.root)   # E3, kept as the trie changes (eviction.py)
        self.settled = Settled(self.trie.root)                # how far the path scans skip (impl/settled.py)
        self.clock = 0
        self.request: Request | None = None
        self.evictions = 0
        self.victims: list = []       # key paths of the evicted nodes, in order (the rules' Op.evicted),
        self.record_victims = False   # kept under check=True or for a checker that sets this (unbounded)
        self.bookkeeping_s = 0.0      # time spent in this class, for overhead figures

    # ------------------------------------------------------------- basics
    @property
    def root(self) -> Node:
        return self.trie.root

    @property
    def frontier(self) -> Node:
        return self.path[-1]

    @property
    def counter(self) -> int:
        return self.trie.counter

    @property
    def offset(self) -> int:
        offs = {c.offset for c in self.caches if c is not None}
        assert len(offs) <= 1, f"T3: layer caches rest at different offsets {sorted(offs)}"
        return offs.pop() if offs else len(self.seq)

    @property
    def whole_state(self) -> bool:
        return len(self._kv) < len(self._stateful)

    def stateful(self) -> tuple:
        return self._stateful

    def touch(self, node: Node) -> None:
        self.clock += 1
        node.last_used = self.clock
        node.used_at = time.monotonic()

    def _before(self):
        """Under check=True: the view before an operation (impl.invariants)."""
        return invariants.before(self) if self.check else None

    def _checked(self, what: str, before=None, args: tuple = (), outcome=None) -> None:
        if self.check:
            invariants.checked(self, what, before, args, outcome)

    # ------------------------------------------------------------- begin
    def begin(self, keys, spans=(), boundaries=()) -> tuple:
        """Switch the live caches to the longest usable match of `keys`
        (validated by the caller) and schedule captures, also at the message
        `boundaries` (offsets); returns (matched, resume)."""
        if self.request is not None:
            raise ValueError("begin while a request is open: close it first")
        if len(keys) == 0:
            raise ValueError("empty prompt: a request needs at least one key")
        t0, evictions_before = time.perf_counter(), self.evictions
        keys, spans = tuple(keys), sorted(tuple(s) for s in spans)
        before = self._before()
        walked, matched = match(self.root, keys)
        if matched == len(keys):
            matched -= 1                                     # leave the decode seed
        span = _inside(matched, spans)
        if span:
            matched = span[0]                                # M3
        path = [n for n in walked if n.start < matched or n is self.root]
        common = min(common_prefix(self.seq, keys), self.offset)
        resume = self._resume(path, matched, common, spans)
        with deferred_eval():                                # one MLX evaluation for the page-in
            self._restore(path, resume, common)
            self.seq = list(keys[:resume])
            self.path = self._split_at_live(path, resume)
            self.settled.kept(self.path)
            self.touch(self.frontier)
            plan = schedule(len(keys), resume, matched, spans, self.interval, self.near_end, boundaries)
            self.request = Request(keys, spans, matched, resume, plan, evictions_before=evictions_before,
                                   stats=Stats(total=len(keys), matched=matched, resumed=resume))
            offsets = [c for c, _ in plan]
            for c in self.caches:
                if c is not None and offsets:
                    c.prepare_captures(offsets)              # a capture at the resume offset
            self._evict()
        self.bookkeeping_s += time.perf_counter() - t0
        self._checked("begin", before, (keys, tuple(spans), tuple(boundaries)), (matched, resume))
        return matched, resume

    def _split_at_live(self, path: list, resume: int) -> list:
        """P1: the active path up to the live offset; a node whose edge holds
        the offset strictly inside is split there and its head ends the path."""
        kept = [n for n in path if n.end <= resume]
        inside = [n for n in path if n.start < resume < n.end]
        if inside:
            kept.append(self.trie.split(inside[0], resume))
        return kept

    def _source(self, i: int, path: list, x: int, common: int, ends: list):
        """Where whole-state layer i gets its state at x (see spec.cache.source). `ends`: the path's
        node ends, ascending (T1): the search starts at the first node ending at or past x (no state
        restores past its end)."""
        cache = self.caches[i]
        if x == 0:
            return "reset"
        if x <= common and cache.can_restore(None, x):
            return "live"
        for n in path[bisect_left(ends, x, 1):]:
            s = n.snaps[i]
            if s is not None and cache.can_restore(s, x):
                return s
        return None

    def _reachable(self, i: int, path: list, x: int, common: int, ends: list, kv_reach: dict) -> bool:
        if self.caches[i].kind == "kv":
            return x <= kv_reach[i]
        return self._source(i, path, x, common, ends) is not None

    def _kv_reach(self, path: list) -> dict:
        """Per KV layer, the largest offset it reaches along `path`: the start of the first node
        without its snapshot (every node starting before x must hold one), else unbounded."""
        reach = {i: 1 << 62 for i, _ in self._kv}
        missing = set(reach)
        for n in path[1:]:
            if None not in n.snaps:                          # (no layer's missing here: pure attention's case)
                continue
            for i in [i for i in missing if n.snaps[i] is None]:
                reach[i] = n.start
                missing.discard(i)
            if not missing:
                break
        return reach

    def _resume(self, path: list, matched: int, common: int, spans) -> int:
        """The largest x <= matched that every layer can reach and that is not
        strictly inside a non-causal span. Feasible sets are unions of points
        and prefixes [0, b], so the maximum is a point, a bound, or a span start
        (a snapshot's bound is its node's end: S1, S2)."""
        ends = [n.end for n in path]
        kv_reach = self._kv_reach(path)
        cands = {matched, common, self.offset}
        cands.update(ends[1:])
        cands.update(a for a, _ in spans)
        for x in sorted((c for c in cands if c <= matched), reverse=True):
            if _inside(x, spans) is None and all(self._reachable(i, path, x, common, ends, kv_reach) for i in self.stateful()):
                return x
        return 0

    def _restore(self, path: list, x: int, common: int) -> None:
        ends = [n.end for n in path]
        for i in self.stateful():
            cache = self.caches[i]
            if cache.kind == "kv":
                ok = cache.restore(None, min(common, x))
                if cache.offset < x:
                    cache.before_write(x - cache.offset)     # the views the rows below overwrite, in one pass
                    run = path[bisect_right(ends, cache.offset, 1):bisect_left(ends, x, 1) + 1]   # the nodes
                    ok = ok and cache.restore_run([n.snaps[i] for n in run], x)  # from the offset to x
            else:
                src = self._source(i, path, x, common, ends)
                ok = cache.restore(None, 0) if src == "reset" else cache.restore(None if src == "live" else src, x)
            assert ok and cache.offset == x, f"T3: layer {i} could not be restored to {x}"

    # ----------------------------------------------------------- prefill
    def next_chunk(self, chunk: int) -> tuple | None:
        """The next prefill chunk [p, q) (None when only the decode seed is
        left): at most `chunk` keys, cut at scheduled captures when whole-state
        layers need a forward boundary, extended over a non-causal span (M1)."""
        return self.chunk_at(self.offset, chunk)

    def chunk_at(self, p: int, chunk: int) -> tuple | None:
        """The chunk ``next_chunk`` gives once the live offset is p (changes nothing)."""
        t0, req, cut = time.perf_counter(), self.request, None
        target = len(req.keys) - 1
        if p < target:
            q = min(p + chunk, target)
            if self.whole_state:
                q = min([q] + [c for c, _ in req.schedule if c > p])
            cut = (p, _chunk_end(q, req.spans))
        self.bookkeeping_s += time.perf_counter() - t0
        return cut

    def evaluated(self, keys) -> None:
        """The caller ran the model over `keys` at the live offset (several decode
        steps may be reported in one call: nothing reads them before close)."""
        t0 = time.perf_counter()
        self.seq.extend(keys)
        req = self.request
        if req is not None and not req.prefilled:
            req.chunks.append((len(self.seq) - len(keys), len(self.seq)))
            req.stats.prefilled += len(keys)
        self.bookkeeping_s += time.perf_counter() - t0
        if self.check:
            assert self.offset == len(self.seq), f"T3: caches at {self.offset}, {len(self.seq)} keys evaluated"

    def prefilled(self) -> None:
        """Prefill is complete: attach its captures."""
        self.request.prefilled = True
        self.attach()

    # ---------------------------------------------------- attach and close
    def _advance(self, to: int) -> Node:
        f = self.frontier
        keys = tuple(self.seq[f.end:to])
        walked, k = match(f, keys)
        if f.end + k < walked[-1].end:                       # walked[-1] is f when nothing matched
            walked[-1] = self.trie.split(walked[-1], f.end + k)
        self.path += walked[1:]
        if k < len(keys):
            self.path.append(self.trie.append_child(self.frontier, keys[k:]))
        return self.frontier

    def attach(self) -> None:
        """Put each crossed capture on the node ending at its offset, clipped
        to the node's edge; a layer the node already has keeps its snapshot."""
        req = self.request
        if not req.schedule:                                 # (only called with a request open)
            return
        t0, before = time.perf_counter(), self._before()
        with deferred_eval():                                # one MLX evaluation for all layers' captures
            plan, req.schedule = req.schedule, []
            rows = {i: self.caches[i].take_captures() for i in self.stateful()}
            reached = self.offset
            for k, (c, _) in enumerate(plan):
                if c > reached:                              # never crossed (a cancel)
                    for i in rows:
                        if rows[i][k] is not None:
                            rows[i][k].release()
            crossed = [(k, c, user) for k, (c, user) in enumerate(plan) if c <= reached]
            if not crossed:
                return
            for k, c, user in crossed:
                row = {i: rows[i][k] for i in rows}
                node = self._advance(c)
                node.user = node.user or user
                for i, s in row.items():
                    if s is None:
                        continue
                    if node.snaps[i] is not None or (s.kind == "kv" and s.start > node.start):
                        s.release()
                        continue
                    if s.kind == "kv" and s.start < node.start:  # clip to the edge (S1)
                        head, s = self.caches[i].split(s, node.start)
                        head.release()
                    self.trie.own(node, i, s)
                req.stats.captures += 1
                self.touch(node)
                self._adopt_path()
                self._compact()
            self._evict()
        self.bookkeeping_s += time.perf_counter() - t0
        self._checked("attach", before)

    def _page_out(self, node: Node) -> None:
        """S3: capture every stateful layer the node is missing."""
        for i in self.stateful():
            if node.snaps[i] is None:
                self.trie.own(node, i, self.caches[i].snapshot(node.start))

    def close(self) -> Stats:
        if self.request is None:
            raise ValueError("close without an open request")
        before = self._before()
        with deferred_eval():                                # one MLX evaluation: captures, page-out, fit
            self.attach()
            t0, offset = time.perf_counter(), self.offset
            assert offset == len(self.seq), f"T3: caches at {offset}, {len(self.seq)} keys evaluated"
            # (no keys past the frontier: no change)
            self._advance(offset)
            if self.frontier is not self.root:
                self._page_out(self.frontier)
            self._adopt_path()
            self._compact()
            self.touch(self.frontier)
            req, self.request = self.request, None
            self._evict()
            for _, c in self._kv:
                c.fit()                                      # growth slack at rest: bounded (kv.py)
        req.stats.evictions = self.evictions - req.evictions_before
        req.stats.chunks = tuple(req.chunks)
        self.bookkeeping_s += time.perf_counter() - t0
        self._checked("close", before)
        return req.stats

    # ------------------------------------------------ compaction, budget
    def _adopt_path(self) -> None:
        """No row held twice: owned KV on the active path below the offset becomes a view of the live
        rows, which hold the path's tokens (spec adopt_path)."""
        for n in self.path[self.settled.start(self.path, self.settled.adopted):]:
            for i, c in self._kv:
                s = n.snaps[i]
                if s is not None and not s.lazy:             # most are views already
                    c.adopt(s)                               # refuses rows past the offset
        self.settled.adopted = self.settled.after_scan(self.path)

    def _compact(self) -> None:
        """P2: merge each non-user single-child node of the active path that holds no whole-state snapshot."""
        i = self.settled.start(self.path, self.settled.compacted)
        while i < len(self.path) - 1:
            n = self.path[i]
            if not n.user and len(n.children) == 1 and all(s is None or s.kind == "kv" for s in n.snaps):
                self.path.remove(next(iter(n.children.values())))
                self.trie.merge_with_child(n)
            else:
                i += 1
        self.settled.compacted = self.settled.after_scan(self.path)

    def set_budget(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"budget {budget} < 0")
        before = self._before()
        self.budget = budget
        self._evict()
        self._checked("set_budget", before, (budget,))

    # ------------------------------------------------------------ dumps
    def dump(self) -> str:
        """A readable tree: offsets, token count, bytes, flags, age (impl/dump.py)."""
        return dump.text(self)

    def dump_json(self) -> dict:
        """The trie as JSON, for the server's trie endpoint (impl/dump.py)."""
        return dump.as_json(self)
