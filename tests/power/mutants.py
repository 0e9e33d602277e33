"""Policy mutants: the spec or impl with one policy hook changed, each breaking
one rule (the power table of docs/spec.md). A mutant is applied with pytest's
monkeypatch and run as a target (targets.reference) through
targets.program.judge: the rule predicates alone must flag it.

Each entry: rule id -> Mutant(what it changes, spec patch, impl patch or the
reason impl has no such mutant, layer mixes that can show it).
"""
from __future__ import annotations

from tests.power.mutants_keeping import *        # noqa: F401,F403  (g*, e*, a*, c2 patches)
from tests.power.mutants_structure import *      # noqa: F401,F403  (t*, s*, m*, p* patches)
from tests.power.mutants_weaker import *         # noqa: F401,F403
from tests.power.patching import MIXES, Mutant   # noqa: F401  (test_power reads MIXES from here)

MUTANTS = {
    "T1": Mutant("spec: an evicted leaf stays listed under its parent; impl: a new child's parent link points "
                 "one level too high", t1_spec, t1_impl),
    "T2": Mutant("attach appends a new child instead of walking a matching one", t2_spec,
                 "impl keys children by their first key: a second child with the same first key cannot exist"),
    "T3": Mutant("spec: a decode step skips a layer; impl: close leaves the path one node short of the live "
                 "offset",
                 t3_spec, t3_impl),
    "S1": Mutant("page-out's KV snapshot starts at 0, not at the node's start", s1_spec, s1_impl),
    "S2": Mutant("a merge keeps the parent's older whole-state", s2_spec, s2_impl, ("kv_rec", "hybrid", "kv_win")),
    "S3": Mutant("page-out skips a node that holds any snapshot (the seed's bug)", s3_spec, s3_impl,
                 ("kv_rec", "hybrid", "kv_win")),
    "S4": Mutant("a split moves the whole-state to the head", s4_spec, s4_impl, ("kv_rec", "hybrid", "kv_win")),
    "M1": Mutant("a chunk may end inside a non-causal item", m1_spec, m1_impl),
    "M2": Mutant("a capture may land inside a non-causal item", m2_spec, m2_impl, ("kv",)),
    "P1": Mutant("begin resumes inside an edge without splitting it", p1_spec, p1_impl, ("kv", "kv_win")),
    "P2": Mutant("no compaction", p2_spec, p2_impl),
    "G1": Mutant("KV merge without the adjacency check, fed by a misplaced page-out", g1_spec, g1_impl),
    "G2": Mutant("a merge keeps the older last-used time", g2_spec, g2_impl),
    "E1": Mutant("no eviction", e1_spec, e1_impl),
    "E2": Mutant("the frontier is evictable", e2_spec, e2_impl),
    "E3": Mutant("most recently used first", e3_spec, e3_impl),
    "E4": Mutant("a single-child victim is dropped and its child re-hung unmerged", e4_spec, e4_impl),
    "E5": Mutant("without the matched checkpoint, resume at 0 instead of the newest survivor", e5_spec, e5_impl,
                 ("kv_rec", "hybrid")),
    "A1": Mutant("materialised bytes never reach the counter", a1_spec, a1_impl, ("kv", "kv_rec")),
    "A2": Mutant("spec: an evicted leaf's snapshots are never released; impl: a whole-state merge closes the "
                 "state it keeps", a2_spec, a2_impl, ("kv_rec", "hybrid")),
    "C1": Mutant("a non-causal item evaluated in two forwards (the M1 mutant, seen by the oracle)", m1_spec,
                 m1_impl, ("kv", "kv_rec")),
    "C2": Mutant("begin resumes one checkpoint below the match", c2_spec, c2_impl),
}


# ------------------------------------------------- weaker readings of a rule
WEAKER = {
    "E3 path": ("E3", Mutant("the whole active path protected (the seed's eviction bug), with the budget met "
                             "off the path", e3_path_spec, e3_path_impl)),
    "S4 head": ("S4", Mutant("a split head gets no KV halves", s4_head_spec, s4_head_impl, ("kv", "kv_win"))),
    "P2 user": ("P2", Mutant("compaction merges user nodes too", p2_user_spec, p2_user_impl, ("kv",))),
    "G2 copy": ("G2", Mutant("two lazy views merge into an owned copy", g2_copy_spec, g2_copy_impl)),
    "S2 match": ("S2", Mutant("a begin below the match schedules no capture there", s2_match_spec, s2_match_impl,
                              ("kv_rec", "hybrid"))),
}
