"""The mutant set: the seed's historical bugs (REFERENCE section 3, seed/000)
and the bugs issue 18 found only one directed test guarding, each written
once, as a run-time patch of impl (never spec, never a file). The
conformance machines hunt them (stateful_tests/historical_bugs.py and its
meta-test), and tests/impl's rule scenarios apply the same patches
(`with MUTANTS["S3"].apply(): ...`). `Mutant.elsewhere` names the spec-side
variant of the same bug (tests/spec, on spec's own operations) and the fuzz
corpus case that replays its scenario on real models; a test checks those
names exist.

A mutant is a replaced method, or a method whose source is re-compiled with
one marked line changed (`mutated`, which fails loudly if impl's source no
longer has that line, so a mutant never silently becomes a no-op).
"""
from __future__ import annotations

import contextlib
import inspect
import sys
import textwrap
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx

import impl.media
from impl import prefix_cache as pc_module
from impl.caches.kv import KVSnapshot
from impl.prefix_cache import PrefixCache
from impl.trie import Trie as ImplTrie


@contextlib.contextmanager
def patched(owner, name: str, value):
    """Set owner.name = value for the duration; restore it afterwards (a class's inherited
    attribute, e.g. PrefixCache.evictable from impl/eviction.py, is deleted again)."""
    inherited = isinstance(owner, type) and name not in owner.__dict__
    old = getattr(owner, name) if inherited or not isinstance(owner, type) else owner.__dict__[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        if inherited:
            delattr(owner, name)
        else:
            setattr(owner, name, old)


def mutated(func, old: str, new: str, **extra):
    """`func` re-compiled with the source line fragment `old` replaced by
    `new` (exactly one occurrence), in its module's globals plus `extra`."""
    src = textwrap.dedent(inspect.getsource(func))
    if src.count(old) != 1:
        raise AssertionError(f"mutant out of date: {func.__qualname__} no longer contains {old!r} exactly once")
    module = sys.modules[func.__module__]
    scope = dict(vars(module), **extra)
    names: dict = {}
    exec(compile(src.replace(old, new), f"<mutant of {func.__qualname__}>", "exec"), scope, names)
    return names[func.__name__]


# ------------------------------------------------------------ historical bugs
def s3_page_out_skips_node_with_any_snapshot():
    """S3: page-out skipped a node that already had any snapshot (the head split
    off at close has KV halves, so its whole-state layers were never captured)."""
    def _page_out(self, node):
        if any(s is not None for s in node.snaps):
            return
        for i in self.stateful():
            self.trie.own(node, i, self.caches[i].snapshot(node.start))
    return patched(PrefixCache, "_page_out", _page_out)


def m2_captures_inside_media():
    """M2: a capture scheduled strictly inside a non-causal item stays there
    instead of landing at the item's end."""
    return patched(pc_module, "schedule", mutated(
        pc_module.schedule, "wanted[span[1] if span else c] = True", "wanted[c] = True"))


@contextlib.contextmanager
def m3_resume_inside_media():
    """M3: a match ending strictly inside a non-causal item is not moved to the
    item's start, and the resume search does not skip offsets inside items."""
    begin = mutated(PrefixCache.begin, "matched = span[0]", "pass")
    resume = mutated(PrefixCache._resume, "if _inside(x, spans) is None and all(", "if all(")
    with patched(PrefixCache, "begin", begin), patched(PrefixCache, "_resume", resume):
        yield


def p1_resumed_node_dropped():
    """P1: a resume strictly inside an edge dropped the node from the active
    path instead of splitting it at the live offset."""
    return patched(PrefixCache, "_split_at_live", lambda self, path, resume: [n for n in path if n.end <= resume])


def _silent_merge(cache, a, b):
    """KV merge that concatenates whatever it is given, adjacent or not."""
    if a is not None and b is not None and a.kind == "kv" and a.end != b.start:
        ka, va = a._rows()
        kb, vb = b._rows()
        k, v = mx.concatenate([ka, kb], axis=2), mx.concatenate([va, vb], axis=2)
        mx.eval(k, v)
        merged = KVSnapshot(a.start, a.start + k.shape[2], a.layer, keys=k, values=v)
        a.release()
        b.release()
        return merged
    return cache.merge_snapshots(a, b)


@contextlib.contextmanager
def g1_non_adjacent_concatenation():
    """G1: the trie's merge concatenates non-adjacent KV ranges silently. In
    the fixed impl no merge ever sees a non-adjacent pair (T1 + S1 make every
    pair adjacent), so the guard alone is an equivalent mutant. The mutant is
    the historical chain: the resumed node dropped from the path (P1), attach
    keeping a capture that starts after its node's start (the rebuilt node's
    edge begins earlier than its KV snapshot), and the silent merge."""
    merge = mutated(ImplTrie.merge_with_child, "merged = cache.merge_snapshots(a, b)", "merged = _silent_merge(cache, a, b)",
                    _silent_merge=_silent_merge)
    attach = mutated(PrefixCache.attach, 'if node.snaps[i] is not None or (s.kind == "kv" and s.start > node.start):',
                     "if node.snaps[i] is not None:")
    with patched(ImplTrie, "merge_with_child", merge), patched(PrefixCache, "attach", attach), p1_resumed_node_dropped():
        yield


def e2_whole_active_path_protected():
    """E2: eviction protected the whole active path, not just root, frontier
    and branch points."""
    return patched(PrefixCache, "evictable",
                   lambda self, n: n is not self.root and n not in self.path and len(n.children) < 2)


# ------------------------------------------------- issue 18: one test each
def e2_branch_points_evictable():
    """E2: eviction no longer protects branch points (only root and frontier).
    Evicting a node with two children merges it into one of them: before the
    machine judged E2 where the victim is chosen, this surfaced minutes later
    as a crash inside merge_with_child."""
    return patched(PrefixCache, "evictable", lambda self, n: n is not self.root and n is not self.frontier)


def e3_tie_break_reversed():
    """E3: among nodes last used at the same time, eviction takes the shallower
    and smaller first (the tie-break reversed)."""
    return patched(PrefixCache, "evict_order", mutated(
        PrefixCache.evict_order, "return (n.last_used, -n.end, -n.bytes())", "return (n.last_used, n.end, n.bytes())"))


def s1_capture_not_clipped():
    """S1: attach puts a KV capture that starts before its node on the node
    whole, instead of clipping it to the node's edge."""
    return patched(PrefixCache, "attach", mutated(
        PrefixCache.attach, 'if s.kind == "kv" and s.start < node.start:', "if False:"))


def p2_compaction_drops_whole_state():
    """P2 before its 2026-12-02 revision: compaction merged every non-user
    single-child node, so the branch-point capture begin had just scheduled and
    each earlier turn's end were thrown away (hybrid regenerations resumed at 0)."""
    return patched(PrefixCache, "_compact", mutated(
        PrefixCache._compact, 'if not n.user and len(n.children) == 1 and all(s is None or s.kind == "kv" for s in n.snaps):',
        "if not n.user and len(n.children) == 1:"))


def c2_resume_one_checkpoint_low():
    """C2: begin resumes one checkpoint below the deepest one the trie serves
    (a silent loss of reuse: the field's most common hybrid bug)."""
    real = PrefixCache._resume

    def _resume(self, path, matched, common, spans):
        r = real(self, path, matched, common, spans)
        return r if r == 0 else real(self, path, r - 1, common, spans)
    return patched(PrefixCache, "_resume", _resume)


def fold_without_its_bit():
    """Section 1: impl's media fold loses FOLD_BIT, so a fold can equal a token id."""
    real = impl.media.MediaItem.fold.fget
    return patched(impl.media.MediaItem, "fold", property(lambda self: real(self) & (impl.media.FOLD_BIT - 1)))


@dataclass(frozen=True)
class Mutant:
    key: str            # short id: MUTANTS[key]
    name: str
    apply: Callable     # () -> context manager that installs the mutant
    mix: str            # the machine (layer mix) that hunts it
    cites: tuple        # rule ids (or conformance fields) a failure may cite; the first is the bug's own
    examples: int | None = None   # max_examples when the CI profile's is not enough (see the docs' table)
    elsewhere: tuple = ()         # the same bug elsewhere: "tests/...py::test_name" or "fuzz/corpus/....json"

    @property
    def rule(self) -> str:
        return self.cites[0]

    @property
    def doc(self) -> str:
        return " ".join(inspect.getdoc(self.apply).split())


MUTANTS = {m.key: m for m in [
    # S3, M3 and S1 have the rarest triggers, so they get 1000 examples (a hunt stops at its first failure, so
    # the margin costs nothing while the trigger comes early). Even derandomised, Hypothesis's sequence depends
    # on the machine's code and on what the process has imported (it mixes constants found in loaded modules
    # into generation): S3 on the hybrid machine came after 87 runs standalone but not in 581 under pytest;
    # on kv_recurrent it has come after 500-660 runs in every setting tried.
    Mutant("S3", "S3 page-out skips a node with any snapshot", s3_page_out_skips_node_with_any_snapshot,
           "kv_recurrent", ("S3",), examples=1000,
           elsewhere=("tests/spec/test_historical_bugs.py::test_s3_bug_page_out_skips_a_split_head",
                      "tests/impl/test_prefix_cache_rules.py::test_s3_historical_bug_is_caught",
                      "fuzz/corpus/hist-prefix-response-hybrid.json")),
    Mutant("M2", "M2 captures left inside non-causal media", m2_captures_inside_media, "kv", ("M2",),
           elsewhere=("tests/spec/test_historical_bugs.py::test_m2_bug_capture_inside_an_item",
                      "tests/impl/test_engine_media.py::test_historical_media_bug_breaks_rules")),
    # M3 and S1 need a bytes-only media item stored, then re-sent longer and non-causal (requests.Media).
    Mutant("M3", "M3 resume left inside non-causal media", m3_resume_inside_media, "kv", ("M3", "C2"),
           examples=1000,
           elsewhere=("tests/spec/test_historical_bugs.py::test_m3_bug_match_inside_an_item_not_moved_to_its_start",
                      "tests/impl/test_engine_media.py::test_historical_media_bug_breaks_c1")),
    Mutant("P1", "P1 resumed node dropped, not split", p1_resumed_node_dropped, "kv", ("P1", "T3"),
           elsewhere=("tests/spec/test_historical_bugs.py::test_p1_bug_resumed_node_dropped_from_the_path",
                      "tests/impl/test_prefix_cache_rules.py::test_p1_historical_bug_is_caught",
                      "fuzz/corpus/hist-resume-inside-edge-evict.json")),
    Mutant("G1", "G1 non-adjacent KV ranges concatenated", g1_non_adjacent_concatenation, "kv",
           ("G1", "S1", "C1", "P1", "T3"),
           elsewhere=("tests/spec/test_historical_bugs.py::test_p1_bug_without_g1_merges_non_adjacent_ranges_silently",
                      "fuzz/corpus/hist-resume-inside-edge-evict.json")),
    Mutant("E2", "E2 whole active path protected", e2_whole_active_path_protected, "kv_recurrent",
           ("E2", "E1", "'victims'", "'tree'", "'counter'"),
           elsewhere=("tests/spec/test_historical_bugs.py::test_e2_bug_whole_active_path_protected_grows_without_bound",
                      "tests/impl/test_prefix_cache_rules.py::test_e2_historical_bug_is_caught",
                      "fuzz/corpus/hist-long-conversation-over-budget.json")),
    Mutant("E2b", "E2 branch points evictable", e2_branch_points_evictable, "kv", ("E2",)),
    Mutant("E3", "E3 tie-break reversed (shallower, smaller first)", e3_tie_break_reversed, "kv",
           ("E3", "'victims'", "'tree'"),
           elsewhere=("stateful_tests/test_directed.py::test_eviction_order_with_tied_clocks_is_the_specs",)),
    Mutant("S1", "S1 capture not clipped to its node", s1_capture_not_clipped, "kv_windowed", ("S1",), examples=1000,
           elsewhere=("stateful_tests/test_directed.py::test_legacy_trie_floors_the_match_and_clips_the_capture",)),
    Mutant("P2", "P2 compaction merges whole-state checkpoints away (pre-revision)", p2_compaction_drops_whole_state,
           "kv_recurrent", ("P2", "C2", "E5"),
           elsewhere=("tests/spec/test_rules_mutations.py::test_p2_compaction_that_drops_a_whole_state_checkpoint_is_flagged",)),
    Mutant("C2", "C2 resume one checkpoint below the deepest", c2_resume_one_checkpoint_low, "kv_recurrent",
           ("C2", "E5"), elsewhere=("tests/spec/test_rules_mutations.py::test_p2_regeneration_resumes_at_the_branch_point_capture",)),
    Mutant("fold", "media fold without its bit", fold_without_its_bit, "kv", ("'keys'",)),
]}
