"""The compressed prefix trie over keys, holding per-layer snapshots.

Mirrors spec/trie.py on real layer caches (impl/caches): a node's `snaps`
is a list with one entry per layer (None where the node has none, always
None for stateless layers).

Invariants kept here (REFERENCE rule ids):
  T1  start(n) = end(parent(n)); len(edge(n)) = end(n) - start(n); links agree.
  T2  siblings never share a first key (children are keyed by first key).
  S1  a KV snapshot on a node spans exactly [start, end) of its edge.
  S2  a whole-state snapshot on a node is the state at the node's end.
  S4  split gives the head the KV halves only; whole-state stays on the tail.
  G1  merge of non-adjacent KV snapshots raises (the caches' MergeError).
  G2  merge with the single child: edges and KV pairs concatenate (two lazy
      views by arithmetic), the child's whole-state, user flag and the newer
      last-used time survive.
  A1  `counter` equals the owned bytes of the snapshots held by nodes: every
      snapshot a node holds reports materialisation through a hook into it,
      which also keeps the node's own total (`Node.bytes`, read by eviction).
  A2  a snapshot leaves a node only to another node or to release(), once.
  `Trie.changed` holds every node whose eviction key (last-used time, end, bytes) or number of
  children changed, or that left the trie, since impl/eviction.py's order last read it: the
  primitives below add them, and so does setting `Node.last_used`.
"""
from __future__ import annotations

import time


class Node:
    __slots__ = ("edge", "start", "parent", "children", "snaps", "_last_used", "used_at", "user", "held",
                 "trie")

    def __init__(self, edge: tuple, start: int, n_layers: int, parent: "Node | None" = None, last_used: int = 0,
                 *, trie: "Trie"):
        self.edge = edge
        self.start = start
        self.parent = parent
        self.children: dict = {}          # first key -> child (T2)
        self.snaps: list = [None] * n_layers
        self.trie = trie                  # its trie: Trie.changed hears its key change, Trie._grew its bytes
        self.last_used = last_used        # logical clock (eviction order)
        self.used_at = time.monotonic()   # wall time, for dumps only
        self.user = False
        self.held = 0                     # owned bytes of `snaps`, kept by Trie.own/disown and the hook

    @property
    def last_used(self) -> int:
        return self._last_used

    @last_used.setter
    def last_used(self, t: int) -> None:
        self._last_used = t
        self.trie.changed.add(self)       # its eviction key changed (whoever sets it: touch, merge, a test)

    def __call__(self, delta: int) -> None:
        """The materialisation hook of every snapshot this node holds (Trie.own): their owned bytes
        changed by delta (A1). The node itself is the hook, so a held snapshot costs no hook object of
        its own (fewer objects for Python's full collections to visit: serve/collector.py)."""
        self.trie._grew(self, delta)

    @property
    def end(self) -> int:
        return self.start + len(self.edge)

    def path_keys(self) -> tuple:
        parts, n = [], self
        while n is not None:
            parts.append(n.edge)
            n = n.parent
        return tuple(k for edge in reversed(parts) for k in edge)

    def bytes(self) -> int:
        """Owned bytes of this node's snapshots (their sizes' sum, kept as they change: E3 reads it
        for every evictable node on every victim)."""
        return self.held

    def __repr__(self) -> str:
        return f"<Node [{self.start}, {self.end})>"


def common_prefix(a, b) -> int:
    """Length of the longest common prefix. Keys are compared as slices (C speed), never one by one
    in Python: whole blocks of 256 first (a 32k-token prompt: 0.55 ms against 2.5 key by key), then
    the last partial block by halving."""
    n, limit = 0, min(len(a), len(b))
    a, b = tuple(a), tuple(b)              # no copy for a tuple; a list slice never equals a tuple slice
    step = 256
    while n + step <= limit and a[n:n + step] == b[n:n + step]:
        n += step
    while step > 1:                        # the prefix ends within [n, n + step): halve the block
        step //= 2
        if n + step <= limit and a[n:n + step] == b[n:n + step]:
            n += step
    return n


