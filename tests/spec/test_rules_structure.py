"""Scenario tests for T1-T3 and S1-S4, written as a user of the spec: drive
requests per the driver convention, assert the exact trie and `check == []`."""
from __future__ import annotations

from spec_helpers import KV_REC, KV_WIN, PURE_KV, begin, finish, run, tree

from spec.cache import PrefixCache
from spec.trie import KV, walk


def test_t1_offsets_chain_through_a_split(hybrid):
    assert run(hybrid, list(range(1, 11)), [11, 12, 13]) == (0, 0)
    assert tree(hybrid) == [
        "[0,6) 1 2 3 4 5 6 | 0:kv~ 1:win 3:rec | user",
        "  [6,12) 7 8 9 10 11 12 | 0:kv~ 1:win 3:rec *",
    ]
    assert hybrid.trie.counter == 56          # 2 * (6 + 6) windowed rows + 2 * 10 recurrent, KV lazy
    assert run(hybrid, [1, 2, 3, 4, 5, 20], [21, 22]) == (5, 0)
    assert tree(hybrid) == [
        "[0,2) 1 2 | 0:kv~ 1:win 3:rec | user",           # the active path's KV: views of the live rows
        "  [2,5) 3 4 5 | 0:kv~ 1:win 3:rec",
        "    [5,6) 6 | 0:kv 1:win 3:rec | user",
        "      [6,12) 7 8 9 10 11 12 | 0:kv 1:win 3:rec",
        "    [5,7) 20 21 | 0:kv~ 1:win 3:rec *",
    ]
    for n in walk(hybrid.root):
        for c in n.children:
            assert c.parent is n and c.start == n.end and len(c.edge) == c.end - c.start


def test_t2_siblings_have_distinct_first_keys():
    pc = PrefixCache(PURE_KV)
    run(pc, [1, 2, 3, 4], [5])
    run(pc, [1, 2, 7, 8], [9])
    run(pc, [1, 2, 3, 9], [9])
    run(pc, [1, 2, 7, 8, 1], [2])    # follows the 7-branch: no new sibling
    assert tree(pc) == [
        "[0,2) 1 2 | 0:kv~ 1:kv~",
        "  [2,3) 3 | 0:kv 1:kv",
        "    [3,4) 4 | 0:kv 1:kv",
        "    [3,4) 9 | 0:kv 1:kv",
        "  [2,5) 7 8 1 | 0:kv~ 1:kv~ *",                # restored: a view of the live rows again
    ]
    firsts = [c.edge[0] for c in pc.root.children[0].children]
    assert firsts == [3, 7]


def test_t3_one_live_offset_and_frontier_at_it(hybrid):
    run(hybrid, list(range(1, 11)), [11, 12, 13])
    matched, resume = begin(hybrid, list(range(1, 9)) + [40])
    assert (matched, resume) == (8, 6)         # whole-state checkpoint at 6 only
    assert hybrid.offset == 6 and hybrid.frontier.end == 6
    assert [len(hybrid.live[i]) for i in (0, 1, 3)] == [6, 6, 6]
    finish(hybrid, list(range(1, 9)) + [40], [41])
    assert hybrid.offset == hybrid.frontier.end == 9      # one produced token: nothing decoded past the seed
    assert [(n.start, n.end) for n in hybrid.path] == [(0, 0), (0, 6), (6, 8), (8, 9)]
    assert tree(hybrid)[1:] == [
        "  [6,8) 7 8 | 0:kv~ 1:win 3:rec",
        "    [8,12) 9 10 11 12 | 0:kv 1:win 3:rec",
        "    [8,9) 40 | 0:kv~ 1:win 3:rec *",
    ]


