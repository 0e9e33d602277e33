"""Directed cases for impl's prefix cache: its contracts with callers, which the conformance
machines do not look at (the trie's shapes: stateful_tests/test_directed.py). Each case names the rule
or contract it holds; the nightly mutation run (stateful_tests/mutation.py) found the gaps they close.

- bad input: every refusal names what was wrong and changes nothing;
- defaults and checked mode: impl's defaults are the spec's, `check=True`
  reports a broken rule after the operation that broke it, `check=False`
  stays silent;
- bookkeeping: eviction history only for a checker, bounded growth slack at
  rest, the prefill cuts close reports (`Stats.chunks`, read by the fuzz oracle),
  the common prefix of long sequences.
"""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from impl.invariants import RuleViolation
from impl.prefix_cache import PrefixCache as ImplCache
from spec.cache import PrefixCache as SpecCache
from stateful_tests.directed import cache, evaluate_prompt, run, state
from stateful_tests.machines import kv, recurrent
from stateful_tests.tracer import Tracer


# ------------------------------------------------------------ bad input
def test_refusals_name_the_problem_and_change_nothing():
    pc, tracer = cache(budget=10_000, interval=2, near_end=1)
    run(pc, tracer, (1, 2, 3, 4, 5), produce=(6, 7))
    before = state(pc, tracer)
    with pytest.raises(ValueError, match=r"^budget -1 < 0$"):
        pc.set_budget(-1)
    with pytest.raises(ValueError, match=r"^empty prompt: a request needs at least one key$"):
        pc.begin(())
    with pytest.raises(ValueError, match=r"^close without an open request$"):
        pc.close()
    assert state(pc, tracer) == before and pc.budget == 10_000
    pc.begin((1, 2, 9))
    opened = state(pc, tracer)
    with pytest.raises(ValueError, match=r"^begin while a request is open: close it first$"):
        pc.begin((1, 2, 3))
    assert state(pc, tracer) == opened
    with pytest.raises(ValueError, match=r"^budget -5 < 0$"):
        ImplCache(tracer.caches, budget=-5)


def test_trie_primitives_refuse_bad_arguments():
    pc, tracer = cache(budget=1 << 40, near_end=0)
    run(pc, tracer, (1, 2, 3, 4, 5, 6), produce=(7,))          # one node [0, 6)
    run(pc, tracer, (1, 2, 3, 8, 8), produce=(8,))             # split at 3: [0,3) -> [3,6), [3,5)
    trie, before = pc.trie, state(pc, tracer)
    head = next(iter(trie.root.children.values()))
    leaf = next(iter(head.children.values()))
    assert (head.start, head.end, len(head.children)) == (0, 3, 2)
    for at in (0, 3, 7, -1):
        with pytest.raises(ValueError, match=rf"^split at {at} outside \(0, 3\)$"):
            trie.split(head, at)
    with pytest.raises(ValueError, match=r"^merge_with_child needs exactly one child, <Node \[0, 3\)> has 2$"):
        trie.merge_with_child(head)
    with pytest.raises(ValueError, match=rf"^merge_with_child needs exactly one child, {leaf!r} has 0$".replace(
            "[", r"\[").replace(")", r"\)")):
        trie.merge_with_child(leaf)
    with pytest.raises(ValueError, match=r"^remove_leaf needs a non-root leaf, got <Node \[0, 3\)>$"):
        trie.remove_leaf(head)
    with pytest.raises(ValueError, match=r"^remove_leaf needs a non-root leaf, got <Node \[0, 0\)>$"):
        trie.remove_leaf(trie.root)
    assert state(pc, tracer) == before


# -------------------------------------------------- defaults, checked mode
def test_defaults_are_the_specs():
    layers = (kv(), recurrent())
    ours, spec = ImplCache(Tracer(layers).caches), SpecCache(layers)
    assert (ours.budget, ours.interval, ours.near_end) == (spec.budget, spec.interval, spec.near_end)
    assert ours.check is False                     # checked mode costs a full walk per operation: opt in
    assert (ours.counter, ours.evictions, ours.bookkeeping_s, ours.clock) == (0, 0, 0.0, 0)


@pytest.mark.parametrize("operation", ["begin", "attach", "close", "set_budget"])
def test_checked_mode_names_the_operation_that_broke_a_rule(operation):
    pc, tracer = cache(interval=0, near_end=1, check=True)
    run(pc, tracer, (1, 2, 3, 4))
    keys = (1, 2, 3, 4, 5, 6)

    def corrupt():
        pc.trie.counter += 1                       # A1: the counter no longer sums the snapshots
    if operation == "begin":
        corrupt()
        with pytest.raises(RuleViolation, match=r"^after begin: A1"):
            pc.begin(keys)
        return
    pc.begin(keys)                                 # schedules a capture at 5 (near_end 1)
    evaluate_prompt(pc, tracer, keys)
    if operation != "attach":
        pc.prefilled()                             # attach, uncorrupted
    corrupt()
    act = {"attach": pc.prefilled, "close": pc.close, "set_budget": lambda: pc.set_budget(1 << 40)}[operation]
    with pytest.raises(RuleViolation, match=rf"^after {operation}: A1"):
        act()


def test_unchecked_mode_stays_silent():
    pc, tracer = cache(near_end=1)
    run(pc, tracer, (1, 2, 3, 4))
    pc.trie.counter += 1
    pc.set_budget(1 << 40)                         # no RuleViolation: check=False is the default
    run(pc, tracer, (1, 2, 3, 4, 5))