def match(root: Node, keys) -> tuple[list, int]:
    """Longest match of keys below `root`: nodes walked (root first, the last
    possibly matched partly) and the number of keys matched."""
    path, node, pos = [root], root, 0
    while pos < len(keys):
        child = node.children.get(keys[pos])
        if child is None:
            break
        seg = keys[pos:pos + len(child.edge)]
        n = len(seg) if seg == child.edge else common_prefix(child.edge, seg)   # (whole edges: one compare)
        path.append(child)
        pos += n
        if n < len(child.edge):
            break
        node = child
    return path, pos


def walk(node: Node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(list(n.children.values())))


class Trie:
    """Nodes plus the paged-out byte counter, over one model's layer caches."""

    def __init__(self, caches):
        self.caches = list(caches)
        self.changed: set = set()         # nodes to re-read by the eviction order (impl/eviction.py)
        self.root = Node((), 0, len(self.caches), trie=self)
        self.counter = 0

    # --- ownership (A1, A2) ---
    def _grew(self, node: Node, delta: int) -> None:
        node.held += delta
        self.counter += delta
        self.changed.add(node)

    def own(self, node: Node, i: int, snap) -> None:
        assert node.snaps[i] is None, f"layer {i} of {node} already held"
        node.snaps[i] = snap
        node.held += snap.size
        self.counter += snap.size
        self.changed.add(node)
        snap.on_materialise = node                   # (Node.__call__: this trie's _grew)

    def disown(self, node: Node, i: int):
        snap = node.snaps[i]
        node.snaps[i] = None
        snap.on_materialise = None
        node.held -= snap.size
        self.counter -= snap.size
        self.changed.add(node)
        return snap

    # --- node primitives ---
    def split(self, node: Node, at: int) -> Node:
        """Split `node` at absolute offset `at`; returns the new head (S4)."""
        if not node.start < at < node.end:
            raise ValueError(f"split at {at} outside ({node.start}, {node.end})")
        k = at - node.start
        head = Node(node.edge[:k], node.start, len(self.caches), node.parent, node.last_used, trie=self)
        head.used_at = node.used_at
        head.children[node.edge[k]] = node
        node.parent.children[node.edge[0]] = head
        node.parent, node.edge, node.start = head, node.edge[k:], at
        for i, s in enumerate(node.snaps):
            if s is None:
                continue
            h, t = self.caches[i].split(self.disown(node, i), at)
            if h is not None:
                self.own(head, i, h)
            self.own(node, i, t)
        return head

    def merge_with_child(self, node: Node) -> Node:
        """G2: absorb the only child into `node`; returns `node`."""
        if len(node.children) != 1:
            raise ValueError(f"merge_with_child needs exactly one child, {node} has {len(node.children)}")
        (child,) = node.children.values()
        for i, cache in enumerate(self.caches):
            a = self.disown(node, i) if node.snaps[i] is not None else None
            b = self.disown(child, i) if child.snaps[i] is not None else None
            if a is None and b is None:
                continue
            merged = cache.merge_snapshots(a, b)     # raises MergeError unless adjacent (G1)
            if merged is not None:
                self.own(node, i, merged)
        node.edge = node.edge + child.edge
        node.children = child.children
        for c in node.children.values():
            c.parent = node
        node.user = child.user
        node.last_used = max(node.last_used, child.last_used)
        node.used_at = max(node.used_at, child.used_at)
        child.parent, child.children = None, {}
        self.changed.update((node, child))
        return node

    def remove_leaf(self, node: Node) -> None:
        if node.children or node.parent is None:
            raise ValueError(f"remove_leaf needs a non-root leaf, got {node}")
        for i, s in enumerate(node.snaps):
            if s is not None:
                self.disown(node, i).release()
        del node.parent.children[node.edge[0]]
        self.changed.update((node, node.parent))
        node.parent = None

    def append_child(self, node: Node, edge: tuple) -> Node:
        child = Node(tuple(edge), node.end, len(self.caches), node, node.last_used, trie=self)
        node.children[child.edge[0]] = child
        self.changed.add(node)
        return child

    def nodes(self) -> list:
        return list(walk(self.root))
