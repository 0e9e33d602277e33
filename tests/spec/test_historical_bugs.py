"""The seed's historical bugs, each re-created as a test-only variant of the
faulty operation (pytest's monkeypatch; no flag in spec code), and shown to
be flagged by the rule predicates or refused by the operation's own error.
Each bug test is paired with the fixed behaviour on the same scenario."""
from __future__ import annotations

import pytest
from spec_helpers import HYBRID, KV_REC, PURE_KV, begin, finish, ok, op_rules, rules, run, tree

import spec.cache
import spec.plan
from spec.cache import PrefixCache
from spec.media import MediaItem
from spec.trie import KV, MergeError, Trie, walk


# ------------------------------------------------------------------ S3
def page_out_skipping_nodes_with_any_snapshot(original):
    def page_out(self, node):
        if node.snaps:                      # the bug: "already paged out"
            return
        original(self, node)
    return page_out


def response_prefix_of_stored(pc):
    prompt = [1, 2, 3, 4, 5, 6]
    run(pc, prompt, [7, 8, 9, 10])
    pc.begin(prompt)
    pc.prefill()
    for k in (6, 7):
        pc.step(k)
    pc.close()                              # lands on [5,7), a head split off [2,9): KV only


def test_s3_bug_page_out_skips_a_split_head(monkeypatch):
    monkeypatch.setattr(PrefixCache, "page_out", page_out_skipping_nodes_with_any_snapshot(PrefixCache.page_out))
    pc = PrefixCache(HYBRID)
    response_prefix_of_stored(pc)
    assert rules(pc) == {"S3"}
    assert tree(pc)[2] == "    [5,7) 6 7 | 0:kv~ *"       # windowed and recurrent state lost
    run_unchecked(pc, [50, 51, 52], [53])                     # another conversation, then back:
    assert pc.begin([1, 2, 3, 4, 5, 6, 7, 60]) == (7, 5)      # re-prefills from the branch-point capture at 5


def test_s3_fixed_page_out_captures_the_missing_layers():
    pc = PrefixCache(HYBRID)
    response_prefix_of_stored(pc)
    ok(pc)
    assert tree(pc)[2] == "    [5,7) 6 7 | 0:kv~ 1:win 3:rec *"
    run(pc, [50, 51, 52], [53])
    assert begin(pc, [1, 2, 3, 4, 5, 6, 7, 60]) == (7, 7)


# ------------------------------------------------------------- M1-M3
IMG = MediaItem(pos=2, length=4, data=b"img")
TOKENS = [1, 2, 0, 0, 0, 0, 7, 8]


def identity(x, spans):
    return x


def test_m2_bug_capture_inside_an_item(monkeypatch):
    monkeypatch.setattr(spec.plan, "capture_ceiling", identity)
    pc = PrefixCache(PURE_KV, near_end=3)
    pc.begin(TOKENS, [IMG])
    assert pc.request.schedule == [(5, True)]
    assert rules(pc) == {"M2"}


def test_m2_bug_whole_state_capture_inside_a_forward_is_refused(monkeypatch):
    monkeypatch.setattr(spec.plan, "capture_ceiling", identity)
    pc = PrefixCache(KV_REC, near_end=3)
    pc.begin(TOKENS, [IMG])
    with pytest.raises(AssertionError, match="whole-state capture at 5 inside forward"):
        pc.prefill()


def m3_trie():
    """The only trie where a match can end inside an item (a fold hashes bytes, dims, run length
    and causality): a boundary inside IMG left by an older version, what followed evicted."""
    pc = PrefixCache(PURE_KV, near_end=0)
    run(pc, TOKENS, [9, 10], [IMG])
    run(pc, [5, 6, 7], [8])                                   # the frontier moves elsewhere
    head = pc.trie.split(pc.root.child_starting_with(1), 4)  # boundary strictly inside IMG [2, 6)
    for n in reversed(list(walk(head.children[0]))):
        pc.trie.remove_leaf(n)
    return pc


def test_m3_bug_match_inside_an_item_not_moved_to_its_start(monkeypatch):
    tokens = [1, 2, 0, 0, 0, 0, 3, 4]                         # the same item, another tail
    monkeypatch.setattr(spec.cache, "resume_floor", identity)
    pc = m3_trie()
    matched, resume = pc.begin(tokens, [IMG])
    assert (matched, resume) == (4, 2)       # begin's resume search still avoids the item ...
    assert rules(pc) == {"M2"}               # ... but the branch-point capture lands inside it
    monkeypatch.undo()
    fixed = m3_trie()
    assert fixed.begin(tokens, [IMG]) == (2, 2)
    assert rules(fixed) == {"M2"}            # only the legacy node ending inside the item (M2), no M3


