"""Scenario tests for M1-M3: non-causal media items are evaluated in one
forward, captures land at their end, resumes at their start; causal items
carry no restriction."""
from __future__ import annotations

import inspect

from spec_helpers import KV_REC, PURE_KV, begin, finish, ok, op_rules, rules, tree

from spec.cache import PrefixCache
from spec.media import FOLD_BIT, MediaItem
from spec.rules import c1_cold_equivalence
from spec.trie import Trie, walk

IMG = MediaItem(pos=2, length=4, data=b"img")
TOKENS = [1, 2, 0, 0, 0, 0, 7, 8]


def test_m1_chunk_never_ends_inside_a_noncausal_item():
    pc = PrefixCache(KV_REC, chunk=2, near_end=0)
    begin(pc, TOKENS, [IMG])
    pc.prefill()
    ok(pc)
    assert pc.request.chunks == [(0, 2), (2, 6), (6, 7)]     # 2 -> 4 extended to the item's end
    finish_rest(pc, TOKENS, [9])


def test_m1_causal_item_may_be_split():
    pc = PrefixCache(KV_REC, chunk=2, near_end=0)
    begin(pc, TOKENS, [MediaItem(pos=2, length=4, data=b"img", causal=True)])
    pc.prefill()
    ok(pc)
    assert pc.request.chunks == [(0, 2), (2, 4), (4, 6), (6, 7)]
    finish_rest(pc, TOKENS, [9])


def test_m2_capture_inside_an_item_lands_at_its_end():
    pc = PrefixCache(KV_REC, chunk=2, near_end=3)
    begin(pc, TOKENS, [IMG])
    assert pc.request.schedule == [(6, True)]                # 8 - 3 = 5 is inside [2, 6)
    finish(pc, TOKENS, [9, 10])
    fold = IMG.fold
    assert fold & FOLD_BIT
    assert tree(pc) == [
        f"[0,6) 1 2 {fold} {fold} {fold} {fold} | 0:kv~ 1:rec | user",
        "  [6,9) 7 8 9 | 0:kv~ 1:rec *",
    ]


def test_m3_match_ending_inside_an_item_resumes_at_its_start():
    """A fold hashes bytes, dims, run length and causality, so a match ends inside an item only in a
    trie an older version left behind: a boundary inside the item (a capture there) with what
    followed evicted. Build that state, then ask for the same item with another tail."""
    pc = PrefixCache(PURE_KV, near_end=0)
    begin(pc, TOKENS, [IMG])
    finish(pc, TOKENS, [9, 10])
    begin(pc, [5, 6, 7], [])
    finish(pc, [5, 6, 7], [8])                               # the frontier moves elsewhere
    node = pc.root.child_starting_with(1)
    head = pc.trie.split(node, 4)                           # a boundary strictly inside IMG [2, 6)
    for n in reversed(list(walk(head.children[0]))):
        pc.trie.remove_leaf(n)
    tokens = [1, 2, 0, 0, 0, 0, 3, 4]                        # the same item, another tail
    assert op_rules(pc, "begin", tokens, media=[IMG]) == {"M2"}   # only the legacy node inside IMG
    assert pc.request.resume == 2                            # match 4 is inside IMG: back to its start
    assert pc.frontier.end == 2
    assert pc.live[0] == (1, 2)                              # nothing of the item is reused
    pc.prefill()
    assert not c1_cold_equivalence(pc)                       # the item evaluated whole


def finish_rest(pc, tokens, gen):
    pc.step(tokens[-1])
    for g in gen[:-1]:
        pc.step(g)
    pc.close()
    ok(pc)


def test_s1_clip_is_reached_when_a_fold_ignores_run_length(monkeypatch):
    """The clip in attach (a KV capture that starts before its node) is reachable: with the seed's old
    fold, which hashes the bytes only, a stored shorter run of an item leaves a node ending inside a
    longer run of the same bytes; the next capture spans that boundary and is clipped to its node
    (the stateful tests reach it the same way, with bytes-only media items)."""
    clipped = []
    real = Trie.split_snapshot

    def spy(store, snap, at):
        if inspect.stack()[1].function == "attach":
            clipped.append((snap.start, at, snap.end))
        return real(store, snap, at)
    monkeypatch.setattr(Trie, "split_snapshot", spy)
    fold = FOLD_BIT | 5                                     # the same key for runs of any length
    pc = PrefixCache(PURE_KV[:1], near_end=2, chunk=8)
    for keys, spans in (((1, fold, fold, 2), [(1, 3)]), ((1, fold, fold, fold, fold, 2, 3), [(1, 5)])):
        pc.begin_keys(keys, spans)
        pc.prefill()
        pc.step(keys[-1])
        pc.close()
    assert clipped == [(1, 3, 5)], clipped                  # the capture [1, 5) clipped at the node's start 3
    assert rules(pc) == set()
