"""Scenario tests for P1-P2 (resume inside an edge) and G1-G2 (merging)."""
from __future__ import annotations

import pytest
from spec_helpers import HYBRID, KV_REC, KV_WIN, PURE_KV, begin, finish, ok, run, tree

from spec.cache import PrefixCache
from spec.rules import check_step
from spec.view import Op
from spec.trie import KV, MergeError


def stored(layers=PURE_KV):
    pc = PrefixCache(layers)
    run(pc, list(range(1, 9)), [9, 10])
    return pc


def test_p1_resume_inside_an_edge_splits_at_the_live_offset():
    pc = stored()
    old = pc.frontier
    assert begin(pc, [1, 2, 3, 4, 5, 6, 30]) == (6, 6)
    head = pc.frontier
    assert tree(pc) == [
        "[0,4) 1 2 3 4 | 0:kv~ 1:kv~ | user",
        "  [4,6) 5 6 | 0:kv~ 1:kv~ *",
        "    [6,9) 7 8 9 | 0:kv~ 1:kv~",
    ]
    assert head.children == [old] and (old.start, old.end) == (6, 9)
    assert head.last_used == pc.clock > old.last_used          # the head is touched, the tail is not
    finish(pc, [1, 2, 3, 4, 5, 6, 30], [31])


def test_p1_no_split_when_a_layer_cannot_rewind_into_the_edge():
    pc = stored(KV_REC)                       # recurrent: resume at the checkpoint 4 instead
    assert begin(pc, [1, 2, 3, 4, 5, 6, 30]) == (6, 4)
    assert tree(pc) == [
        "[0,4) 1 2 3 4 | 0:kv~ 1:rec | user *",
        "  [4,9) 5 6 7 8 9 | 0:kv~ 1:rec",
    ]


def test_p1_windowed_layer_splits_only_while_unwrapped():
    pc = PrefixCache(KV_WIN)                  # window 6
    run(pc, [1, 2, 3, 4, 5, 6, 7, 8, 9], [10, 11])
    assert tree(pc)[-1] == "  [5,10) 6 7 8 9 10 | 0:kv~ 1:win *"
    assert begin(pc, [1, 2, 3, 4, 5, 6, 7, 40]) == (7, 5)    # wrapped: back to the checkpoint at 5


def test_p2_following_the_edge_again_merges_the_halves_back():
    pc = stored()
    assert begin(pc, [1, 2, 3, 4, 5, 6, 7, 8]) == (7, 7)     # full match backs off by one: split at 7
    assert tree(pc)[1:] == ["  [4,7) 5 6 7 | 0:kv~ 1:kv~ *", "    [7,9) 8 9 | 0:kv~ 1:kv~"]
    finish(pc, [1, 2, 3, 4, 5, 6, 7, 8], [9, 50])              # decodes 8, 9: follows the tail
    assert tree(pc) == [
        "[0,4) 1 2 3 4 | 0:kv~ 1:kv~ | user",
        "  [4,9) 5 6 7 8 9 | 0:kv~ 1:kv~ *",           # on the active path: views of the live rows
    ]


def test_g1_non_adjacent_kv_snapshots_refuse_to_merge():
    pc = stored()
    store = pc.trie
    a = store.new_snapshot(layer=0, kind=KV, start=0, end=4, content=(1, 2, 3, 4))
    b = store.new_snapshot(layer=0, kind=KV, start=6, end=9, content=(7, 8, 9))
    assert a.end != b.start
    with pytest.raises(MergeError, match="G1"):
        store.merge_snapshots(a, b)
    c = store.new_snapshot(layer=0, kind=KV, start=4, end=6, content=(5, 6))
    assert store.merge_snapshots(a, c).content == (1, 2, 3, 4, 5, 6)


def test_g2_merge_with_child():
    pc = PrefixCache(HYBRID)
    run(pc, list(range(1, 11)), [11, 12, 13])
    node = pc.path[1]
    child = node.children[0]
    whole = {i: s for i, s in child.snaps.items() if s.kind != KV}
    before = pc.view()
    pc.trie.merge_with_child(node)
    assert check_step(before, Op("merge"), pc.view()) == []
    assert node.snaps[0].lazy and (node.snaps[0].start, node.snaps[0].end) == (0, 12)   # two views: no copy
    assert all(node.snaps[i] is s for i, s in whole.items())                           # child's whole-state
    pc.path.remove(child)
    ok(pc)


def test_g2_whole_state_survives_a_parent_without_one():
    """The split head has KV only; merging it into its tail keeps the tail's state."""
    pc = PrefixCache(KV_WIN)
    run(pc, [1, 2, 3, 4, 5], [6, 7])
    begin(pc, [1, 2, 3, 4, 30])
    head = pc.frontier
    tail_state = head.children[0].snaps[1]
    pc.trie.merge_with_child(head)
    assert head.snaps[1] is tail_state and head.end == 6
