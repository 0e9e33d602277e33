"""Weaker readings of a rule: second mutants for rules whose first mutant breaks them bluntly, each
a reading of the rule that a predicate stated too weakly once let through (docs/spec.md, "Weaker
readings"; tests/power/mutants.py lists them)."""
from __future__ import annotations

import impl.prefix_cache as ipc
from impl.caches.kv import KVCache
from impl.trie import Trie as ImplTrie
from spec.cache import PrefixCache as SpecCache
from spec.trie import KV, Trie
from tests.power.patching import after_split, wrap


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
