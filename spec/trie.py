"""The trie, its snapshots and its primitives (REFERENCE sections 1 and 3).

Snapshots hold *content*, not arrays: the content of a position is its key,
or Broken(key) when it was evaluated wrongly (a non-causal media item split
across forwards), so "what a restore would produce" is exact and checkable.

Invariants kept here (each a predicate in spec.rules):
  T1  start(n) = end(parent(n)); len(edge(n)) = end(n) - start(n); links agree.
  T2  siblings never share a first key.
  S1  a KV snapshot on a node spans exactly the node's edge [start, end).
  S2  a whole-state snapshot on a node is the state at the node's end.
  S4  split gives the head KV-only snapshots (the halves of each KV snapshot);
      whole-state snapshots stay on the tail, whose end they describe.
  G1  two KV snapshots merge only if the first ends where the second begins;
      anything else raises MergeError, never a silent concatenation.
  G2  merging a node with its single child concatenates edges and KV pairs
      (two lazy views stay lazy), keeps the child's whole-state and user flag,
      and the newer last-used time.
  A1  the byte counter changes only through own/disown/materialise here.
  A2  every snapshot is held by one node or released exactly once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

KV, WINDOWED, RECURRENT = "kv", "windowed", "recurrent"


class MergeError(ValueError):
    """G1: refusing to merge snapshots that are not adjacent."""


@dataclass(frozen=True)
class Broken:
    """Content of a position evaluated without the rest of its non-causal item."""
    key: int


@dataclass(frozen=True)
class Layer:
    """A layer's cache kind (None: stateless), its window W (windowed only) and
    its byte cost: per token for KV and windowed rows, per state for recurrent."""
    kind: str | None
    cost: int = 1
    window: int = 0

    @property
    def stateful(self) -> bool:
        return self.kind is not None

    @property
    def whole_state(self) -> bool:
        return self.kind in (WINDOWED, RECURRENT)


def state_content(layer: Layer, content: tuple) -> tuple:
    """What a layer holds after evaluating `content` (one entry per position):
    every position for KV and recurrent, the last W for windowed."""
    if layer.kind == WINDOWED:
        return tuple(content[max(0, len(content) - layer.window):])
    return tuple(content)


@dataclass(eq=False)
class Snapshot:
    """One layer's paged-out state. KV: content of [start, end). Whole-state:
    start == end == the offset the state describes. A lazy KV view owns no
    bytes until it materialises."""
    layer: int
    kind: str
    start: int
    end: int
    content: tuple
    lazy: bool = False
    released: bool = False

    def size(self, layer: Layer) -> int:
        if self.kind == KV:
            return 0 if self.lazy else (self.end - self.start) * layer.cost
        if self.kind == WINDOWED:
            return len(self.content) * layer.cost
        return layer.cost


@dataclass(eq=False)
class Node:
    edge: tuple
    start: int
    parent: "Node | None" = None
    children: list = field(default_factory=list)
    snaps: dict = field(default_factory=dict)  # layer index -> Snapshot
    last_used: int = 0
    user: bool = False

    @property
    def end(self) -> int:
        return self.start + len(self.edge)

    def child_starting_with(self, key):
        return next((c for c in self.children if c.edge[0] == key), None)

    def path_keys(self) -> tuple:
        """Keys from the root to this node's end (a node's identity)."""
        parts, n = [], self
        while n is not None:
            parts.append(n.edge)
            n = n.parent
        return tuple(k for edge in reversed(parts) for k in edge)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """post: 0 <= __return__ <= min(len(a), len(b))
    post: all(a[i] == b[i] for i in range(__return__))
    post: __return__ == min(len(a), len(b)) or a[__return__] != b[__return__]
    """
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def match(root: Node, keys) -> tuple[list, int]:
    """Longest match of `keys` from `root`: the nodes walked (root first; the
    last may be matched only partly) and the number of keys matched."""
    path, node, pos = [root], root, 0
    while pos < len(keys):
        child = node.child_starting_with(keys[pos])
        if child is None:
            break
        n = common_prefix(child.edge, keys[pos:])
        path.append(child)
        pos += n
        if n < len(child.edge):
            break
        node = child
    return path, pos


def walk(node: Node):
    yield node
    for c in node.children:
        yield from walk(c)


class Trie:
    """The trie plus the byte counter and the snapshot registry (A1, A2)."""

    def __init__(self, layers):
        self.layers = tuple(layers)
        self.root = Node(edge=(), start=0)
        self.counter = 0           # paged-out bytes (A1)
        self.created: list = []    # every snapshot ever made (A2)

    # --- ownership (A1, A2) ---
    def new_snapshot(self, **kw) -> Snapshot:
        s = Snapshot(**kw)
        self.created.append(s)
        return s

    def release(self, s: Snapshot) -> None:
        assert not s.released, "A2: snapshot released twice"
        s.released = True

    def own(self, node: Node, s: Snapshot) -> None:
        node.snaps[s.layer] = s
        self.counter += s.size(self.layers[s.layer])

    def disown(self, node: Node, i: int) -> Snapshot:
        s = node.snaps.pop(i)
        self.counter -= s.size(self.layers[i])
        return s

    def materialise(self, i: int, p: int, q: int, pending=()) -> None:
        """A write to slots [p, q) of KV layer i first copies out every lazy
        view overlapping them; the bytes count once the view is in the trie."""
        for n in walk(self.root):
            s = n.snaps.get(i)
            if s is not None and s.lazy and s.start < q and p < s.end:
                s.lazy = False
                self.counter += s.size(self.layers[i])
        for s in pending:
            if s.layer == i and s.lazy and s.start < q and p < s.end:
                s.lazy = False

    # --- snapshot arithmetic ---
    def split_snapshot(self, s: Snapshot, at: int) -> tuple:
        """S4: a KV snapshot splits into two halves (lazy stays lazy); a
        whole-state snapshot describes the end, so it all goes to the tail."""
        if s.kind != KV:
            return None, s
        assert s.start < at < s.end, f"split at {at} outside ({s.start}, {s.end})"
        k = at - s.start
        head = self.new_snapshot(layer=s.layer, kind=KV, start=s.start, end=at, content=s.content[:k], lazy=s.lazy)
        tail = self.new_snapshot(layer=s.layer, kind=KV, start=at, end=s.end, content=s.content[k:], lazy=s.lazy)
        self.release(s)
        return head, tail

    def merge_snapshots(self, a: Snapshot | None, b: Snapshot | None) -> Snapshot | None:
        """G1/G2: KV pairs concatenate only when adjacent; whole-state keeps
        the newer (b), with or without a. A missing KV side leaves no snapshot."""
        if b is not None and b.kind != KV:
            if a is not None:
                self.release(a)
            return b
        if a is None or b is None:
            for s in (a, b):
                if s is not None:
                    self.release(s)
            return None
        if a.end != b.start:
            raise MergeError(f"G1: KV snapshots [{a.start}, {a.end}) and [{b.start}, {b.end}) are not adjacent")
        merged = self.new_snapshot(layer=a.layer, kind=KV, start=a.start, end=b.end,
                               content=a.content + b.content, lazy=a.lazy and b.lazy)
        self.release(a)
        self.release(b)
        return merged

    # --- node primitives ---
    def split(self, node: Node, at: int) -> Node:
        """Split `node` at absolute offset `at`; returns the new head (S4)."""
        assert node.start < at < node.end, f"split at {at} outside ({node.start}, {node.end})"
        k = at - node.start
        head = Node(edge=node.edge[:k], start=node.start, parent=node.parent,
                    children=[node], last_used=node.last_used)
        parent = node.parent
        parent.children[parent.children.index(node)] = head
        node.parent, node.edge, node.start = head, node.edge[k:], at
        for i in sorted(node.snaps):
            h, t = self.split_snapshot(self.disown(node, i), at)
            if h is not None:
                self.own(head, h)
            self.own(node, t)
        return head

    def merge_with_child(self, node: Node) -> Node:
        """G2: absorb the only child into `node`; returns `node`."""
        assert len(node.children) == 1, "merge_with_child needs exactly one child"
        child = node.children[0]
        for i in sorted(set(node.snaps) | set(child.snaps)):
            a = self.disown(node, i) if i in node.snaps else None
            b = self.disown(child, i) if i in child.snaps else None
            merged = self.merge_snapshots(a, b)
            if merged is not None:
                self.own(node, merged)
        node.edge = node.edge + child.edge
        node.children = child.children
        for c in node.children:
            c.parent = node
        node.user = child.user
        node.last_used = max(node.last_used, child.last_used)
        return node

    def remove_leaf(self, node: Node) -> None:
        assert not node.children and node.parent is not None, "remove_leaf needs a non-root leaf"
        for i in sorted(node.snaps):
            self.release(self.disown(node, i))
        node.parent.children.remove(node)
        node.parent = None

    def append_child(self, node: Node, edge: tuple) -> Node:
        child = Node(edge=tuple(edge), start=node.end, parent=node, last_used=node.last_used)
        node.children.append(child)
        return child

    def nodes(self) -> list:
        return list(walk(self.root))
