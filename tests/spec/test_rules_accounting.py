"""Scenario tests for A1, A2, C1, and a table of single mutations, one per
rule, each of which `check` must report as exactly that rule."""
from __future__ import annotations

import pytest
from conftest import HYBRID, KV_REC, PURE_KV, begin, ok, rules, run

from spec.cache import PrefixCache
from spec.trie import KV, Broken, walk


def test_a1_counter_counts_owned_bytes_lazy_views_count_zero_until_materialised():
    pc = PrefixCache(PURE_KV, near_end=0)
    run(pc, [1, 2, 3, 4], [5, 6])
    assert pc.store.counter == 0 and pc.frontier.snaps[0].lazy
    run(pc, [1, 2, 7], [8])                   # overwrites slot 2: both views of [0,5) materialise
    assert pc.store.counter == sum(s.nbytes(pc.layers[i]) for n in walk(pc.root) for i, s in n.snaps.items())
    assert pc.store.counter == 9              # [2,5) tail and [0,2) head, costs 2 + 1 per row


def test_a2_every_snapshot_held_once_or_released_once(hybrid):
    run(hybrid, list(range(1, 11)), [11, 12, 13])
    run(hybrid, [1, 2, 3, 4, 5, 20], [21, 22])
    hybrid.set_budget(0)
    ok(hybrid)
    held = [s for n in walk(hybrid.root) for s in n.snaps.values()]
    assert all(not s.released for s in held)
    assert sum(s.released for s in hybrid.store.created) == len(hybrid.store.created) - len(held)


def test_c1_restore_equals_cold_prefill(hybrid):
    run(hybrid, list(range(1, 11)), [11, 12, 13])
    matched, resume = begin(hybrid, list(range(1, 11)) + [11, 12, 40])
    assert (matched, resume) == (12, 12)
    for i in (0, 1, 3):
        assert hybrid.live[i] == hybrid.cold(i)
    assert hybrid.live[1] == (7, 8, 9, 10, 11, 12)          # windowed: the last 6 positions


# ---------------------------------------------------------------- mutations
def idle_hybrid():
    pc = PrefixCache(HYBRID)
    run(pc, list(range(1, 11)), [11, 12, 13])
    run(pc, [1, 2, 3, 4, 5, 20], [21, 22])
    return pc


def mut_t1(pc):
    import copy
    leaf = pc.root.children[0].children[0].children[0].children[0]     # [6,12), off the active path
    leaf.parent = copy.copy(leaf.parent)                               # same keys, but links disagree


def mut_t2(pc):
    from spec.trie import Node
    n = pc.root.children[0].children[0]                                # [2,5): children 6... and 20...
    n.children.append(Node(edge=(20, 99), start=n.end, parent=n))     # a second child starting with 20


def mut_t3(pc):
    pc.offset += 1


def mut_s1(pc):
    s = pc.root.children[0].snaps[0]
    s.content = s.content[1:] + (99,)


def mut_s2(pc):
    pc.root.children[0].snaps[3].content = (99,)


def mut_s3(pc):
    s = pc.store.disown(pc.frontier, 3)
    pc.store.release(s)


def mut_a1(pc):
    pc.store.counter += 1


def mut_a2_leak(pc):
    pc.store.new_snap(layer=0, kind=KV, start=0, end=0, content=())


def mut_a2_twice(pc):
    pc.root.children[0].snaps[0].released = True


def mut_c1(pc):
    pc.live[3] = pc.live[3][:-1] + (Broken(pc.live[3][-1]),)


def mut_p2(pc):
    # an uncompacted non-user single-child node on the active path
    f = pc.frontier
    head = pc.store.split(f, f.start + 1)
    pc.path.insert(len(pc.path) - 1, head)
    head.user = False


def mut_e1(pc):
    pc.budget = 0


MUTATIONS = {
    "T1": mut_t1, "T2": mut_t2, "T3": mut_t3, "S1": mut_s1, "S2": mut_s2, "S3": mut_s3,
    "A1": mut_a1, "A2": mut_a2_leak, "C1": mut_c1, "P2": mut_p2, "E1": mut_e1,
}


@pytest.mark.parametrize("rule", sorted(MUTATIONS))
def test_one_mutation_one_rule(rule):
    pc = idle_hybrid()
    ok(pc)
    MUTATIONS[rule](pc)
    assert rules(pc) == {rule}


def test_a2_released_while_held():
    pc = idle_hybrid()
    mut_a2_twice(pc)
    assert rules(pc) == {"A2"}


def test_m_rules_flag_a_request_inside_a_noncausal_item():
    from spec.media import MediaItem
    pc = PrefixCache(KV_REC, chunk=2)
    begin(pc, [1, 2, 0, 0, 0, 0, 7, 8], [MediaItem(pos=2, length=4, data=b"img")])
    req = pc.request
    req.schedule.append((4, True))
    assert rules(pc) == {"M2"}
    req.schedule.pop()
    req.chunks.append((2, 4))
    assert rules(pc) == {"M1"}
    req.chunks.pop()
    req.resume = 3
    assert "M3" in rules(pc)


def test_p1_rule_flags_a_stale_frontier():
    pc = PrefixCache(PURE_KV)
    run(pc, list(range(1, 9)), [9, 10])
    begin(pc, [1, 2, 3, 4, 5, 6, 30])
    pc.clock += 1                           # the frontier was not the node last touched
    assert rules(pc) == {"P1"}
