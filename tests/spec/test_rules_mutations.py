"""Failing variants, one per rule: a correct state (or operation) with one
thing mutated, and the rule predicates report exactly that rule. State rules
go through `check`; operation rules through `check_step` on the views before
and after a mutated operation (the full policy-mutant table, run the way a
target run is, lives in tests/spec/test_power.py)."""
from __future__ import annotations

import copy

import pytest
from spec_helpers import HYBRID, KV_REC, PURE_KV, begin, observe, ok, rules, run

from spec.cache import PrefixCache
from spec.media import MediaItem
from spec.rules import check_step
from spec.view import Op
from spec.trie import KV, Broken, MergeError, Node, Trie


def idle_hybrid():
    pc = PrefixCache(HYBRID)
    run(pc, list(range(1, 11)), [11, 12, 13])
    run(pc, [1, 2, 3, 4, 5, 20], [21, 22])
    return pc


def mut_t1(pc):
    leaf = pc.root.children[0].children[0].children[0].children[0]     # [6,12), off the active path
    leaf.parent = copy.copy(leaf.parent)                               # same keys, but links disagree


def mut_t2(pc):
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
    s = pc.trie.disown(pc.frontier, 3)
    pc.trie.release(s)


def mut_a1(pc):
    pc.trie.counter += 1


def mut_a2_leak(pc):
    pc.trie.new_snapshot(layer=0, kind=KV, start=0, end=0, content=())


def mut_a2_twice(pc):
    pc.root.children[0].snaps[0].released = True


def mut_c1(pc):
    pc.live[3] = pc.live[3][:-1] + (Broken(pc.live[3][-1]),)


def mut_p2(pc):
    # an uncompacted non-user single-child node on the active path
    f = pc.frontier
    head = pc.trie.split(f, f.start + 1)
    pc.path.insert(len(pc.path) - 1, head)
    head.user = False


def mut_e1(pc):
    pc.budget = 0


MUTATIONS = {
    "T1": mut_t1, "T2": mut_t2, "T3": mut_t3, "S1": mut_s1, "S2": mut_s2, "S3": mut_s3,
    "A1": mut_a1, "A2": mut_a2_leak, "C1": mut_c1, "E1": mut_e1,
}


def test_p2_an_uncompacted_node_is_flagged():
    pc = idle_hybrid()
    before = pc.view()
    mut_p2(pc)
    assert {v.rule for v in check_step(before, Op("close", evicted=()), pc.view())} == {"P2"}


def old_compact(self):
    """Compaction before the 2026-12-02 revision: every non-user single-child node merges, whole-state or not."""
    i = 1
    while i < len(self.path) - 1:
        n = self.path[i]
        if not n.user and len(n.children) == 1:
            self.path.remove(n.children[0])
            self.trie.merge_with_child(n)
        else:
            i += 1


def regenerate(pc):
    """REFERENCE P2's example: the same prompt answered twice, then a third
    time (plain operations, no rule checks in between)."""
    for gen in ([10, 11], [20, 21]):
        pc.begin([1, 2, 3, 4, 5])
        pc.prefill()
        for k in [5] + gen[:-1]:
            pc.step(k)
        pc.close()
    return pc.begin([1, 2, 3, 4, 5])


def test_p2_regeneration_resumes_at_the_branch_point_capture():
    # the branch-point capture begin schedules at the match survives close's compaction
    assert regenerate(PrefixCache(KV_REC, near_end=0)) == (4, 4)


def test_p2_compaction_that_drops_a_whole_state_checkpoint_is_flagged(monkeypatch):
    monkeypatch.setattr(PrefixCache, "compact", old_compact)
    pc = PrefixCache(KV_REC, near_end=0)
    run(pc, [1, 2, 3, 4, 5], [10, 11])
    begin(pc, [1, 2, 3, 4, 5])
    pc.prefill()
    for k in (5, 20):
        pc.step(k)
    before, op, after, _ = observe(pc, "close")
    assert "P2" in {v.rule for v in check_step(before, op, after)}
    assert regenerate(PrefixCache(KV_REC, near_end=0)) == (4, 0)           # the historical symptom: every regeneration resumes at 0


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
    before = pc.view()
    keys = (1, 2, 3, 4, 5, 6, 30)
    out = pc.begin(list(keys))
    pc.clock += 1
    pc.path[1].last_used = pc.clock         # the frontier was not the node last touched
    assert {v.rule for v in check_step(before, Op("begin", (keys, ()), out), pc.view())} == {"P1"}


def ops(before, name, after, **kw):
    return {v.rule for v in check_step(before, Op(name, **kw), after)}


# ------------------------------------------------- operation-level rules
def test_s4_head_with_whole_state_is_flagged():
    pc = PrefixCache(KV_REC)
    run(pc, list(range(1, 9)), [9, 10])
    before = pc.view()
    tail = pc.frontier
    head = pc.trie.split(tail, 6)
    assert ops(before, "split", pc.view()) == set()
    stolen = pc.trie.disown(tail, 1)
    pc.trie.own(head, stolen)                 # the whole-state moved to the head
    assert "S4" in ops(before, "split", pc.view())


