"""Policy mutants of the trie's structure, snapshot coverage, media and resume rules (T, S, M, P):
one patch of the spec and one of impl per rule (tests/power/mutants.py lists them)."""
from __future__ import annotations

import impl.prefix_cache as ipc
import spec.plan as splan
from impl.caches.base import WholeStateCache
from impl.trie import Trie as ImplTrie
from spec.cache import PrefixCache as SpecCache
from spec.trie import KV, Trie
from tests.power.patching import after_split, wrap


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
