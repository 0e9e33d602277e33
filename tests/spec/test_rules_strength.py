"""Readings of a rule weaker than REFERENCE's words, each flagged by the rule's own predicate.

Each test runs the spec with one policy changed to the weaker reading, judges the operation that
shows it by the predicates alone (check + check_step over the views), and also runs the unchanged
spec through the same operations with no violation: the predicate tells the two apart.
"""
from __future__ import annotations

from spec.cache import PrefixCache
from spec.rules import check, check_step
from spec.rules_eviction import deepest_restore
from spec.trie import KV, Layer, Trie
from spec.view import Op

KV_REC = (Layer("kv", 1), Layer("recurrent", 10))
TWO_KV = (Layer("kv", 1), Layer("kv", 1))


class Judged:
    """A spec cache whose every operation is judged; `found` collects the violations by rule."""

    def __init__(self, pc):
        self.pc, self.found = pc, []

    def do(self, name, fn, *args, op_args=None):
        before, seen = self.pc.view(), len(self.pc.victims)
        out = fn(*args)
        after = self.pc.view()
        op = Op(name, op_args if op_args is not None else args, tuple(out) if name == "begin" else None,
                tuple(self.pc.victims[seen:]))
        self.found += check(after) + check_step(before, op, after)
        return out

    def request(self, keys, gen, boundaries=()):
        keys = tuple(keys)
        out = self.do("begin", lambda: self.pc.begin_keys(keys, [], boundaries), op_args=(keys, ()))
        self.do("prefill", self.pc.prefill)
        for k in (keys[-1],) + tuple(gen[:-1]):
            self.do("step", self.pc.step, k)
        self.do("close", self.pc.close)
        return out

    def rules(self) -> set:
        return {v.rule for v in self.found}


def _two_conversations(cls):
    j = Judged(cls(KV_REC, interval=0, near_end=0, chunk=100))
    a = (1, 2, 3, 4, 5, 6)
    j.request(a, (7, 8), boundaries=(3,))          # conversation A: checkpoints at 3 and at its end
    j.request((9, 9, 9, 9), (9,))                  # conversation B, used after A's first turn
    j.request(a + (7, 8, 10, 11), (12,))           # A's next turn: its old checkpoints are on the path
    return j


def test_e3_protecting_the_whole_active_path_is_flagged_even_when_the_budget_is_met():
    """The seed's eviction bug: the active path protected. Here the budget is met by evicting B, so E1
    stays quiet; E3 sees that A's older checkpoint (1 2 3), on the path but not protected, survived."""
    class PathProtected(PrefixCache):
        def evictable(self, n):
            return super().evictable(n) and n not in self.path

    for cls, want in ((PrefixCache, set()), (PathProtected, {"E3"})):
        j = _two_conversations(cls)
        assert j.rules() == set(), j.found
        j.do("set_budget", j.pc.set_budget, j.pc.trie.counter - 1)
        assert j.rules() == want, (cls.__name__, j.found)


def test_g2_two_lazy_views_merged_into_a_copy_are_flagged(monkeypatch):
    """G2/E4: evicting a path node merges its lazy KV view with its child's by arithmetic; a copy
    (owned bytes where both parts owned none) is flagged when the operation wrote no live row."""
    j = _two_conversations(PrefixCache)
    j.do("set_budget", j.pc.set_budget, j.pc.trie.counter - 1)
    assert j.rules() == set(), j.found

    orig = Trie.merge_snapshots

    def copying(store, a, b):
        m = orig(store, a, b)
        if m is not None and m.kind == KV:
            m.lazy = False
        return m
    monkeypatch.setattr(Trie, "merge_snapshots", copying)
    j = _two_conversations(PrefixCache)
    j.do("set_budget", j.pc.set_budget, j.pc.trie.counter - 1)
    assert "G2" in j.rules(), j.found


def test_s4_a_split_head_without_its_kv_half_is_flagged(monkeypatch):
    """S4/P1: a P1 split gives the head the first half of every KV snapshot. A head left without
    them passes every state rule, and C2 cannot see it either (the trie serves less): S4 flags it."""
    def requests(j):
        j.request((1, 2, 3, 4, 5, 6, 7, 8), (9,))
        j.request((1, 2, 3, 4, 50, 51, 52), (53,))     # resumes inside the edge: split at 4

    j = Judged(PrefixCache(TWO_KV, interval=0, near_end=0, chunk=100))
    requests(j)
    assert j.rules() == set(), j.found

    orig = Trie.split

    def bare_head(store, node, at):
        head = orig(store, node, at)
        for i in list(head.snaps):
            store.release(store.disown(head, i))
        return head
    monkeypatch.setattr(Trie, "split", bare_head)
    j = Judged(PrefixCache(TWO_KV, interval=0, near_end=0, chunk=100))
    requests(j)
    assert "S4" in j.rules(), j.found


def test_p2_compaction_of_a_user_node_is_flagged():
    """P2: a user node (a message boundary's capture) resists compaction; merging it away is flagged
    even on a model without whole-state layers, where no checkpoint is lost."""
    class CompactsUser(PrefixCache):
        def compact(self):
            i = 1
            while i < len(self.path) - 1:
                n = self.path[i]
                if len(n.children) == 1 and all(self.layers[k].kind == KV for k in n.snaps):   # user ignored
                    self.path.remove(n.children[0])
                    self.trie.merge_with_child(n)
                else:
                    i += 1

    for cls, want in ((PrefixCache, set()), (CompactsUser, {"P2"})):
        j = Judged(cls((Layer("kv", 1),), near_end=0, chunk=100))
        j.request((1, 2, 3, 4, 5, 6), (7,), boundaries=(3,))
        assert j.rules() == want, (cls.__name__, j.found)


def test_c2_flags_a_resume_below_the_deepest_checkpoint_with_nothing_evicted():
    """C2 judges every begin: a resume below a checkpoint the trie serves is a C2 violation whether
    or not anything was evicted (E5 words the same case when the checkpoint is below the match)."""
    j = _two_conversations(PrefixCache)
    before = j.pc.view()
    keys = (1, 2, 3, 4, 5, 99, 98)
    assert deepest_restore(before, keys, ()) == (5, 3)
    op = Op("begin", (keys, ()), (5, 0))
    assert {v.rule for v in check_step(before, op, before)} == {"C2", "E5"}
    assert check_step(before, Op("begin", (keys, ()), (5, 3)), before) == []


def test_s2_a_begin_below_the_match_without_a_capture_there_is_flagged(monkeypatch):
    """S2 (REFERENCE: "begin schedules a capture at the match"): without it, every regeneration of
    the same prompt on a hybrid model resumes at 0, and C2 cannot see it (the trie serves 0)."""
    import spec.cache as cache_module

    def regenerations(j):
        j.request((1, 2, 3, 4, 5, 6, 7, 8), (9,))
        return [j.request((1, 2, 3, 4, 5, 60 + k, 61), (62,)) for k in range(2)]

    j = Judged(PrefixCache(KV_REC, interval=0, near_end=0, chunk=100))
    assert regenerations(j) == [(5, 0), (5, 5)] and j.rules() == set(), j.found

    real = cache_module.schedule
    monkeypatch.setattr(cache_module, "schedule", lambda n, resume, matched, *rest: real(n, resume, resume, *rest))
    j = Judged(PrefixCache(KV_REC, interval=0, near_end=0, chunk=100))
    assert regenerations(j) == [(5, 0), (5, 0)]
    assert j.rules() == {"S2"}, j.found
