"""Directed cases for impl's trie and prefix cache, on the tracer's real MLX
caches: trie shapes the conformance machines cannot reach through requests
alone (impl's contracts with callers: stateful_tests/test_directed_contracts.py).
Each case names the rule or contract it holds; the nightly mutation run
(stateful_tests/mutation.py) found the gaps they close.

- trie primitives: split/merge/remove/append keep the clocks and links that
  eviction order (E3) reads later; a disowned snapshot no longer reports to
  the counter (A1);
- E3 ties: the eviction order on tries whose nodes share last-used times;
- a trie left by an older version (a stored path ending inside what is now a
  non-causal item): the match floors to the item's start (M3), no other resume
  candidate lands inside an item, and a capture that starts before its node is
  clipped to the edge (S1);
- close deep inside a stored path splits the right edge;
- a windowed layer rewinds live to the common prefix (no snapshot needed);
- the path scans' marks (impl/settled.py) across an eviction inside begin.
"""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from impl.trie import walk
from stateful_tests.abstraction import abstract, canon
from stateful_tests.directed import assert_sound, cache, run
from stateful_tests.machines import KvMachine, KvWindowedMachine, kv, recurrent
from stateful_tests.test_conformance import run_all_invariants


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


def test_the_order_reads_its_backlog_at_eviction_points_and_still_picks_the_walks_victims():
    """impl/eviction.py: the nodes changed while nothing is evicted are read into the E3 order at the
    verbs' eviction points once more than BACKLOG of them wait, so after every request at most BACKLOG
    wait; victims chosen afterwards are still the walk's (check=True: impl.invariants.assert_victim)."""
    pc, tracer = cache(budget=1 << 40, near_end=0, check=True)
    pc.BACKLOG = 3
    for i in range(10):
        run(pc, tracer, (1, 2, 3, 10 + i, 20 + i, 30 + i), produce=(40 + i,))
        assert len(pc.order.changed) <= pc.BACKLOG, (i, len(pc.order.changed))
    assert pc.evictions == 0 and len(pc.order.current) > pc.BACKLOG
    pc.set_budget(pc.counter // 3)
    run(pc, tracer, (1, 2, 3, 50, 51), produce=(52,))
    assert pc.evictions > 3
    assert_sound(pc, tracer)


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
