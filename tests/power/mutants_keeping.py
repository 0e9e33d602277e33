"""Policy mutants of merging, eviction, accounting and the oracle's resume (G, E, A, C): one patch
of the spec and one of impl per rule (tests/power/mutants.py lists them)."""
from __future__ import annotations

import impl.prefix_cache as ipc
from impl.caches.base import WholeStateCache
from impl.caches.kv import KVCache
from impl.trie import Trie as ImplTrie
from spec.cache import PrefixCache as SpecCache
from spec.trie import KV, Trie
from tests.power.mutants_structure import s1_impl, s1_spec
from tests.power.patching import wrap


# ----------------------------------------------------------------- merging
def g1_spec(mp):                             # KV merge without the adjacency check, fed by a misplaced page-out
    s1_spec(mp)

    def merge_snapshots(orig):
        def m(store, a, b):
            if a is None or b is None or b.kind != KV or a.end == b.start:
                return orig(store, a, b)
            merged = store.new_snapshot(layer=a.layer, kind=KV, start=a.start, end=a.end + b.end - b.start,
                                    content=a.content + b.content, lazy=a.lazy and b.lazy)
            store.release(a)
            store.release(b)
            return merged
        return m
    wrap(mp, Trie, "merge_snapshots", merge_snapshots)


def g1_impl(mp):
    s1_impl(mp)

    def merge(orig):
        def m(cache, a, b):
            if a is not None and b is not None and a.end != b.start:
                b.start = a.end                  # no adjacency check: concatenate as if adjacent
            return orig(cache, a, b)
        return m
    wrap(mp, KVCache, "merge_snapshots", merge)


def g2_spec(mp):                             # a merge keeps the older last-used time
    def merge_with_child(orig):
        def m(store, node):
            older = min(node.last_used, node.children[0].last_used)
            orig(store, node).last_used = older
            return node
        return m
    wrap(mp, Trie, "merge_with_child", merge_with_child)


def g2_impl(mp):
    def merge_with_child(orig):
        def m(trie, node):
            older = min(node.last_used, next(iter(node.children.values())).last_used)
            orig(trie, node).last_used = older
            return node
        return m
    wrap(mp, ImplTrie, "merge_with_child", merge_with_child)


# ---------------------------------------------------------------- eviction
def e1_spec(mp):
    mp.setattr(SpecCache, "evict", lambda self: None)


def e1_impl(mp):
    mp.setattr(ipc.PrefixCache, "_evict", lambda self: None)


def e2_spec(mp):                             # the frontier is evictable too
    mp.setattr(SpecCache, "evictable", lambda self, n: n is not self.root and len(n.children) < 2)


def e2_impl(mp):
    mp.setattr(ipc.PrefixCache, "evictable", lambda self, n: n is not self.root and len(n.children) < 2)


def e3_spec(mp):                             # most recently used first
    mp.setattr(SpecCache, "evict_order", lambda self, n: (-n.last_used, n.path_keys()))


def e3_impl(mp):
    mp.setattr(ipc.PrefixCache, "evict_order", lambda self, n: (-n.last_used,))


def _merging_during_evict(mp, cls, name, merge_with_child):
    """Eviction (`cls.name`) merges with `merge_with_child(trie, node)`; other merges stay as they are."""
    def evict(orig):
        def e(self):
            self.trie.merge_with_child = lambda node: merge_with_child(self.trie, node)
            try:
                orig(self)
            finally:
                del self.trie.merge_with_child
        return e
    wrap(mp, cls, name, evict)


def e4_spec(mp):                             # a single-child victim is dropped and its child re-hung as it was
    def merge_with_child(store, node):
        child = node.children[0]
        for i in sorted(node.snaps):
            store.release(store.disown(node, i))
        node.parent.children[node.parent.children.index(node)] = child
        child.parent = node.parent
        return child
    _merging_during_evict(mp, SpecCache, "evict", merge_with_child)


def e4_impl(mp):
    def merge_with_child(trie, node):
        (child,) = node.children.values()
        for i, s in enumerate(node.snaps):
            if s is not None:
                trie.disown(node, i).release()
        del node.parent.children[node.edge[0]]
        node.parent.children.setdefault(child.edge[0], child)
        child.parent = node.parent
        return child
    _merging_during_evict(mp, ipc.PrefixCache, "_evict", merge_with_child)


def e5_spec(mp):                             # without the matched checkpoint, back to 0 (not the newest survivor)
    wrap(mp, SpecCache, "reachable", lambda orig: lambda self, i, path, x, matched, common:
         orig(self, i, path, x, matched, common) and (x in (0, matched) or self.layers[i].kind == KV))


def e5_impl(mp):
    wrap(mp, ipc.PrefixCache, "_resume", lambda orig: lambda self, path, matched, common, spans:
         (lambda x: x if x == matched else 0)(orig(self, path, matched, common, spans)))


# ------------------------------------------------------------- accounting
def a1_spec(mp):                             # materialised bytes never reach the counter
    def materialise(store, i, p, q, pending=()):
        for n in list(store.nodes()):
            s = n.snaps.get(i)
            if s is not None and s.lazy and s.start < q and p < s.end:
                s.lazy = False
        for s in pending:
            if s.layer == i and s.lazy and s.start < q and p < s.end:
                s.lazy = False
    mp.setattr(Trie, "materialise", materialise)


def a1_impl(mp):
    mp.setattr(ImplTrie, "_grew", lambda self, node, delta: None)


def a2_spec(mp):                             # an evicted leaf's snapshots are never released
    def remove_leaf(store, node):
        for i in sorted(node.snaps):
            store.disown(node, i)
        node.parent.children.remove(node)
        node.parent = None
    mp.setattr(Trie, "remove_leaf", remove_leaf)


def a2_impl(mp):                             # a whole-state merge closes the state it keeps
    def merge(orig):
        def m(cache, a, b):
            out = orig(cache, a, b)
            if out is not None:
                out.release()
            return out
        return m
    wrap(mp, WholeStateCache, "merge_snapshots", merge)


# --------------------------------------------------------------- oracle
def c2_spec(mp):                             # resume one checkpoint below the match
    wrap(mp, SpecCache, "reachable", lambda orig: lambda self, i, path, x, matched, common:
         orig(self, i, path, x, matched, common) and not (x == matched and x > 0))


def c2_impl(mp):
    wrap(mp, ipc.PrefixCache, "_resume", lambda orig: lambda self, path, matched, common, spans:
         orig(self, path, matched, common, spans) if matched == 0 else orig(self, path, matched - 1, common, spans))
