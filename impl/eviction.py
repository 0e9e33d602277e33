"""Eviction (REFERENCE.md E1-E4), the part of impl/prefix_cache.py's PrefixCache that picks and
removes nodes while the trie's bytes exceed the budget.

  E2  all but the root, the frontier and branch points are evictable;
  E3  LRU first; ties deeper, then larger, then by key path;
  E4  a leaf is removed, a one-child node merged into its child (P2 compaction follows).

A mixin: it uses the prefix cache's trie, path, budget, settled marks, order and check flag, and its
_compact.

The E3 order is kept incrementally (`EvictionOrder`), so that choosing a victim costs O(log n)
amortised, not a walk over the trie's n nodes; the budget test reads the trie's byte counter, which
the snapshot hooks keep (impl/trie.py, A1). Under `check=True` every victim is compared with the
walk's (impl.invariants.walked_victim), which is the order's definition. The nodes changed while no
eviction runs (a trie growing under its budget) are read in steps of at most `BACKLOG`, at the verbs'
eviction points, so that the first eviction after a long quiet period does not read them all at once.
"""
from __future__ import annotations

import heapq
import itertools

from impl import invariants
from impl.trie import Node


class EvictionOrder:
    """The E3 order of the trie's nodes as a heap with lazy invalidation.

    Invariants, at every `first` call (after `_update`):
    - `current` maps every evictable node (E2) to its one current entry (key, sequence number, node),
      key = evict_order(node) as of the last change to the node. A node the rule protects (the root, the
      frontier, a branch point) or one detached from the trie (no parent) has no current entry, or one
      that `first` drops when it reaches the top: it comes back when it is marked changed (a branch
      point when it loses a child; the frontier when the frontier moves, which `_update` marks).
    - `heap` holds every current entry, plus stale ones (an entry whose node has a newer entry or none),
      which are dropped when they reach the top; when stale entries outnumber current ones the heap is
      rebuilt, so it stays within twice the current entries (each stale entry costs O(1) amortised).
    - The trie adds to `changed` every node whose key, children or attachment changed since (Node's
      last_used setter, Trie's primitives); `_update` re-reads exactly those, and the frontier it saw
      last (a move of the frontier changes neither node).
    """

    def __init__(self, changed: set, frontier: Node):
        self.changed = changed
        self.frontier = frontier             # the frontier at the last _update
        self.current: dict = {}
        self.heap: list = []
        self._seq = itertools.count()

    def _update(self, pc) -> None:
        if pc.frontier is not self.frontier:
            self.changed.add(self.frontier)
            self.frontier = pc.frontier
        for n in self.changed:
            self.current.pop(n, None)
            if n.parent is not None and pc.evictable(n):
                e = (pc.evict_order(n), next(self._seq), n)
                self.current[n] = e
                heapq.heappush(self.heap, e)
        self.changed.clear()
        if len(self.heap) > 2 * len(self.current):          # stale entries outnumber current ones
            self.heap = list(self.current.values())
            heapq.heapify(self.heap)

    def first(self, pc) -> Node | None:
        """E3's first evictable node: the least key among evictable nodes, ties broken by key path."""
        self._update(pc)
        best, tied = None, []
        while self.heap and (best is None or self.heap[0][0] == best):
            e = heapq.heappop(self.heap)
            n = e[2]
            if self.current.get(n) is not e:
                continue                                     # stale
            if pc.evictable(n):
                best = e[0]
                tied.append(e)
            else:
                del self.current[n]                          # protected now: back when marked changed
        for e in tied:                                       # still current: the victim's entry goes
            heapq.heappush(self.heap, e)                     # when the eviction marks it changed
        if len(tied) < 2:
            return tied[0][2] if tied else None
        return min((e[2] for e in tied), key=Node.path_keys)


class Eviction:
    BACKLOG = 1024          # changed nodes the order may owe before an eviction point reads them

    def evictable(self, n: Node) -> bool:
        """E2: all but the root, the frontier and branch points."""
        return n is not self.root and n is not self.frontier and len(n.children) < 2

    def evict_order(self, n: Node) -> tuple:
        """E3: LRU first; ties deeper, then larger (the order breaks the rest by key path)."""
        return (n.last_used, -n.end, -n.bytes())

    def _victim(self) -> Node | None:
        """E3's first evictable node, from the incremental order (O(log n) amortised)."""
        return self.order.first(self)

    def _evict(self) -> None:
        if len(self.order.changed) > self.BACKLOG:
            self.order._update(self)                         # the order's debt stays bounded (see above)
        while self.trie.counter > self.budget:
            v = self._victim()
            if self.check:
                invariants.assert_victim(self, v)
            if v is None:
                return
            if self.check:
                invariants.assert_evictable(self, v)
            self.evictions += 1
            self.settled.evicting(self.path, v)
            if self.check or self.record_victims:
                self.victims.append(v.path_keys())
            if v.children:                                   # E4
                child = next(iter(v.children.values()))
                if child in self.path:
                    self.path.remove(child)
                self.trie.merge_with_child(v)
            else:
                self.trie.remove_leaf(v)
                self._compact()                              # P2: its parent may be left with one child