def test_checked_mode_hands_each_rule_the_view_before_the_arguments_and_the_outcome(monkeypatch):
    """Operation rules (C2, E3, P2 ...) judge a step by the view before it, its arguments and its
    outcome: under check=True every operation passes all three; unchecked, no view is even built."""
    import impl.invariants as inv
    calls, real_before = [], inv.before
    monkeypatch.setattr(inv, "checked", lambda pc, what, before, args=(), outcome=None:
                        calls.append((what, before, args, outcome)))
    pc, tracer = cache(interval=0, near_end=1, check=True)
    keys = (1, 2, 3, 4, 5, 6)
    got = pc.begin(keys, (), (3,))
    evaluate_prompt(pc, tracer, keys)
    pc.prefilled()
    pc.close()
    pc.set_budget(1 << 30)
    assert [c[0] for c in calls] == ["begin", "attach", "close", "set_budget"]   # close's attach: nothing left
    for what, before, args, outcome in calls:
        assert isinstance(before, tuple) and len(before) == 2 and isinstance(before[1], int), (what, before)
    begin = next(c for c in calls if c[0] == "begin")
    assert begin[2] == (keys, (), (3,)) and begin[3] == got
    assert next(c for c in calls if c[0] == "set_budget")[2] == (1 << 30,)
    built = []
    monkeypatch.setattr(inv, "before", lambda pc: built.append(pc) or real_before(pc))
    calls.clear()
    quiet, tracer = cache(interval=0, near_end=1)
    run(quiet, tracer, keys)
    quiet.set_budget(1 << 30)
    assert built == [] and calls == []


def test_eviction_history_is_kept_only_for_a_checker():
    """A server's cache evicts forever: unchecked, it keeps no list of the evicted key paths (it grew
    without bound, and each entry walked a key path); check=True or record_victims keeps them, in order."""
    prompts = [(1, 2, 3, 4, 5), (1, 2, 6, 7, 8), (9, 9, 9, 9, 9), (1, 2, 3, 4, 7)]
    seen = {}
    for mode in ("quiet", "check", "record"):
        pc, tracer = cache(interval=2, near_end=1, budget=1, check=mode == "check")
        if mode == "record":
            pc.record_victims = True
        for p in prompts:
            run(pc, tracer, p, produce=(p[0],))
        assert pc.evictions > 0, mode
        seen[mode] = list(pc.victims)
    assert seen["quiet"] == []
    assert seen["check"] == seen["record"] and len(seen["record"]) == pc.evictions     # (pc: the record run)
    assert all(isinstance(v, tuple) and v for v in seen["record"])


def test_close_leaves_at_most_bounded_growth_slack_in_the_live_kv_buffers():
    """close() fits every live KV buffer: of a 256-row growth step only the rows still needed stay
    (slack of at most need // rest_slack rows may stay; here the step's slack is far larger)."""
    pc, tracer = cache(interval=2, near_end=1)
    run(pc, tracer, (1, 2, 3, 4, 5, 6, 7), produce=(8, 9))
    kv_caches = [c for c in pc.caches if c is not None and c.kind == "kv"]
    assert kv_caches and all(c.keys.shape[2] - c.offset <= c.offset // c.rest_slack for c in kv_caches)
    assert all(c.fit() == 0 for c in kv_caches)


def test_close_reports_the_prefill_cuts_it_made():
    """Stats.chunks: the forwards that prefilled the prompt, as [p, q) cuts (the fuzz oracle reruns
    stock caches at the same cuts: a chunking tie, docs/fuzz.md); decode steps are not chunks."""
    pc, tracer = cache(interval=3, near_end=1)
    _, stats = run(pc, tracer, (1, 2, 3, 4, 5, 6, 7, 8, 9, 10), produce=(11, 12), chunk=4)
    assert stats.chunks == ((0, 3), (3, 6), (6, 9))       # cut at the captures 3, 6 and 9 (near end, the prompt is 10)
    _, stats = run(pc, tracer, (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 21, 22), chunk=4)
    assert stats.chunks[0][0] == stats.resumed and stats.chunks[-1][1] == 12
    assert all(a[1] == b[0] for a, b in zip(stats.chunks, stats.chunks[1:]))


@pytest.mark.parametrize("n, at", [(300, 300), (300, 299), (600, 0), (600, 255), (600, 256), (600, 257),
                                    (600, 511), (600, 513), (1000, 1000)])
def test_common_prefix_of_long_sequences(n, at):
    """Long prompts diverging early, late, at the last key or not at all; lists and tuples alike."""
    from impl.trie import common_prefix
    a = [(7 * i) % 11 for i in range(n)]
    b = list(a)
    if at < n:
        b[at] += 1
    for x, y in ((a, b), (tuple(a), b), (a, tuple(b)), (tuple(b), tuple(a))):
        assert common_prefix(x, y) == at
    assert common_prefix(a, b[:at // 2]) == at // 2


@given(st.lists(st.integers(0, 2), max_size=700), st.lists(st.integers(0, 2), max_size=700), st.integers(0, 700))
def test_common_prefix_is_the_longest_shared_prefix(tail_a, tail_b, shared):
    """Against its definition, key by key, wherever the divergence falls within or across blocks."""
    from impl.trie import common_prefix
    head = [(5 * i) % 3 for i in range(shared)]
    a, b = head + tail_a, head + tail_b
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix(a, b) == n == common_prefix(tuple(b), a)