def test_g1_non_adjacent_merge_raises():
    pc = PrefixCache(PURE_KV)
    run(pc, list(range(1, 9)), [9, 10])
    node = pc.root.children[0]
    node.children[0].snaps[0].start += 1       # the child's KV no longer begins where the parent's ends
    with pytest.raises(MergeError, match="G1"):
        pc.trie.merge_with_child(node)


def test_g1_silent_concatenation_is_flagged(monkeypatch):
    def silent(store, a, b):                   # the variant: concatenate without the adjacency check
        merged = store.new_snapshot(layer=a.layer, kind=KV, start=a.start, end=a.end + b.end - b.start,
                                content=a.content + b.content)
        store.release(a)
        store.release(b)
        return merged
    pc = PrefixCache(PURE_KV)
    run(pc, list(range(1, 9)), [9, 10])
    node = pc.root.children[0]
    node.children[0].snaps[0].start += 1       # the child's KV no longer begins where the parent's ends
    before = pc.view()
    monkeypatch.setattr(Trie, "merge_snapshots", silent)
    pc.trie.merge_with_child(node)
    assert "G1" in ops(before, "merge", pc.view())


def test_g2_merge_keeping_the_older_last_used_is_flagged():
    pc = PrefixCache(PURE_KV)
    run(pc, list(range(1, 9)), [9, 10])
    node = pc.root.children[0]
    before = pc.view()
    pc.trie.merge_with_child(node)
    assert ops(before, "merge", pc.view()) == set()
    node.last_used = 0                         # the variant: the older time survives
    assert ops(before, "merge", pc.view()) == {"G2"}


def test_e3_most_recently_used_victim_is_flagged(monkeypatch):
    pc = PrefixCache(PURE_KV, near_end=0)
    run(pc, [1, 2, 3], [4, 4])
    run(pc, [5, 6, 7], [8, 8])
    run(pc, [9, 9, 9], [9, 9])
    monkeypatch.setattr(PrefixCache, "evict_order", lambda self, n: (-n.last_used,))   # MRU first
    before, op, after, _ = observe(pc, "set_budget", pc.trie.counter - 1)
    assert {v.rule for v in check_step(before, op, after)} == {"E3"}
    assert {v.rule for v in check_step(before, Op("set_budget", (op.args)), after)} == {"E3"}   # victims inferred


def test_e2_protecting_the_active_path_is_flagged(monkeypatch):
    original = PrefixCache.evictable
    monkeypatch.setattr(PrefixCache, "evictable", lambda self, n: original(self, n) and n not in self.path)
    pc = PrefixCache(KV_REC, budget=25, near_end=2)
    run_loose(pc, [100, 1, 5, 6], [200, 2, 3])
    run_loose(pc, [100, 1, 5, 6, 200, 2, 3, 101, 1, 5, 6], [201, 2, 3])
    assert rules(pc) == {"E1"}


def test_e4_evicting_a_single_child_node_by_splicing_is_flagged(monkeypatch):
    def splice(self):                          # the variant: drop the node, re-hang its child unchanged
        while self.trie.counter > self.budget:
            v = min((n for n in self.trie.nodes() if self.evictable(n)), key=self.evict_order)
            if not v.children:
                self.trie.remove_leaf(v)
                continue
            child = v.children[0]
            for i in sorted(v.snaps):
                self.trie.release(self.trie.disown(v, i))
            v.parent.children[v.parent.children.index(v)] = child
            child.parent = v.parent
            if v in self.path:
                self.path.remove(v)
            return
    pc = PrefixCache(KV_REC)
    run(pc, [1, 2, 3, 4, 5, 6], [7, 7])
    run(pc, [9, 9, 9], [9, 9])
    monkeypatch.setattr(PrefixCache, "evict", splice)
    pc.set_budget(pc.trie.counter - 1)
    assert "T1" in rules(pc)


def test_e5_resuming_at_an_evicted_turn_from_an_older_state_is_flagged(monkeypatch):
    pc = PrefixCache(KV_REC, budget=40, near_end=2)
    conv = []
    for t in range(6):
        prompt = conv + [100 + t, 1, 5, 6]
        run(pc, prompt, [200 + t, 2, 3])
        conv = prompt + [200 + t, 2, 3]
    original = PrefixCache.source

    def source(self, i, path, x, matched, common):   # the variant: any older checkpoint "will do"
        found = original(self, i, path, x, matched, common)
        if found is None:
            older = [n.snaps[i] for n in path[1:] if i in n.snaps and n.snaps[i].end <= x]
            return older[-1] if older else "reset"
        return found
    pc.set_budget(1 << 40)
    run(pc, [50, 51, 52], [53])                # leave the conversation
    assert begin(pc, conv[:16] + [77]) == (16, 0)   # fixed: turn 3's checkpoint is gone, back to 0
    pc.close()
    run(pc, [50, 51, 52], [53])
    monkeypatch.setattr(PrefixCache, "source", source)
    assert pc.begin(conv[:16] + [77]) == (16, 16)   # claims to resume at the evicted turn (fixed: 0)
    assert {"T3", "C1"} <= rules(pc)


def run_loose(pc, tokens, gen):
    pc.begin(tokens)
    pc.prefill()
    pc.step(tokens[-1])
    for g in gen[:-1]:
        pc.step(g)
    pc.close()
