"""Directed cases for impl's trie and prefix cache, on the tracer's real MLX
caches: what the conformance machines cannot reach through requests alone, or
do not look at. Each case names the rule or contract it holds; the nightly
mutation run (stateful_tests/mutation.py) found the gaps they close.

- bad input: every refusal names what was wrong and changes nothing;
- defaults and checked mode: impl's defaults are the spec's, `check=True`
  reports a broken rule after the operation that broke it, `check=False`
  stays silent;
- trie primitives: split/merge/remove/append keep the clocks and links that
  eviction order (E3) reads later; a disowned snapshot no longer reports to
  the counter (A1);
- E3 ties: the eviction order on tries whose nodes share last-used times;
- a trie left by an older version (a stored path ending inside what is now a
  non-causal item): the match floors to the item's start (M3), no other resume
  candidate lands inside an item, and a capture that starts before its node is
  clipped to the edge (S1);
- a windowed layer rewinds live to the common prefix (no snapshot needed);
- close reports the prefill cuts (`Stats.chunks`, read by the fuzz oracle);
- the path scans' marks (impl/settled.py) across an eviction inside begin.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from impl.invariants import RuleViolation
from impl.prefix_cache import PrefixCache as ImplCache
from impl.trie import walk
from spec.cache import PrefixCache as SpecCache
from spec.rules import c1_cold_equivalence, check
from stateful_tests.abstraction import abstract, canon
from stateful_tests.machines import KvMachine, KvWindowedMachine, kv, recurrent
from stateful_tests.test_conformance import run_all_invariants
from stateful_tests.tracer import Tracer

LAYERS = (kv(), recurrent())


def cache(layers=LAYERS, **kw):
    tracer = Tracer(layers)
    return ImplCache(tracer.caches, **kw), tracer


def evaluate_prompt(pc, tracer, keys, spans=(), chunk=4):
    """Prefill the open request's prompt chunk by chunk (captures not yet attached)."""
    while (ch := pc.next_chunk(chunk)) is not None:
        p, q = ch
        tracer.forward(p, keys[p:q], spans)
        pc.evaluated(keys[p:q])


def run(pc, tracer, keys, spans=(), produce=(), chunk=4, boundaries=()):
    """One request: begin, prefill in chunks, decode `produce`, close."""
    result = pc.begin(keys, spans, boundaries)
    evaluate_prompt(pc, tracer, keys, spans, chunk)
    pc.prefilled()
    last = keys[-1]
    for k in produce:
        tracer.forward(pc.offset, [last], ())
        pc.evaluated([last])
        last = k
    stats = pc.close()
    return result, stats


def state(pc, tracer, layers=LAYERS):
    return canon(abstract(pc, layers, tracer, 4))


def assert_sound(pc, tracer, layers=LAYERS):
    a = abstract(pc, layers, tracer, 4)
    assert check(a) == [] and c1_cold_equivalence(a) == []


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


# ------------------------------------------------------ trie primitives
def test_split_append_merge_keep_the_clocks_and_links():
    pc, tracer = cache(budget=1 << 40, near_end=0)
    run(pc, tracer, (1, 2, 3, 4, 5, 6), produce=(7,))
    trie = pc.trie
    node = next(iter(trie.root.children.values()))
    node.last_used, node.used_at = 41, 123.0
    head = trie.split(node, 2)
    assert (head.last_used, head.used_at) == (41, 123.0) and (node.last_used, node.used_at) == (41, 123.0)
    assert head.parent is trie.root and node.parent is head and head.children == {node.edge[0]: node}
    child = trie.append_child(node, (9, 9))
    assert (child.start, child.end, child.last_used, child.parent) == (node.end, node.end + 2, 41, node)
    child.last_used, child.used_at = 50, 200.0
    node.last_used, node.used_at = 60, 100.0
    trie.remove_leaf(child)
    assert child.parent is None and node.children == {}
    trie.merge_with_child(head)
    assert (head.last_used, head.used_at, head.end) == (60, 123.0, 6)


def test_a_disowned_snapshot_no_longer_reports_to_the_counter():
    """A1: once a node gives a lazy KV view up, its materialisation is nobody's bytes."""
    pc, tracer = cache(layers=(kv(),), budget=1 << 40, near_end=0)
    run(pc, tracer, (1, 2, 3, 4, 5), produce=(6,))
    node = next(iter(pc.trie.root.children.values()))
    view = pc.trie.disown(node, 0)
    assert view.lazy and pc.counter == 0
    tracer.caches[0].free()                        # the live buffer goes: the view copies its rows out
    assert not view.lazy and view.size > 0 and pc.counter == 0
    view.release()