def test_m1_bug_chunk_ends_inside_an_item_gives_broken_content(monkeypatch):
    monkeypatch.setattr(spec.plan, "extend_chunk", identity)
    pc = PrefixCache(PURE_KV, chunk=3, near_end=0)
    pc.begin(TOKENS, [IMG])
    pc.prefill()
    assert pc.request.chunks == [(0, 3), (3, 6), (6, 7)]
    assert rules(pc) == {"M1", "C1"}                          # positions 2..5 evaluated in two halves


# ------------------------------------------------------------------ P1
def begin_dropping_the_resumed_node(monkeypatch):
    """The historical begin: a node resumed partway is dropped from the path
    (frontier = its parent) and keeps its stale last-used time."""
    original, real_split, real_evict = PrefixCache.begin, Trie.split, PrefixCache.evict

    def begin(self, tokens, media=(), **kw):
        splits = []

        def spy(store, node, at):
            splits.append(real_split(store, node, at))
            return splits[-1]

        monkeypatch.setattr(Trie, "split", spy)
        monkeypatch.setattr(PrefixCache, "evict", lambda self: None)   # evict after the path is settled
        try:
            result = original(self, tokens, media, **kw)
        finally:
            monkeypatch.setattr(Trie, "split", real_split)
            monkeypatch.setattr(PrefixCache, "evict", real_evict)
        head = self.frontier
        if splits and head is splits[0]:
            stale = head.children[0].last_used
            self.path.pop()
            self.trie.merge_with_child(head)                 # the node as it was, untouched
            head.last_used = stale
        self.evict()
        return result

    monkeypatch.setattr(PrefixCache, "begin", begin)


def attach_keeping_short_captures(monkeypatch):
    """The historical attach: a capture is put on the node ending at its
    offset even when that node's edge begins before the capture."""
    def attach(self):
        req = self.request
        for cap in req.pending:
            node = self.advance(cap.offset)
            node.user = node.user or cap.user
            for i, s in sorted(cap.snaps.items()):
                if i in node.snaps:
                    self.trie.release(s)
                else:
                    self.trie.own(node, s)
            self.touch(node)
            self.compact()
        req.pending = []
        self.evict()
    monkeypatch.setattr(PrefixCache, "attach", attach)


def merge_snaps_without_g1(monkeypatch):
    def merge_snapshots(self, a, b):
        if a is None or b is None or a.kind != KV:
            return original(self, a, b)
        merged = self.new_snapshot(layer=a.layer, kind=KV, start=a.start, end=b.end,
                               content=a.content + b.content, lazy=a.lazy and b.lazy)
        self.release(a)
        self.release(b)
        return merged
    original = Trie.merge_snapshots
    monkeypatch.setattr(Trie, "merge_snapshots", merge_snapshots)


def restore_keeping_owned_copies(monkeypatch):
    """The seed's restore: an owned snapshot written back into the live rows stayed owned (both copies
    counted), the byte pressure under which its P1 bug evicted the stale node and merged across G1."""
    original = PrefixCache.restore

    def restore(self, path, x, common, keys):
        owned = [(i, n.snaps[i]) for n in path[1:] for i in n.snaps if not n.snaps[i].lazy]
        original(self, path, x, common, keys)
        for i, s in owned:
            if s.lazy:
                s.lazy = False
                self.trie.counter += s.size(self.layers[i])
    monkeypatch.setattr(PrefixCache, "restore", restore)
    monkeypatch.setattr(PrefixCache, "adopt_path", lambda self: None)


def stored_with_bytes(budget):
    pc = PrefixCache(PURE_KV, budget=budget)
    run(pc, list(range(1, 9)), [9, 10])                       # [0,4) user, [4,9)
    run(pc, [20, 21, 22, 23, 24, 25, 26, 27, 28, 29], [30])   # overwrites the live rows: views materialise
    return pc


RESUME_INSIDE = [1, 2, 3, 4, 5, 6, 30, 31, 32, 33, 34]        # match 6 inside [4,9); capture at 7


