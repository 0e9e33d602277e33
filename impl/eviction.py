"""Eviction (REFERENCE.md E1-E4), the part of impl/prefix_cache.py's PrefixCache that picks and
removes nodes while the trie's bytes exceed the budget.

  E2  all but the root, the frontier and branch points are evictable;
  E3  LRU first; ties deeper, then larger, then by key path;
  E4  a leaf is removed, a one-child node merged into its child (P2 compaction follows).

A mixin: it uses the prefix cache's trie, path, budget, settled marks and check flag, and its _compact.
"""
from __future__ import annotations

from impl import invariants
from impl.trie import Node


class Eviction:
    def evictable(self, n: Node) -> bool:
        """E2: all but the root, the frontier and branch points."""
        return n is not self.root and n is not self.frontier and len(n.children) < 2

    def evict_order(self, n: Node) -> tuple:
        """E3: LRU first; ties deeper, then larger (_victim breaks the rest by key path)."""
        return (n.last_used, -n.end, -n.bytes())

    def _victim(self) -> Node | None:
        """E3's first evictable node: one pass over the trie (in no particular order: ties are broken
        by key path, which is unique)."""
        best, tied, stack = None, [], [self.root]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if self.evictable(n):
                k = self.evict_order(n)
                if best is None or k < best:
                    best, tied = k, [n]
                elif k == best:
                    tied.append(n)
        if len(tied) < 2:
            return tied[0] if tied else None
        return min(tied, key=Node.path_keys)

    def _evict(self) -> None:
        while self.trie.counter > self.budget:
            v = self._victim()
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
