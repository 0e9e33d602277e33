"""Scenario tests for A1, A2 and C1 (single-mutation variants of every rule
are in test_rules_mutations.py)."""
from __future__ import annotations

from spec_helpers import PURE_KV, begin, ok, run

from spec.cache import PrefixCache
from spec.trie import walk


def test_a1_counter_counts_owned_bytes_lazy_views_count_zero_until_materialised():
    pc = PrefixCache(PURE_KV, near_end=0)
    run(pc, [1, 2, 3, 4], [5, 6])
    assert pc.trie.counter == 0 and pc.frontier.snaps[0].lazy
    run(pc, [1, 2, 7], [8])                   # overwrites slot 2: both views of [0,5) materialise
    assert pc.trie.counter == sum(s.size(pc.layers[i]) for n in walk(pc.root) for i, s in n.snaps.items())
    assert pc.trie.counter == 9              # [2,5) tail and [0,2) head, costs 2 + 1 per row


def test_a2_every_snapshot_held_once_or_released_once(hybrid):
    run(hybrid, list(range(1, 11)), [11, 12, 13])
    run(hybrid, [1, 2, 3, 4, 5, 20], [21, 22])
    hybrid.set_budget(0)
    ok(hybrid)
    held = [s for n in walk(hybrid.root) for s in n.snaps.values()]
    assert all(not s.released for s in held)
    assert sum(s.released for s in hybrid.trie.created) == len(hybrid.trie.created) - len(held)


def test_c1_restore_equals_cold_prefill(hybrid):
    run(hybrid, list(range(1, 11)), [11, 12, 13])
    matched, resume = begin(hybrid, list(range(1, 11)) + [11, 12, 40])
    assert (matched, resume) == (12, 12)
    for i in (0, 1, 3):
        assert hybrid.live[i] == hybrid.cold(i)
    assert hybrid.live[1] == (7, 8, 9, 10, 11, 12)          # windowed: the last 6 positions
