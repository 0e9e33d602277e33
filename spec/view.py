"""The read-only view every rule reads (REFERENCE section 4).

A View is what a prefix cache can show of itself at a quiescent point: the
trie (nodes keyed by their key path, with edges, offsets, user flags,
last-used times and per-layer snapshot ranges, sizes and, where the target
can show them, contents), the active path, the live offset and content, the
byte counter and budget, and the open request. It is a frozen copy: an
operation rule compares the view before an operation with the view after it.

Who builds one:
  - spec's PrefixCache: `pc.view()` (spec.cache), directly;
  - impl: `impl.view.view(pc)` (no contents) or the stateful tests'
    abstraction (contents decoded from the tracer caches);
  - a target (targets/): from the JSON its harness prints, `View.from_dict`.

The view has no methods of the cache under check: no eviction order, no
protection, no reachability. The rules state those from REFERENCE's words.

Invariants of a well-formed view (checked by `View.from_dict`):
  - node keys are unique key paths; the root's is (); every other node's
    parent is the node whose key path is the longest proper prefix in the view
    that ends at its start;
  - `path` lists key paths, root first.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from spec.trie import Layer, state_content


LINK_MISMATCH = ("<parent link disagrees>",)   # NodeView.parent of a child whose parent link is not its parent


@dataclass(frozen=True)
class SnapView:
    """One layer's snapshot on a node. KV: positions [start, end); whole-state:
    start == end == the offset it describes. `nbytes` is what it owns (a lazy
    view owns 0). `content` is what it holds (None: the target cannot show it)."""
    layer: int
    kind: str
    start: int
    end: int
    nbytes: int
    lazy: bool = False
    content: tuple | None = None
    ident: int | None = None          # the snapshot's identity, where the target has one (A2)


@dataclass(frozen=True)
class NodeView:
    keys: tuple                       # key path from the root to this node's end: its identity
    start: int
    user: bool
    last_used: int
    snaps: Mapping[int, SnapView]
    parent: tuple | None              # the parent's key path (None for the root)
    children: tuple = ()              # the children's key paths

    @property
    def end(self) -> int:
        return len(self.keys)

    @property
    def edge(self) -> tuple:
        return self.keys[self.start:]

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __str__(self) -> str:
        if self.is_root:
            return "root"
        return f"node {short(self.keys)} [{self.start}, {self.end})"


def short(keys: tuple, limit: int = 12) -> str:
    """A key path as a reviewer reads it: its keys, the middle elided when long;
    fold values print as m<hex>."""
    shown = [f"m{k & 0xffff:04x}" if k >= 1 << 31 else str(k) for k in keys]
    if len(shown) > limit:
        shown = shown[:limit // 2] + ["…"] + shown[-limit // 2:]
    return "(" + " ".join(shown) + ")"


@dataclass(frozen=True)
class RequestView:
    keys: tuple
    spans: tuple                      # non-causal media spans (pos, end)
    matched: int
    resume: int
    schedule: tuple                   # (offset, user) captures scheduled at begin
    chunks: tuple = ()                # prefill chunks (p, q) evaluated so far
    prefilled: bool = False
    pending: tuple = ()               # snapshots taken but not attached yet (A2)


@dataclass(frozen=True)
class View:
    layers: tuple                     # spec.trie.Layer per layer (kind None: stateless)
    nodes: Mapping[tuple, NodeView]   # key path -> node
    path: tuple                       # key paths of the active path, root first
    offset: int                       # the live offset every layer rests at
    seq: tuple                        # keys of the live positions [0, offset)
    live: tuple                       # per layer: its live content, or None (not shown / stateless)
    counter: int                      # paged-out bytes the cache reports (A1)
    budget: int
    clock: int = 0
    request: RequestView | None = None
    released: tuple = ()              # idents of snapshots released so far, once each (A2); () if unknown
    created: tuple | None = None      # idents of every snapshot made (A2 leaks); None if unknown
    live_offsets: tuple = ()          # each stateful layer's own offset, where it can differ (T3)

    # ---- navigation (over the view's own data only)
    @property
    def root(self) -> NodeView:
        return self.nodes[()]

    @property
    def frontier(self) -> NodeView:
        return self.on_path()[-1]

    def node(self, keys) -> NodeView:
        return self.nodes[tuple(keys)]

    def children(self, n: NodeView) -> list:
        return [self.nodes[k] for k in n.children]

    def parent(self, n: NodeView) -> NodeView | None:
        return None if n.parent is None else self.nodes[n.parent]

    def walk(self):
        return iter(self.nodes.values())

    def on_path(self) -> list:
        """The active path's nodes; a key path the trie no longer holds (a node
        evicted from under the path) shows as a detached node (T3 flags it)."""
        return [self.nodes.get(k) or NodeView(k, len(k), False, -1, MappingProxyType({}), LINK_MISMATCH)
                for k in self.path]

    @property
    def phase(self) -> str:
        r = self.request
        if r is None:
            return "idle"
        if r.prefilled:
            return "prefilled"
        return "prefilling" if r.chunks else "begun"

    def cold(self, i: int) -> tuple:
        """What layer i holds after a cold prefill of the live keys."""
        return state_content(self.layers[i], self.seq)

    # ---- JSON (what a target's harness prints)
    @staticmethod
    def from_dict(d: dict) -> "View":
        """Build a view from its JSON form; see `to_dict`. Raises ValueError
        naming what is malformed."""
        layers = tuple(Layer(l.get("kind"), l.get("cost", 1), l.get("window", 0)) for l in d["layers"])
        raw = {tuple(n["keys"]): n for n in d["nodes"]}
        if () not in raw:
            raise ValueError("view: no root node (key path [])")
        kids: dict = {k: [] for k in raw}
        parents = {}
        for k, n in raw.items():
            if k == ():
                parents[k] = None
                continue
            p = tuple(k[:n["start"]])
            if p not in raw:
                raise ValueError(f"view: node {short(k)} starts at {n['start']} but no node ends there on its path")
            parents[k] = p
            kids[p].append(k)
        nodes = {}
        for k, n in raw.items():
            snaps = {}
            for s in n.get("snaps", []):
                c = s.get("content")
                snaps[int(s["layer"])] = SnapView(int(s["layer"]), s["kind"], s["start"], s["end"], s["bytes"],
                                                  bool(s.get("lazy", False)), None if c is None else tuple(c),
                                                  s.get("ident"))
            nodes[k] = NodeView(k, n["start"], bool(n.get("user", False)), n.get("last_used", 0),
                                MappingProxyType(snaps), parents[k], tuple(kids[k]))
        r = d.get("request")
        req = None if r is None else RequestView(
            tuple(r["keys"]), tuple(map(tuple, r.get("spans", ()))), r["matched"], r["resume"],
            tuple((c, bool(u)) for c, u in r.get("schedule", ())), tuple(map(tuple, r.get("chunks", ()))),
            bool(r.get("prefilled", False)))
        live = tuple(None if c is None else tuple(c) for c in d.get("live", [None] * len(layers)))
        return View(layers, MappingProxyType(nodes), tuple(tuple(p) for p in d["path"]), d["offset"],
                    tuple(d.get("seq", ())), live, d["counter"], d["budget"], d.get("clock", 0), req,
                    tuple(d.get("released", ())), None if d.get("created") is None else tuple(d["created"]),
                    tuple(d.get("live_offsets", ())))

    def to_dict(self) -> dict:
        def snap(s: SnapView) -> dict:
            return {"layer": s.layer, "kind": s.kind, "start": s.start, "end": s.end, "bytes": s.nbytes,
                    "lazy": s.lazy, "content": None if s.content is None else list(s.content), "ident": s.ident}
        r = self.request
        return {
            "layers": [{"kind": l.kind, "cost": l.cost, "window": l.window} for l in self.layers],
            "nodes": [{"keys": list(n.keys), "start": n.start, "user": n.user, "last_used": n.last_used,
                       "snaps": [snap(s) for _, s in sorted(n.snaps.items())]} for n in self.nodes.values()],
            "path": [list(k) for k in self.path], "offset": self.offset, "seq": list(self.seq),
            "live": [None if c is None else list(c) for c in self.live], "counter": self.counter,
            "budget": self.budget, "clock": self.clock,
            "request": None if r is None else {
                "keys": list(r.keys), "spans": [list(s) for s in r.spans], "matched": r.matched,
                "resume": r.resume, "schedule": [[c, u] for c, u in r.schedule],
                "chunks": [list(c) for c in r.chunks], "prefilled": r.prefilled},
            "released": list(self.released), "created": None if self.created is None else list(self.created),
            "live_offsets": list(self.live_offsets)}


@dataclass(frozen=True)
class Op:
    """One operation of the alphabet every target runs: begin(keys, spans) ->
    (matched, resume); prefill(max_chunks); step(key); close(); set_budget(b).
    `outcome` is what the operation returned (begin's (matched, resume))."""
    name: str
    args: tuple = ()
    outcome: tuple | None = None
    evicted: tuple | None = field(default=None)   # key paths of the victims in order, where the target reports them


def freeze(root, path, *, layers, offset, seq, live, counter, budget, clock=0, request=None,
           released=(), created=None, live_offsets=(), snaps_of=None, content_of=None) -> View:
    """A view of any trie whose nodes have edge/start/children/user/last_used
    and per-layer snapshots with kind/start/end/lazy (spec's and impl's
    shapes): `snaps_of(node)` yields (layer, snapshot) pairs and
    `content_of(layer, snapshot, node_keys)` the snapshot's content or None."""
    nodes = {}

    def visit(n, prefix: tuple, parent_keys):
        keys = prefix + tuple(n.edge)
        kids = list(n.children.values()) if isinstance(n.children, dict) else list(n.children)
        snaps = {}
        for i, s in snaps_of(n):
            snaps[i] = SnapView(i, s.kind, s.start, s.end, snap_size(s, layers[i]), bool(s.lazy),
                                content_of(i, s, keys) if content_of else None, id(s))
        nodes[keys] = NodeView(keys, n.start, bool(n.user), n.last_used, MappingProxyType(snaps), parent_keys,
                               tuple(keys + tuple(c.edge) for c in kids))
        for c in kids:   # a child whose own parent link is another object: a link no key path can name (T1)
            visit(c, keys, keys if getattr(c, "parent", n) is n else LINK_MISMATCH)
    visit(root, (), None)
    keys_of = {id(n): None for n in path}
    acc = ()
    for n in path:
        acc = acc + tuple(n.edge)
        keys_of[id(n)] = acc
    return View(tuple(layers), MappingProxyType(nodes), tuple(keys_of[id(n)] for n in path), offset, tuple(seq),
                tuple(live), counter, budget, clock, request, tuple(released), created, tuple(live_offsets))


def snap_size(s, layer) -> int:
    """A snapshot's owned bytes: what its cache reported (`reported`, set on
    an abstracted snapshot), its `size` where that is a number (impl), else
    the spec's arithmetic (`size(layer)`)."""
    reported = getattr(s, "reported", None)
    if reported is not None:
        return reported
    size = s.size
    return size if isinstance(size, int) else size(layer)