def test_s1_kv_snapshots_cover_exactly_their_edges():
    pc = PrefixCache(PURE_KV)
    run(pc, list(range(1, 9)), [9, 10])
    run(pc, [1, 2, 3, 4, 5, 6, 30], [31])
    for n in walk(pc.root):
        for i, s in n.snaps.items():
            assert (s.start, s.end) == (n.start, n.end)
            assert s.content == n.path_keys()[n.start:n.end]
    assert tree(pc) == [
        "[0,4) 1 2 3 4 | 0:kv~ 1:kv~ | user",
        "  [4,6) 5 6 | 0:kv~ 1:kv~",
        "    [6,9) 7 8 9 | 0:kv 1:kv",
        "    [6,7) 30 | 0:kv~ 1:kv~ *",
    ]
    assert pc.trie.counter == 9             # the tail [6,9) materialised before slot 6 was overwritten


def test_s2_whole_state_at_node_end_and_capture_at_match():
    pc = PrefixCache(KV_REC)
    run(pc, list(range(1, 9)), [9, 10])
    assert tree(pc) == [
        "[0,4) 1 2 3 4 | 0:kv~ 1:rec | user",
        "  [4,9) 5 6 7 8 9 | 0:kv~ 1:rec *",
    ]
    # match 6 lies inside [4,9) where the recurrent layer has no state: resume at the checkpoint 4
    assert begin(pc, [1, 2, 3, 4, 5, 6, 30]) == (6, 4)
    assert pc.request.schedule == [(6, False)]          # capture at the match, not a user node
    finish(pc, [1, 2, 3, 4, 5, 6, 30], [31])
    assert tree(pc) == [
        "[0,4) 1 2 3 4 | 0:kv~ 1:rec | user",
        "  [4,6) 5 6 | 0:kv~ 1:rec",
        "    [6,9) 7 8 9 | 0:kv 1:rec",
        "    [6,7) 30 | 0:kv~ 1:rec *",
    ]
    for n in walk(pc.root):
        for i, s in n.snaps.items():
            if s.kind != KV:
                assert s.start == s.end == n.end and s.content == n.path_keys()
    # the next request diverging at 6 now resumes exactly there
    assert begin(pc, [1, 2, 3, 4, 5, 6, 50]) == (6, 6)


def test_s3_close_on_a_split_head_pages_out_the_missing_layers(hybrid):
    """A response that is a prefix of a stored response: close lands on a head
    split off an existing edge, which has KV from the split and nothing else."""
    prompt = [1, 2, 3, 4, 5, 6]
    run(hybrid, prompt, [7, 8, 9, 10])
    assert tree(hybrid) == [
        "[0,2) 1 2 | 0:kv~ 1:win 3:rec | user",
        "  [2,9) 3 4 5 6 7 8 9 | 0:kv~ 1:win 3:rec *",
    ]
    assert run(hybrid, prompt, [7, 8]) == (5, 2)
    assert tree(hybrid) == [
        "[0,2) 1 2 | 0:kv~ 1:win 3:rec | user",
        "  [2,5) 3 4 5 | 0:kv~ 1:win 3:rec",              # the branch-point capture at 5 stays (P2)
        "    [5,7) 6 7 | 0:kv~ 1:win 3:rec *",
        "      [7,9) 8 9 | 0:kv 1:win 3:rec",
    ]
    assert begin(hybrid, prompt + [7, 60]) == (7, 7)    # the head's state is usable


def test_s4_split_head_gets_kv_halves_whole_state_stays_on_tail():
    pc = PrefixCache(KV_WIN)
    run(pc, [1, 2, 3, 4, 5], [6, 7])
    tail = pc.frontier
    assert begin(pc, [1, 2, 3, 4, 30]) == (4, 4)        # window 6 not wrapped: P1 split at 4 (S4, P1 checked)
    head = pc.frontier
    assert head.children == [tail]
    assert tree(pc) == [
        "[0,1) 1 | 0:kv~ 1:win | user",
        "  [1,4) 2 3 4 | 0:kv~ *",
        "    [4,6) 5 6 | 0:kv~ 1:win",
    ]
    finish(pc, [1, 2, 3, 4, 30], [31])
