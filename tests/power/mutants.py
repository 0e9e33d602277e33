"""Policy mutants: the spec or impl with one policy hook changed, each breaking
one rule (the power table of docs/spec.md). A mutant is applied with pytest's
monkeypatch and run as a target (targets.reference) through
targets.program.judge: the rule predicates alone must flag it.

Each entry: rule id -> Mutant(what it changes, spec patch, impl patch or the
reason impl has no such mutant, layer mixes that can show it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import impl.prefix_cache as ipc
import spec.plan as splan
from impl.caches.base import WholeStateCache
from impl.caches.kv import KVCache
from impl.trie import Trie as ImplTrie
from spec.cache import PrefixCache as SpecCache
from spec.trie import KV, Layer, Trie

KV_L, WIN, REC, NONE = Layer("kv", 16), Layer("windowed", 16, window=5), Layer("recurrent", 12), Layer(None)
MIXES = {"kv": (KV_L,), "kv_rec": (NONE, KV_L, REC), "kv_win": (KV_L, WIN), "hybrid": (KV_L, WIN, NONE, REC)}


@dataclass(frozen=True)
class Mutant:
    what: str
    spec: Callable
    impl: Callable | str          # a patch, or why impl has no such mutant
    mixes: tuple = tuple(MIXES)


def wrap(mp, cls, name, make):
    mp.setattr(cls, name, make(getattr(cls, name)))


# ---------------------------------------------------------------- structure
def t1_spec(mp):
    def remove_leaf(store, node):            # the removed leaf stays listed under its parent
        for i in sorted(node.snaps):
            store.release(store.disown(node, i))
        node.parent = None
    mp.setattr(Trie, "remove_leaf", remove_leaf)


def t1_impl(mp):                             # a new child's parent link points one level too high
    def append_child(orig):
        def a(trie, node, edge):
            child = orig(trie, node, edge)
            child.parent = node.parent or node
            return child
        return a
    wrap(mp, ImplTrie, "append_child", append_child)


def t2_spec(mp):                             # attach never walks existing children: appends a sibling
    mp.setattr(SpecCache, "advance", _append_only)


def _append_only(self, to):
    f = self.frontier
    keys = tuple(self.seq[f.end:to])
    if keys:
        self.path.append(self.trie.append_child(f, keys))
    return self.frontier


def t3_spec(mp):                             # a decode step skips the last stateful layer
    def forward(orig):
        def f(self, keys, spans):
            last = self.stateful()[-1]
            kept = self.live[last]
            orig(self, keys, spans)
            if len(keys) == 1:
                self.live[last] = kept
        return f
    wrap(mp, SpecCache, "forward", forward)


def t3_impl(mp):                             # close leaves the path one node short of the live offset
    def close(orig):
        def c(self):
            out = orig(self)
            if len(self.path) > 1:
                self.path.pop()
            return out
        return c
    wrap(mp, ipc.PrefixCache, "close", close)


# --------------------------------------------------------- snapshot coverage
def s1_spec(mp):                             # page-out's KV snapshot starts at 0, not at the node's start
    def page_out(orig):
        def p(self, node):
            orig(self, node)
            for i, s in list(node.snaps.items()):
                if s.kind == KV and s.start > 0 and s.lazy:
                    self.trie.release(self.trie.disown(node, i))
                    self.trie.own(node, self.trie.new_snapshot(layer=i, kind=KV, start=0, end=node.end,
                                                             content=self.live[i][:node.end], lazy=True))
        return p
    wrap(mp, SpecCache, "page_out", page_out)


def s1_impl(mp):
    def page_out(self, node):
        for i in self.stateful():
            if node.snaps[i] is None:
                self.trie.own(node, i, self.caches[i].snapshot(0 if self.caches[i].kind == "kv" else node.start))
    mp.setattr(ipc.PrefixCache, "_page_out", page_out)


def s2_spec(mp):                             # a merge keeps the parent's (older) whole-state
    def merge_snapshots(orig):
        def m(store, a, b):
            if a is not None and a.kind != KV:
                if b is not None:
                    store.release(b)
                return a
            return orig(store, a, b)
        return m
    wrap(mp, Trie, "merge_snapshots", merge_snapshots)


def s2_impl(mp):
    def merge(cache, a, b):
        if a is not None:
            cache._release_quietly(b)
            return a
        return b
    mp.setattr(WholeStateCache, "merge_snapshots", merge)


def s3_spec(mp):                             # the historical page-out: skips a node holding any snapshot
    wrap(mp, SpecCache, "page_out", lambda orig: lambda self, node: None if node.snaps else orig(self, node))


def s3_impl(mp):
    wrap(mp, ipc.PrefixCache, "_page_out",
         lambda orig: lambda self, node: None if any(s is not None for s in node.snaps) else orig(self, node))


def after_split(mp, cls, then):
    """`cls.split` (spec or impl trie) followed by then(trie, node, head)."""
    def split(orig):
        def sp(trie, node, at):
            head = orig(trie, node, at)
            then(trie, node, head)
            return head
        return sp
    wrap(mp, cls, "split", split)


def s4_spec(mp):                             # a split moves the whole-state to the head
    def move(store, node, head):
        for i in [i for i, s in node.snaps.items() if s.kind != KV]:
            store.own(head, store.disown(node, i))
    after_split(mp, Trie, move)


def s4_impl(mp):
    def move(trie, node, head):
        for i, s in enumerate(node.snaps):
            if s is not None and s.kind != "kv" and head.snaps[i] is None:
                trie.own(head, i, trie.disown(node, i))
    after_split(mp, ImplTrie, move)


# ------------------------------------------------------------------- media
def m1_spec(mp):
    mp.setattr(splan, "extend_chunk", lambda end, spans: end)


def m1_impl(mp):
    mp.setattr(ipc, "_chunk_end", lambda q, spans: q)


def m2_spec(mp):
    mp.setattr(splan, "capture_ceiling", lambda x, spans: x)


def m2_impl(mp):
    real = ipc.schedule
    mp.setattr(ipc, "schedule", lambda n, resume, matched, spans, interval, near_end, boundaries=():
               real(n, resume, matched, [], interval, near_end, boundaries))


# ------------------------------------------------- resume inside an edge
def p1_spec(mp):                             # begin resumes inside an edge without splitting it
    def begin_keys(orig):
        def b(self, keys, spans, boundaries=()):
            self.trie.split = lambda node, at: node.parent       # the resumed node is left off the path
            try:
                out = orig(self, keys, spans, boundaries)
            finally:
                del self.trie.split
            if len(self.path) > 1 and self.path[-1] is self.path[-2]:
                self.path.pop()
            return out
        return b
    wrap(mp, SpecCache, "begin_keys", begin_keys)


def p1_impl(mp):
    mp.setattr(ipc.PrefixCache, "_split_at_live", lambda self, path, resume: [n for n in path if n.end <= resume])


def p2_spec(mp):
    mp.setattr(SpecCache, "compact", lambda self: None)


def p2_impl(mp):
    mp.setattr(ipc.PrefixCache, "_compact", lambda self: None)


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


MUTANTS = {
    "T1": Mutant("spec: an evicted leaf stays listed under its parent; impl: a new child's parent link points "
                 "one level too high", t1_spec, t1_impl),
    "T2": Mutant("attach appends a new child instead of walking a matching one", t2_spec,
                 "impl keys children by their first key: a second child with the same first key cannot exist"),
    "T3": Mutant("spec: a decode step skips a layer; impl: close leaves the path one node short of the live "
                 "offset",
                 t3_spec, t3_impl),
    "S1": Mutant("page-out's KV snapshot starts at 0, not at the node's start", s1_spec, s1_impl),
    "S2": Mutant("a merge keeps the parent's older whole-state", s2_spec, s2_impl, ("kv_rec", "hybrid", "kv_win")),
    "S3": Mutant("page-out skips a node that holds any snapshot (the seed's bug)", s3_spec, s3_impl,
                 ("kv_rec", "hybrid", "kv_win")),
    "S4": Mutant("a split moves the whole-state to the head", s4_spec, s4_impl, ("kv_rec", "hybrid", "kv_win")),
    "M1": Mutant("a chunk may end inside a non-causal item", m1_spec, m1_impl),
    "M2": Mutant("a capture may land inside a non-causal item", m2_spec, m2_impl, ("kv",)),
    "P1": Mutant("begin resumes inside an edge without splitting it", p1_spec, p1_impl, ("kv", "kv_win")),
    "P2": Mutant("no compaction", p2_spec, p2_impl),
    "G1": Mutant("KV merge without the adjacency check, fed by a misplaced page-out", g1_spec, g1_impl),
    "G2": Mutant("a merge keeps the older last-used time", g2_spec, g2_impl),
    "E1": Mutant("no eviction", e1_spec, e1_impl),
    "E2": Mutant("the frontier is evictable", e2_spec, e2_impl),
    "E3": Mutant("most recently used first", e3_spec, e3_impl),
    "E4": Mutant("a single-child victim is dropped and its child re-hung unmerged", e4_spec, e4_impl),
    "E5": Mutant("without the matched checkpoint, resume at 0 instead of the newest survivor", e5_spec, e5_impl,
                 ("kv_rec", "hybrid")),
    "A1": Mutant("materialised bytes never reach the counter", a1_spec, a1_impl, ("kv", "kv_rec")),
    "A2": Mutant("spec: an evicted leaf's snapshots are never released; impl: a whole-state merge closes the "
                 "state it keeps", a2_spec, a2_impl, ("kv_rec", "hybrid")),
    "C1": Mutant("a non-causal item evaluated in two forwards (the M1 mutant, seen by the oracle)", m1_spec,
                 m1_impl, ("kv", "kv_rec")),
    "C2": Mutant("begin resumes one checkpoint below the match", c2_spec, c2_impl),
}


# ------------------------------------------------- weaker readings of a rule
# Second mutants for rules whose first mutant breaks them bluntly: each is a reading of the rule
# that a predicate stated too weakly once let through (docs/spec.md, "Weaker readings").
def e3_path_spec(mp):                        # the seed's eviction bug: the whole active path protected
    wrap(mp, SpecCache, "evictable", lambda orig: lambda self, n: orig(self, n) and n not in self.path)


def e3_path_impl(mp):
    wrap(mp, ipc.PrefixCache, "evictable", lambda orig: lambda self, n: orig(self, n) and n not in self.path)


def s4_head_spec(mp):                        # a split head gets no KV halves
    def strip(store, node, head):
        for i in list(head.snaps):
            store.release(store.disown(head, i))
    after_split(mp, Trie, strip)


def s4_head_impl(mp):
    def strip(trie, node, head):
        for i, s in enumerate(head.snaps):
            if s is not None:
                trie.disown(head, i).release()
    after_split(mp, ImplTrie, strip)


def p2_user_spec(mp):                        # compaction ignores the user flag
    def compact(self):
        i = 1
        while i < len(self.path) - 1:
            n = self.path[i]
            if len(n.children) == 1 and all(self.layers[k].kind == KV for k in n.snaps):
                self.path.remove(n.children[0])
                self.trie.merge_with_child(n)
            else:
                i += 1
    mp.setattr(SpecCache, "compact", compact)


def p2_user_impl(mp):
    def compact(self):
        i = 1
        while i < len(self.path) - 1:
            n = self.path[i]
            if len(n.children) == 1 and all(s is None or s.kind == "kv" for s in n.snaps):
                self.path.remove(next(iter(n.children.values())))
                self.trie.merge_with_child(n)
            else:
                i += 1
        self.settled.compacted = self.root
    mp.setattr(ipc.PrefixCache, "_compact", compact)


def g2_copy_spec(mp):                        # two lazy views merge into an owned copy
    def merge_snapshots(orig):
        def m(store, a, b):
            out = orig(store, a, b)
            if out is not None and out.kind == KV and out.lazy:
                out.lazy = False
            return out
        return m
    wrap(mp, Trie, "merge_snapshots", merge_snapshots)


def g2_copy_impl(mp):
    def merge(orig):
        def m(cache, a, b):
            out = orig(cache, a, b)
            if out is not None and out.lazy:
                out._materialise()
            return out
        return m
    wrap(mp, KVCache, "merge_snapshots", merge)


def s2_match_spec(mp):                       # begin schedules no capture at the match
    import spec.cache as scache
    real = scache.schedule
    mp.setattr(scache, "schedule", lambda n, resume, matched, *rest: real(n, resume, resume, *rest))


def s2_match_impl(mp):
    real = ipc.schedule
    mp.setattr(ipc, "schedule", lambda n, resume, matched, *rest: real(n, resume, resume, *rest))


WEAKER = {
    "E3 path": ("E3", Mutant("the whole active path protected (the seed's eviction bug), with the budget met "
                             "off the path", e3_path_spec, e3_path_impl)),
    "S4 head": ("S4", Mutant("a split head gets no KV halves", s4_head_spec, s4_head_impl, ("kv", "kv_win"))),
    "P2 user": ("P2", Mutant("compaction merges user nodes too", p2_user_spec, p2_user_impl, ("kv",))),
    "G2 copy": ("G2", Mutant("two lazy views merge into an owned copy", g2_copy_spec, g2_copy_impl)),
    "S2 match": ("S2", Mutant("a begin below the match schedules no capture there", s2_match_spec, s2_match_impl,
                              ("kv_rec", "hybrid"))),
}
