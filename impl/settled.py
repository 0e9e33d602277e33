"""How far the prefix cache's two scans of the active path may skip: the nodes they settled before.

After every capture and at close, the prefix cache scans its active path twice: `_adopt_path` (A1: an
owned KV snapshot below the offset becomes a view of the live rows) and `_compact` (P2: a non-user
single-child node without a whole-state snapshot merges into its child). Scanning the whole path each
time makes a request's bookkeeping grow with the conversation: 50 turns, ~150 nodes. A mark lets each
scan start past the nodes it settled.

Invariants (kept by the prefix cache, which calls these at each change named here):
- A mark is a node on the active path before the frontier (or the root: nothing settled). Every path
  node from the root's child up to the mark is settled for its scan: no owned KV snapshot (adoption),
  or not mergeable (compaction). The frontier is never settled: it is scanned every time.
- Settled nodes stay settled while attach and close run: they only append nodes past the frontier,
  merge nodes at or after the mark, and writes reach only rows past the offset, which no settled node
  holds.
- begin keeps a mark only when it keeps the node on the new path before the frontier (`kept`); a node
  it dropped can come back on the path over rows the request rewrites.
- Eviction (`evicting`, called before the trie changes): evicting v with a child on the path (E4)
  merges the child into v; if the child was settled, so is the merged v (views of the live rows merge
  into a view; it takes the child's flags, children and whole-state snapshot), else v is not any more.
  Evicting a leaf (never on the path) leaves its parent with one child fewer: maybe mergeable now.
"""
from __future__ import annotations

from impl.trie import Node


class Settled:
    __slots__ = ("root", "adopted", "compacted")

    def __init__(self, root: Node):
        self.root = root
        self.adopted = root       # the last node _adopt_path settled
        self.compacted = root     # the last node _compact settled

    @staticmethod
    def start(path: list, mark: Node) -> int:
        """The path index a scan starts at: past `mark` while it is on the path, never past the frontier."""
        try:
            return max(1, min(path.index(mark) + 1, len(path) - 1))
        except ValueError:
            return 1

    def after_scan(self, path: list) -> Node:
        """The mark a completed scan leaves: every node before the frontier."""
        return path[-2] if len(path) >= 2 else self.root

    def kept(self, path: list) -> None:
        """begin set a new path."""
        self.adopted = self.adopted if self.adopted in path[:-1] else self.root
        self.compacted = self.compacted if self.compacted in path[:-1] else self.root

    def evicting(self, path: list, v: Node) -> None:
        if v.children:
            child = next(iter(v.children.values()))
            if child in path:
                for name in ("adopted", "compacted"):
                    m = getattr(self, name)
                    if m is child:
                        setattr(self, name, v)
                    elif m is v:
                        setattr(self, name, v.parent)
        elif v.parent is not self.root and v.parent in path and self.compacted in path \
                and path.index(self.compacted) >= path.index(v.parent):     # (the root is never merged)
            self.compacted = v.parent.parent