# ------------------------------------------------------------- E3 ties
@settings(max_examples=40, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(1, 3), min_size=2, max_size=9), min_size=2, max_size=6),
       clocks=st.lists(st.integers(0, 2), min_size=12, max_size=12), budget=st.integers(0, 400))
def test_eviction_order_with_tied_clocks_is_the_specs(prompts, clocks, budget):
    """E3 on tries whose nodes share last-used times (requests alone rarely
    tie them: every touch ticks the clock): least recently used, then deeper,
    then larger, then by key path, victim after victim, as the spec evicts."""
    layers = (kv(), recurrent())
    pc, tracer = cache(layers=layers, budget=1 << 40, interval=3, near_end=2)
    for p in prompts:
        run(pc, tracer, tuple(p), produce=(p[0],))
    for n, c in zip(walk(pc.root), clocks * 4):
        n.last_used = c
    spec = abstract(pc, layers, tracer, 4)
    spec.set_budget(budget)
    pc.set_budget(budget)
    assert canon(abstract(pc, layers, tracer, 4)) == canon(spec)


def test_last_tie_break_is_the_key_path_not_the_walk_order():
    """Two leaves [2, 4) with the same edge (3, 3), clock, end and bytes under
    different parents: the one on the smaller key path goes first, although
    the walk meets the other first (it was stored first)."""
    layers = (kv(),)
    pc, tracer = cache(layers=layers, budget=1 << 40, interval=2, near_end=0)
    run(pc, tracer, (1, 2, 3, 3), produce=(3,))
    run(pc, tracer, (1, 1, 3, 3), produce=(3,))
    run(pc, tracer, (2, 2, 2, 2, 2, 2))            # overwrites the live rows: both leaves own theirs
    leaves = [n for n in walk(pc.root) if not n.children and n.end == 4]
    assert [(n.edge, n.path_keys()) for n in leaves] == [((3, 3), (1, 2, 3, 3)), ((3, 3), (1, 1, 3, 3))]
    assert leaves[0].bytes() == leaves[1].bytes() > 0
    for n in walk(pc.root):
        n.last_used = 0
    spec = abstract(pc, layers, tracer, 4)
    budget = pc.counter - 1                        # one leaf must go
    spec.set_budget(budget)
    pc.set_budget(budget)
    assert canon(abstract(pc, layers, tracer, 4)) == canon(spec)
    kept = {n.path_keys() for n in walk(pc.root) if not n.children}
    assert (1, 2, 3, 3) in kept and (1, 1, 3, 3) not in kept


# ---------------------------------------------- a trie from an older version
def test_legacy_trie_floors_the_match_and_clips_the_capture():
    """Request 3 treats keys 3..7 as one non-causal item that requests 1 and 2
    stored as plain tokens, with a node boundary at 5, inside it (a trie an
    older version left behind: folds now hash causality, so requests cannot
    produce this). The match (5) floors to the item's start (M3), the
    capture at the item's end starts at the resume offset, before the node
    it lands on, and is clipped to that node's edge (S1)."""
    layers = (kv(),)
    pc, tracer = cache(layers=layers, budget=1 << 40, near_end=1)
    run(pc, tracer, (1, 2, 3))                     # [0, 2)
    run(pc, tracer, (1, 2, 3, 4, 5, 6))            # [2, 4), [4, 5)
    keys, spans = (1, 2, 3, 4, 5, 7, 7, 7, 7), [(3, 8)]
    (matched, resume), _ = run(pc, tracer, keys, spans)
    assert (matched, resume) == (3, 3)
    ends = {(n.start, n.end): n.snaps[0] for n in walk(pc.root) if n is not pc.root}
    assert (5, 8) in ends and (ends[(5, 8)].start, ends[(5, 8)].end) == (5, 8)
    assert_sound(pc, tracer, layers)


def test_legacy_trie_never_resumes_inside_an_earlier_item():
    """A whole-state layer whose only state below the match lies strictly inside a non-causal item
    (a trie an older version left behind: node [0, 5) with its state at 5, under an item at [3, 8))
    resumes below the item, not at 5 (M3 for every candidate offset, not only for the match)."""
    layers = (kv(), recurrent())
    pc, tracer = cache(layers=layers, budget=1 << 40, interval=0, near_end=0)    # (check=True: M2 on the trie)
    run(pc, tracer, tuple(range(1, 14)))           # [0, 12), its state at 12
    run(pc, tracer, (1, 2, 3, 4, 5, 99))           # branches at 5: [0, 5) gets the state at 5
    keys, spans = tuple(range(1, 11)) + (50, 51), [(3, 8)]
    (matched, resume), _ = run(pc, tracer, keys, spans)
    assert (matched, resume) == (10, 0)
    assert_sound(pc, tracer, layers)


