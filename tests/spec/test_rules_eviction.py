"""Scenario tests for E1-E5: budget, protection, order, leaf removal vs
merge, and rewinding to an evicted turn."""
from __future__ import annotations

from spec_helpers import KV_REC, PURE_KV, begin, do, observe, ok, run, tree

from spec.cache import PrefixCache
from spec.rules import check_step, e2_evictable


def conversation(pc, turns):
    """A chat: each prompt is the whole history plus a new user turn."""
    conv, counters = [], []
    for t in range(turns):
        prompt = conv + [100 + t, 1, 5, 6]
        gen = [200 + t, 2, 3]
        run(pc, prompt, gen)
        counters.append(pc.trie.counter)
        conv = prompt + gen
    return conv, counters


def test_e1_e2_long_conversation_plateaus_at_the_budget():
    pc = PrefixCache(KV_REC, budget=40, near_end=2)
    _, counters = conversation(pc, 12)
    assert counters[:4] == [20, 40, 40, 40] and max(counters) == 40
    assert pc.trie.counter <= pc.budget
    assert tree(pc) == [
        "[0,72) " + " ".join(map(str, pc.path[1].edge)) + " | 0:kv~ 1:rec | user",
        "  [72,76) 5 6 210 2 | 0:kv~ 1:rec",                # turn 11's end: a checkpoint compaction keeps (P2)
        "    [76,79) 3 111 1 | 0:kv~ 1:rec | user",
        "      [79,83) 5 6 211 2 | 0:kv~ 1:rec *",
    ]


def test_e2_only_root_frontier_and_branch_points_are_protected():
    pc = PrefixCache(PURE_KV, near_end=0)
    run(pc, [1, 2, 3, 4, 5], [6])
    run(pc, [1, 2, 3, 9, 9], [6])
    branch = pc.root.children[0]
    assert len(branch.children) == 2
    v = pc.view()
    protected = [n.keys for n in v.walk() if not e2_evictable(v, n)]
    assert protected == [n.path_keys() for n in (pc.root, branch, pc.frontier)]
    assert all(pc.evictable(n) == e2_evictable(v, v.node(n.path_keys())) for n in pc.trie.nodes())


def test_e3_least_recently_used_first():
    pc = PrefixCache(PURE_KV, near_end=0)
    run(pc, [1, 2, 3], [4, 4])        # oldest
    run(pc, [5, 6, 7], [8, 8])
    run(pc, [9, 9, 9], [9, 9])        # frontier, protected
    first, second = pc.root.children[:2]
    assert first.last_used < second.last_used
    do(pc, "set_budget", pc.trie.counter - 1)
    assert [n.edge for n in pc.root.children] == [(5, 6, 7, 8), (9, 9, 9, 9)]


def test_e3_tie_on_time_deeper_first():
    pc = PrefixCache(PURE_KV, near_end=0)
    run(pc, [1, 2, 3], [4, 4])
    run(pc, [9, 9, 9], [9, 9])
    leaf = pc.root.children[0]
    head = pc.trie.split(leaf, 2)    # a split copies the time: head and tail tie on it
    assert head.last_used == leaf.last_used
    tail_keys = leaf.path_keys()
    before, op, after, _ = observe(pc, "set_budget", pc.trie.counter - 1)
    assert op.evicted[0] == tail_keys          # the tail ends deeper
    assert check_step(before, op, after) == []


def test_e3_tie_on_time_and_depth_larger_first():
    pc = PrefixCache(PURE_KV, near_end=1)                  # user nodes at 4
    run(pc, [1, 2, 3, 4, 0], [1])
    run(pc, [5, 6, 7, 8, 0], [1])                          # overwrites the live rows: the first materialises
    first, second = pc.root.children
    assert (first.end, second.end) == (4, 4)
    assert (pc.node_bytes(first), pc.node_bytes(second)) == (12, 0)
    first.last_used = second.last_used                     # force the tie on time
    assert pc.evict_order(first) < pc.evict_order(second)


def test_e4_leaf_removed_single_child_merged():
    pc = PrefixCache(KV_REC)                               # near_end 4: a user node at 2
    run(pc, [1, 2, 3, 4, 5, 6], [7, 7])
    run(pc, [9, 9, 9], [9, 9])
    assert tree(pc) == [
        "[0,2) 1 2 | 0:kv 1:rec | user",
        "  [2,7) 3 4 5 6 7 | 0:kv 1:rec",
        "[0,4) 9 9 9 9 | 0:kv~ 1:rec *",
    ]
    pc.set_budget(pc.trie.counter - 1)                    # the user node has one child: merged into it
    ok(pc)
    assert tree(pc) == ["[0,7) 1 2 3 4 5 6 7 | 0:kv 1:rec", "[0,4) 9 9 9 9 | 0:kv~ 1:rec *"]
    assert pc.trie.counter == 34                          # the head's recurrent state (10) is gone
    pc.set_budget(0)                                       # now a leaf: removed
    ok(pc)
    assert tree(pc) == ["[0,4) 9 9 9 9 | 0:kv~ 1:rec *"]


def test_e5_rewinding_to_an_evicted_turn_resumes_at_the_newest_surviving_checkpoint():
    pc = PrefixCache(KV_REC, budget=40, near_end=2)
    conv, _ = conversation(pc, 6)
    ends = [n.end for n in pc.path[1:]]
    assert ends == [30, 34, 37, 41]                        # the checkpoints before 30 were evicted (E4)
    matched, resume = begin(pc, conv[:30] + [77])
    assert (matched, resume) == (30, 30)
    pc.close()
    ok(pc)
    matched, resume = begin(pc, conv[:16] + [77])          # turn 3's checkpoint at 16 is gone
    assert (matched, resume) == (16, 0)
