"""The prefix cache's life cycle over the trie (REFERENCE section 2).

One set of live caches (content per layer) rests at `offset`; `path` is the
active path, root first, whose last node is the frontier. A request is
begin -> prefill (chunks, captures) -> decode steps -> close.

Invariants kept here (predicates in spec.rules):
  T3  all layers rest at one offset; after begin and close the frontier ends there.
  S3  close pages out every stateful layer the frontier is missing.
  M1-M3  no chunk ends, capture lands or resume starts strictly inside a
      non-causal item (a match ending inside one resumes at its start).
  P1  a resume strictly inside an edge splits that node at the live offset;
      the head stays on the path (frontier) and is touched.
  P2  compaction merges a non-user single-child path node (not root or
      frontier) holding no whole-state snapshot: a whole-state checkpoint
      leaves only by eviction.
  E1-E4  counter <= budget unless all is protected; only root, frontier and
      branch points are; LRU first, ties deeper, larger, then key path; a leaf
      is removed, a one-child node merges into its child (G2).
  C1  the live content equals a cold prefill of the evaluated keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from spec.media import keys_of, noncausal_spans, resume_floor, validate_request
from spec.plan import next_chunk_end, schedule
from spec.trie import KV, WINDOWED, Broken, Node, Trie, common_prefix, match, state_content
from spec.view import RequestView, View, freeze


@dataclass
class Capture:
    offset: int
    user: bool
    snaps: dict  # layer index -> Snapshot


@dataclass
class Request:
    keys: tuple
    spans: list
    matched: int
    resume: int
    schedule: list
    base: int                     # from-offset of the next KV capture
    pending: list = field(default_factory=list)
    chunks: list = field(default_factory=list)
    prefilled: bool = False


class PrefixCache:
    def __init__(self, layers, budget: int = 1 << 62, interval: int = 0, near_end: int = 4, chunk: int = 8):
        if budget < 0:
            raise ValueError(f"budget {budget} < 0")
        self.layers = tuple(layers)
        self.trie = Trie(self.layers)
        self.budget, self.interval, self.near_end, self.chunk = budget, interval, near_end, chunk
        self.live = [() for _ in self.layers]   # content per layer
        self.offset = 0
        self.seq: list = []                     # keys of the live positions
        self.path = [self.trie.root]
        self.clock = 0
        self.request: Request | None = None
        self.evictions = 0                      # nodes evicted so far (impl reports them per request)
        self.victims: list = []                 # their key paths, in eviction order (spec.view.Op.evicted)

    @property
    def root(self) -> Node:
        return self.trie.root

    @property
    def frontier(self) -> Node:
        return self.path[-1]

    def stateful(self):
        return [i for i, layer in enumerate(self.layers) if layer.stateful]

    def touch(self, node: Node) -> None:
        self.clock += 1
        node.last_used = self.clock

    # ------------------------------------------------------------------ begin
    def begin(self, tokens, media=(), vocab_size: int = 1 << 31, boundaries=()) -> tuple:
        """Switch the live caches to the longest usable match; returns
        (matched, resume). `boundaries`: offsets where messages end (user captures)."""
        if self.request is not None:
            raise ValueError("begin while a request is open: close it first")
        validate_request(tokens, media, vocab_size, boundaries)
        return self.begin_keys(keys_of(tokens, media), noncausal_spans(media), boundaries)

    def begin_keys(self, keys: tuple, spans: list, boundaries=()) -> tuple:
        """begin on a validated key stream, its non-causal spans and message
        boundaries (what a target receives, spec.view.Op)."""
        if self.request is not None:
            raise ValueError("begin while a request is open: close it first")
        keys, spans = tuple(keys), sorted(tuple(s) for s in spans)
        walked, matched = match(self.root, keys)
        if matched == len(keys):
            matched -= 1                          # leave the decode seed
        matched = resume_floor(matched, spans)    # M3
        path = [n for n in walked if n.start < matched or n is self.root]
        common = common_prefix(self.seq, keys)
        resume = next(x for x in range(matched, -1, -1)
                      if not any(p < x < e for p, e in spans)
                      and all(self.reachable(i, path, x, matched, common) for i in self.stateful()))
        self.restore(path, resume, common, keys)
        self.path = [n for n in path if n.end <= resume]
        inside = [n for n in path if n.start < resume < n.end]
        if inside:                                # P1: split at the live offset
            self.path.append(self.trie.split(inside[0], resume))
        self.touch(self.frontier)
        plan = schedule(len(keys), resume, matched, spans, self.interval, self.near_end, tuple(boundaries))
        self.request = Request(keys=keys, spans=spans, matched=matched, resume=resume, schedule=plan, base=resume)
        self.evict()
        return matched, resume

    def source(self, i: int, path: list, x: int, matched: int, common: int):
        """Where whole-state layer i can get its state at offset x: "live"
        (as it is, or rewound inside an unwrapped window), a snapshot on the
        path (at x, or an unwrapped window rewound to x), "reset" at 0, or None."""
        layer = self.layers[i]
        unwrapped = lambda end: layer.kind == WINDOWED and end <= layer.window
        if x == 0:
            return "reset"
        if x <= common and (self.offset == x or unwrapped(self.offset)) and self.offset >= x:
            return "live"
        for n in path[1:]:
            s = n.snaps.get(i)
            if s is not None and (s.end == x or (unwrapped(s.end) and x <= min(s.end, matched))):
                return s
        return None

    def reachable(self, i: int, path: list, x: int, matched: int, common: int) -> bool:
        if self.layers[i].kind == KV:
            return all(i in n.snaps for n in path[1:] if n.start < x)
        return self.source(i, path, x, matched, common) is not None

    def restore(self, path: list, x: int, common: int, keys: tuple) -> None:
        """Page the path in up to offset x. A KV layer writes the rows of
        owned snapshots past the live common prefix (lazy views of the live
        buffer are already in place); writes materialise views they overlap.
        An owned snapshot is written whole, [start, end), and becomes a lazy
        view of those live rows again (no row is held twice)."""
        for i in self.stateful():
            layer = self.layers[i]
            if layer.kind == KV:
                content = ()
                for n in path[1:]:
                    if n.start >= x:
                        break
                    s = n.snaps[i]
                    p, q = max(n.start, common), min(n.end, x)
                    if not s.lazy and p < q:
                        self.trie.materialise(i, p, n.end)
                        self.trie.counter -= s.size(layer)
                        s.lazy = True
                    content += s.content[:q - n.start]
                self.live[i] = content
            else:
                src = self.source(i, path, x, x, common)
                if src == "reset":
                    self.live[i] = ()
                elif src == "live":
                    self.live[i] = self.live[i] if self.offset == x else self.live[i][:x]
                else:
                    self.live[i] = src.content if src.end == x else src.content[:x]
        self.offset = x
        self.seq = list(keys[:x])

    # ---------------------------------------------------------------- prefill
    # The driver's three verbs, as impl has them: next_chunk() names the keys
    # to evaluate, evaluated(keys) runs them at the live offset, prefilled()
    # ends the prefill. prefill() and step() are the operation alphabet of
    # spec.view.Op, built from them.
    def next_chunk(self) -> tuple | None:
        """The next prefill chunk [p, q), or None when only the decode seed is left."""
        req = self.request
        if req is None or req.prefilled:
            raise ValueError("prefill needs a begun, unprefilled request")
        target = len(req.keys) - 1
        if self.offset >= target:
            return None
        cuts = [c for c, _ in req.schedule] if any(l.whole_state for l in self.layers) else []
        return self.offset, next_chunk_end(self.offset, target, self.chunk, cuts, req.spans)

    def evaluated(self, keys: tuple) -> None:
        """The keys were evaluated at the live offset (a prefill chunk, or a decode step)."""
        req = self.request
        p = self.offset
        self.forward(tuple(keys), req.spans if not req.prefilled else [])
        if not req.prefilled:
            req.chunks.append((p, self.offset))

    def prefilled(self) -> None:
        """The prefill is complete: attach its captures."""
        self.request.prefilled = True
        self.attach()

    def prefill(self, max_chunks: int | None = None) -> bool:
        """Evaluate the prompt up to its last key in chunks; stop early after
        `max_chunks` (a cancel). Attaches the captures when complete."""
        done = 0
        while (chunk := self.next_chunk()) is not None:
            if max_chunks is not None and done >= max_chunks:
                return False
            self.evaluated(self.request.keys[chunk[0]:chunk[1]])
            done += 1
        self.prefilled()
        return True

    def step(self, key: int) -> None:
        """One decode step: evaluate `key` at the live offset (the prompt's
        last key first, then every produced token but the last)."""
        req = self.request
        if req is None or not req.prefilled:
            raise ValueError("decode needs a prefilled request")
        self.evaluated((key,))

    def forward(self, keys: tuple, spans: list) -> None:
        """Evaluate keys at [p, q): materialise overlapped views, extend the
        live content, fire the captures crossed (KV by arithmetic anywhere;
        whole-state only at q)."""
        p, q = self.offset, self.offset + len(keys)
        req = self.request
        def whole(pos):  # is pos's non-causal item, if any, entirely inside [p, q)?
            return all(p <= a and e <= q for a, e in spans if a <= pos < e)
        content = tuple(k if whole(p + j) else Broken(k) for j, k in enumerate(keys))
        pending = [s for c in req.pending for s in c.snaps.values()]
        for i in self.stateful():
            if self.layers[i].kind == KV:
                self.trie.materialise(i, p, q, pending)
        for i in self.stateful():
            full = self.live[i] + content
            self.live[i] = full if self.layers[i].kind != WINDOWED else state_content(self.layers[i], full)
        self.offset, self.seq = q, self.seq + list(keys)
        for c, user in req.schedule:
            if p < c <= q:
                snaps = {}
                for i in self.stateful():
                    layer = self.layers[i]
                    if layer.kind == KV:
                        snaps[i] = self.trie.new_snapshot(layer=i, kind=KV, start=req.base, end=c,
                                                       content=self.live[i][req.base:c], lazy=True)
                    else:
                        assert c == q, f"whole-state capture at {c} inside forward [{p}, {q})"
                        snaps[i] = self.trie.new_snapshot(layer=i, kind=layer.kind, start=c, end=c,
                                                       content=self.live[i])
                req.pending.append(Capture(c, user, snaps))
                req.base = c

    # ------------------------------------------------------- attach and close
    def advance(self, to: int) -> Node:
        """Extend the active path over the live keys up to `to`: walk matching
        children, split a partly matched edge, append the rest."""
        f = self.frontier
        keys = tuple(self.seq[f.end:to])
        walked, k = match(f, keys)
        if len(walked) > 1 and f.end + k < walked[-1].end:
            walked[-1] = self.trie.split(walked[-1], f.end + k)
        self.path += walked[1:]
        if k < len(keys):
            self.path.append(self.trie.append_child(self.frontier, keys[k:]))
        return self.frontier

    def attach(self) -> None:
        """Put each pending capture on the node ending at its offset, clipped
        to that node's edge; a layer the node already has keeps its snapshot."""
        req = self.request
        if not req.pending:
            return
        for cap in req.pending:
            node = self.advance(cap.offset)
            node.user = node.user or cap.user
            for i, s in sorted(cap.snaps.items()):
                # A KV capture starts at the previous capture (or the resume), where the frontier ended
                # before advance, so it never starts after its node.
                assert s.kind != KV or s.start <= node.start, f"capture [{s.start}, {s.end}) after {node.start}"
                if i in node.snaps:
                    self.trie.release(s)       # the snapshot the node has wins
                    continue
                if s.kind == KV and s.start < node.start:  # clip: the node starts inside the capture (S1)
                    head, s = self.trie.split_snapshot(s, node.start)
                    self.trie.release(head)
                self.trie.own(node, s)
            self.touch(node)
            self.adopt_path()
            self.compact()
        req.pending = []
        self.evict()

    def page_out(self, node: Node) -> None:
        """S3: capture every stateful layer the node is missing from the live
        caches, which rest exactly at its end."""
        assert self.offset == node.end, "page_out needs the live caches at the node's end"
        for i in self.stateful():
            if i in node.snaps:
                continue
            kind = self.layers[i].kind
            if kind == KV:
                s = self.trie.new_snapshot(layer=i, kind=KV, start=node.start, end=node.end,
                                        content=self.live[i][node.start:node.end], lazy=True)
            else:
                s = self.trie.new_snapshot(layer=i, kind=kind, start=node.end, end=node.end, content=self.live[i])
            self.trie.own(node, s)

    def close(self) -> None:
        if self.request is None:
            raise ValueError("close without an open request")
        self.attach()
        if self.offset > self.frontier.end:
            self.advance(self.offset)
        if self.frontier is not self.root:
            self.page_out(self.frontier)
        self.adopt_path()
        self.compact()
        self.touch(self.frontier)
        self.request = None
        self.evict()

    # ------------------------------------------------- compaction, eviction
    def adopt_path(self) -> None:
        """No row held twice: the live buffer holds the active path's tokens up to
        the offset, so an owned KV snapshot on the path that ends there becomes a
        lazy view of those rows (e.g. rows a whole-state resume re-prefilled)."""
        for n in self.path[1:]:
            for i, s in n.snaps.items():
                if self.layers[i].kind == KV and not s.lazy and s.end <= self.offset:
                    self.trie.counter -= s.size(self.layers[i])
                    s.lazy = True

    def compact(self) -> None:
        """P2: merge each non-user single-child node of the active path that
        holds no whole-state snapshot into its child; no restore point is lost."""
        i = 1
        while i < len(self.path) - 1:
            n = self.path[i]
            if not n.user and len(n.children) == 1 and all(self.layers[j].kind == KV for j in n.snaps):
                self.path.remove(n.children[0])
                self.trie.merge_with_child(n)
            else:
                i += 1

    def evictable(self, n: Node) -> bool:
        """E2: everything but the root, the frontier and branch points."""
        return n is not self.root and n is not self.frontier and len(n.children) < 2

    def node_bytes(self, n: Node) -> int:
        return sum(s.size(self.layers[i]) for i, s in n.snaps.items())

    def evict_order(self, n: Node) -> tuple:
        """E3: least recently used, then deeper, then larger, then key path."""
        return (n.last_used, -n.end, -self.node_bytes(n), n.path_keys())

    def evict(self) -> None:
        while self.trie.counter > self.budget:
            victims = [n for n in self.trie.nodes() if self.evictable(n)]
            if not victims:
                return
            v = min(victims, key=self.evict_order)
            self.evictions += 1
            self.victims.append(v.path_keys())
            if v.children:                        # E4
                if v.children[0] in self.path:
                    self.path.remove(v.children[0])
                self.trie.merge_with_child(v)
            else:
                self.trie.remove_leaf(v)
                self.compact()                    # P2: its parent may be left with one child

    def set_budget(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"budget {budget} < 0")
        self.budget = budget
        self.evict()

    # ------------------------------------------------------------------ view
    def view(self) -> View:
        """The read-only view the rules read (spec.view), with contents."""
        r = self.request
        req = None if r is None else RequestView(
            r.keys, tuple(r.spans), r.matched, r.resume, tuple(r.schedule), tuple(r.chunks), r.prefilled,
            tuple(id(s) for c in r.pending for s in c.snaps.values()))
        return freeze(self.root, self.path, layers=self.layers, offset=self.offset, seq=self.seq,
                      live=[c if l.stateful else None for l, c in zip(self.layers, self.live)],
                      counter=self.trie.counter, budget=self.budget, clock=self.clock, request=req,
                      released=[id(s) for s in self.trie.created if s.released],
                      created=[id(s) for s in self.trie.created],
                      snaps_of=lambda n: sorted(n.snaps.items()),
                      content_of=lambda i, s, keys: s.content)

    # ------------------------------------------------------------------ C1
    def cold(self, i: int) -> tuple:
        """What layer i holds after a cold prefill of the live keys."""
        return state_content(self.layers[i], tuple(self.seq))