# ------------------------------------------------ close deep inside a stored path
def test_close_splits_an_edge_below_a_whole_stored_node():
    """Shrunk from what the deep mutation pass found (mutants of _advance
    indexing walked[+1] for walked[-1]): a regenerated answer follows the
    stored one over a whole node ([2, 4)) and into the next edge ([4, 6)),
    then diverges; close must split that next edge, two nodes below the
    frontier (S4, T1)."""
    s = KvMachine()
    s.configure(chunk=8, interval=0, near_end=0, budget=1 << 40)
    s.new_conversation(text=[1, 2, 3], media=[])            # stored [0, 6): 1 2 3 1 1 1
    s.prefill_rest()
    s.produce(tokens=[1, 1, 1, 1])
    first = s.close()
    s.new_conversation(text=[1, 2, 3, 1, 4], media=[])      # P1 splits it at 4: [0, 4), [4, 6)
    s.prefill_rest()
    s.produce(tokens=[1])
    s.close()
    s.regenerate(conv=first)                                # resumes at 2: [0, 2), [2, 4)
    s.prefill_rest()
    s.produce_as_before(count=2)                            # 1 1, as stored
    s.produce(tokens=[4, 2])                                # evaluated: 3 1 1 4, diverging at 5
    assert [n.end for n in s.ip.path] == [0, 2] and s.ip.offset == 6
    run_all_invariants(s)
    s.close()                                               # walks [2, 4) whole, splits [4, 6) at 5
    run_all_invariants(s)
    ends = sorted((n.start, n.end) for n in walk(s.ip.root))
    assert ends.count((5, 6)) == 2 and (4, 5) in ends
    s.teardown()


# ------------------------------------------------------ windowed live rewind
def windowed_program(*prompts):
    """KvWindowedMachine (kv + a window of 5) through whole conversations:
    each (prompt, response) is begun (both sides must agree on matched and
    resume), prefilled, decoded and closed, all invariants after each."""
    s = KvWindowedMachine()
    s.configure(chunk=8, interval=0, near_end=0, budget=1 << 40)
    for prompt, response in prompts:
        s.new_conversation(text=list(prompt), media=[])
        s.prefill_rest()
        s.produce(tokens=list(response))
        run_all_invariants(s)
        s.close()
        run_all_invariants(s)
    return s


def test_windowed_layer_rewinds_live_to_the_common_prefix():
    """The third prompt diverges from the live conversation at 2, where the
    trie has a KV-only node (the head P1 split off for the second prompt):
    only the live window, not yet wrapped, can give the windowed state at 2
    (spec: source "live", for x <= common)."""
    s = windowed_program(([1, 2, 3], [4]), ([1, 2, 4, 4], [1]), ([1, 2, 1, 1], [2]))
    s.teardown()


def test_resume_sources_come_from_nodes_before_the_match():
    """After a long conversation wraps the live window, the prompt [1, 2, 3]
    matches 2 keys; the node starting there holds a windowed state at 3 that
    could serve, but begin only looks at nodes starting before the match
    (as the spec does): both resume at 0 and agree."""
    s = windowed_program(([1, 2, 3], [4]), ([1, 2, 4, 4], [1]), ([3, 3, 3, 3, 3, 3, 3], [3]), ([1, 2, 3], [1]))
    s.teardown()


# ------------------------------------------------- the path scans' marks (impl/settled.py)
def test_an_eviction_in_begin_unsettles_a_merged_node_on_the_path():
    """begin keeps the compaction mark on the user node [0, 2) and extends the path past the old
    frontier [2, 3) into [3, 7); its eviction then merges the marked node with that unsettled child
    (E4), and the merged node, no longer a user node, must be compacted (P2). A mark left on it
    (impl/settled.py) hides it from every later scan: check=True reports P2 at close."""
    layers = (kv(),)
    pc, tracer = cache(layers=layers, budget=1 << 40, interval=0, near_end=0, check=True)
    run(pc, tracer, (1, 2, 3, 4, 5, 6, 7, 8), boundaries=[2])  # [0, 2) user, [2, 7)
    run(pc, tracer, (5, 5, 5, 5), boundaries=[1])              # an owned branch off the root: [0, 1) user, [1, 3)
    run(pc, tracer, (1, 2, 3, 4))                              # frontier [2, 3), the rest [3, 7) below it
    marked = pc.path[1]
    assert marked.user and pc.settled.compacted is marked
    pc.budget = 0                                          # (set_budget would evict now, not inside begin)
    run(pc, tracer, (1, 2, 3, 4, 5, 6, 7, 8, 9))
    assert pc.evictions == 3 and marked.edge[:3] == (1, 2, 3)   # [0, 2) merged with [2, 3), then the branch
    assert [n.end for n in pc.path] == [0, 8] and not marked.user
    assert_sound(pc, tracer, layers)