def test_p1_bug_resumed_node_dropped_from_the_path(monkeypatch):
    begin_dropping_the_resumed_node(monkeypatch)
    pc = stored_with_bytes(budget=60)
    assert op_rules(pc, "begin", RESUME_INSIDE) == {"T3", "P1"}
    assert pc.request.resume == 6 and pc.frontier.end == 4


def bug_request(pc):
    assert op_rules(pc, "begin", RESUME_INSIDE) == {"T3", "P1"}
    assert [n.edge for n in pc.root.children[0].children] == []    # the stale [4,9) was evicted first
    pc.prefill()
    node = pc.root.children[0].children[0]
    assert (node.start, node.end, node.snaps[0].start) == (4, 7, 6)  # rebuilt from 4, capture from 6
    assert rules(pc) == {"S1"}
    pc.step(34)
    pc.close()
    assert rules(pc) == {"S1"}


def test_p1_bug_then_eviction_merge_is_refused_by_g1(monkeypatch):
    begin_dropping_the_resumed_node(monkeypatch)
    attach_keeping_short_captures(monkeypatch)
    restore_keeping_owned_copies(monkeypatch)
    pc = stored_with_bytes(budget=44)
    bug_request(pc)
    with pytest.raises(MergeError, match=r"G1: KV snapshots \[0, 4\) and \[6, 7\) are not adjacent"):
        pc.set_budget(0)                                       # [0,4) merges into [4,7): refused


def test_p1_bug_without_g1_merges_non_adjacent_ranges_silently(monkeypatch):
    begin_dropping_the_resumed_node(monkeypatch)
    attach_keeping_short_captures(monkeypatch)
    merge_snaps_without_g1(monkeypatch)
    restore_keeping_owned_copies(monkeypatch)
    pc = stored_with_bytes(budget=44)
    bug_request(pc)
    pc.set_budget(30)
    merged = pc.root.children[0]
    assert (merged.start, merged.end, merged.snaps[0].start, merged.snaps[0].end) == (0, 7, 0, 7)
    assert merged.snaps[0].content == (1, 2, 3, 4, 30)         # five rows claiming to be seven
    assert "S1" in rules(pc)
    pc.set_budget(1 << 40)
    pc.begin([20, 21, 22])                                     # go elsewhere, then come back
    pc.close()
    pc.begin([1, 2, 3, 4, 5, 6, 30, 99])                       # "a hit" on the corrupt range
    assert pc.request.resume == 7
    assert {"S1", "C1"} <= rules(pc)


def test_p1_fixed_head_on_path_tail_evicted_first():
    pc = stored_with_bytes(budget=44)
    assert begin(pc, RESUME_INSIDE) == (6, 6)
    finish(pc, RESUME_INSIDE, [35])
    pc.set_budget(0)
    ok(pc)
    pc.set_budget(1 << 40)
    run(pc, [20, 21, 22], [23])
    assert run(pc, [1, 2, 3, 4, 5, 6, 30, 99], [1]) == (7, 7)


# ------------------------------------------------------------------ E2
def evictable_protecting_the_active_path(original):
    def evictable(self, n):
        return original(self, n) and n not in self.path
    return evictable


def conversation(pc, turns):
    conv, counters = [], []
    for t in range(turns):
        prompt = conv + [100 + t, 1, 5, 6]
        gen = [200 + t, 2, 3]
        run_unchecked(pc, prompt, gen)
        counters.append(pc.trie.counter)
        conv = prompt + gen
    return counters


def run_unchecked(pc, tokens, gen):
    pc.begin(tokens)
    pc.prefill()
    pc.step(tokens[-1])
    for g in gen[:-1]:
        pc.step(g)
    pc.close()


def test_e2_bug_whole_active_path_protected_grows_without_bound(monkeypatch):
    monkeypatch.setattr(PrefixCache, "evictable", evictable_protecting_the_active_path(PrefixCache.evictable))
    pc = PrefixCache(KV_REC, budget=40, near_end=2)
    counters = conversation(pc, 50)
    assert counters[10::10] == [220, 420, 620, 820] and counters[-1] == 1000  # keeps rising
    assert rules(pc) == {"E1"}


def test_e2_fixed_conversation_plateaus_at_the_budget():
    pc = PrefixCache(KV_REC, budget=40, near_end=2)
    counters = conversation(pc, 50)
    assert counters[:3] == [20, 40, 40] and set(counters[1:]) == {40}
    ok(pc)
