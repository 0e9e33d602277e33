"""The seed's historical bugs (REFERENCE section 3, seed/000) re-introduced
into impl, one mutant each, to prove the conformance machines have teeth.

Every mutant patches impl at run time (never spec, never a file): either a
method replaced by a small variant, or a method whose source is re-compiled
with one marked line changed (`mutated`, which fails loudly if impl's source
no longer has that line, so a mutant never silently becomes a no-op).

`hunt(mutant)` runs the mutant's conformance machine (impl's own checked
assertions off, IMPL_CHECK=False, so detection is by the machine's
invariants) under bounded settings and reports whether it failed, which
rule ids the failure cites, the time to the first failing example, the
total time (search + shrinking) and the number of steps of the shrunk
program. `python -m stateful_tests.historical_bugs` prints the table that
docs/stateful_tests.md records.
"""
from __future__ import annotations

import contextlib
import inspect
import re
import sys
import textwrap
import time
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx

from impl import prefix_cache as pc_module
from impl import trie as trie_module
from impl.caches.kv import KVSnapshot
from impl.prefix_cache import PrefixCache
from impl.trie import Trie
from stateful_tests.machines import INVARIANTS, ConformanceMachine, machine_for

RULE_ID = re.compile(r"\b([TSMPGEAC][1-5])\b")
FIELD = re.compile(r"'(?:tree|counter|path|live|seq|offset|clock|request)'")   # conformance mismatch fields


@contextlib.contextmanager
def patched(owner, name: str, value):
    """Set owner.name = value for the duration; restore it afterwards."""
    old = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
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


# ------------------------------------------------------------------ the mutants
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
        a.close()
        b.close()
        return merged
    return cache.merge(a, b)


@contextlib.contextmanager
def g1_non_adjacent_concatenation():
    """G1: the trie's merge concatenates non-adjacent KV ranges silently. In
    the fixed impl no merge ever sees a non-adjacent pair (T1 + S1 make every
    pair adjacent), so the guard alone is an equivalent mutant. The mutant is
    the historical chain: the resumed node dropped from the path (P1), attach
    keeping a capture that starts after its node's start (the rebuilt node's
    edge begins earlier than its KV snapshot), and the silent merge."""
    merge = mutated(Trie.merge_with_child, "merged = cache.merge(a, b)", "merged = _silent_merge(cache, a, b)",
                    _silent_merge=_silent_merge)
    attach = mutated(PrefixCache.attach, 'if node.snaps[i] is not None or (s.kind == "kv" and s.start > node.start):',
                     "if node.snaps[i] is not None:")
    with patched(Trie, "merge_with_child", merge), patched(PrefixCache, "attach", attach), p1_resumed_node_dropped():
        yield


def e2_whole_active_path_protected():
    """E2: eviction protected the whole active path, not just root, frontier
    and branch points."""
    return patched(PrefixCache, "evictable",
                   lambda self, n: n is not self.root and n not in self.path and len(n.children) < 2)


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str
    apply: Callable
    mix: str
    cites: tuple        # rule ids (or conformance fields) a failure may cite; the first is the bug's own
    examples: int | None = None   # max_examples when the CI profile's is not enough (see the docs' table)
    reachable: bool = True        # False: no request sequence can trigger it (an equivalent mutant today)

    @property
    def doc(self) -> str:
        return " ".join(inspect.getdoc(self.apply).split())


MUTANTS = {m.name: m for m in [
    # S3's trigger is the rarest. Even derandomised, Hypothesis's sequence depends on what the process has
    # imported (it mixes constants found in loaded modules into generation): with 400 examples the
    # machine caught S3 alone but not after the scheduler machine's module was collected. 1000 catches it
    # in both (first failure after ~6 s either way when it is found early).
    Mutant("S3 page-out skips a node with any snapshot", "S3", s3_page_out_skips_node_with_any_snapshot,
           "kv_recurrent", ("S3",), examples=1000),
    Mutant("M2 captures left inside non-causal media", "M2", m2_captures_inside_media, "kv", ("M2",)),
    Mutant("M3 resume left inside non-causal media", "M3", m3_resume_inside_media, "kv", ("M3",),
           reachable=False),
    Mutant("P1 resumed node dropped, not split", "P1", p1_resumed_node_dropped, "kv", ("P1", "T3")),
    Mutant("G1 non-adjacent KV ranges concatenated", "G1", g1_non_adjacent_concatenation, "kv",
           ("G1", "S1", "C1", "P1", "T3")),
    Mutant("E2 whole active path protected", "E2", e2_whole_active_path_protected, "kv_recurrent",
           ("E1", "E2", "'tree'", "'counter'")),
]}


class _Hunt:
    """Per-hunt bookkeeping, filled by the machine's teardown."""
    t0 = 0.0
    first_failure_s = None
    failing_runs = 0
    last_failing_steps = None
    runs = 0


class HuntingMachine(ConformanceMachine):
    IMPL_CHECK = False

    def teardown(self):
        super().teardown()
        _Hunt.runs += 1
        exc = sys.exc_info()[1]
        if isinstance(exc, Exception) and not type(exc).__module__.startswith("hypothesis"):   # a failing run
            _Hunt.failing_runs += 1
            _Hunt.last_failing_steps = self.steps
            if _Hunt.first_failure_s is None:
                _Hunt.first_failure_s = time.perf_counter() - _Hunt.t0


def hunt_settings(mutant: Mutant, parent=None):
    """The CI profile (derandomized, so detection is reproducible), no
    database, with the mutant's max_examples override if it has one."""
    from hypothesis import settings
    parent = parent or settings.get_profile("ci")
    return settings(parent, database=None, derandomize=True,
                    **({"max_examples": mutant.examples} if mutant.examples else {}))


def hunt(mutant: Mutant, hyp_settings, shrink_seconds: float = 5.0) -> dict:
    """Run `mutant`'s machine under `hyp_settings`, shrinking for at most
    `shrink_seconds` (Hypothesis' own cap is 300 s); see the module docstring."""
    from hypothesis.internal.conjecture import engine
    from hypothesis.stateful import run_state_machine_as_test
    machine = machine_for(mutant.mix, base=HuntingMachine)
    _Hunt.t0, _Hunt.first_failure_s, _Hunt.failing_runs, _Hunt.last_failing_steps, _Hunt.runs = \
        time.perf_counter(), None, 0, None, 0
    error = None
    with mutant.apply(), patched(engine, "MAX_SHRINKING_SECONDS", shrink_seconds):
        try:
            run_state_machine_as_test(machine, settings=hyp_settings)
        except Exception as e:               # the failure we hunt for (or an impl crash)
            error = e
    total = time.perf_counter() - _Hunt.t0
    errors = list(getattr(error, "exceptions", None) or ([error] if error is not None else []))
    message = "\n".join(f"{type(e).__name__}: {e}" for e in errors)   # several when Hypothesis found distinct bugs
    notes = "\n".join(getattr(errors[0], "__notes__", [])) if errors else ""
    checks = tuple(f"state.{name}(" for name in INVARIANTS) + ("state.teardown(",)
    program = [line for line in notes.splitlines() if line.startswith(("state.", "conversations_"))
               and not line.startswith(checks)]
    return {
        "mutant": mutant.name, "rule": mutant.rule, "mix": mutant.mix, "detected": error is not None,
        "max_examples": hyp_settings.max_examples,
        "cited": sorted(set(RULE_ID.findall(message)) | set(FIELD.findall(" ".join(
            line for line in message.splitlines() if "conformance mismatch" in line)))), "message": message.splitlines()[0][:300] if message else "",
        "first_failure_s": _Hunt.first_failure_s, "total_s": total, "runs": _Hunt.runs,
        "shrunk_steps": len(program) - 1 if program else None, "program": program,   # rules after configure
    }


def table(results) -> str:
    lines = ["| mutant | machine | max_examples | detected | cites | 1st failure (s) | total incl. shrink (s) | "
             "runs | shrunk steps |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        first = "-" if r["first_failure_s"] is None else f"{r['first_failure_s']:.1f}"
        lines.append(f"| {r['mutant']} | {r['mix']} | {r['max_examples']} | {r['detected']} | {', '.join(r['cited'])} | {first} | "
                     f"{r['total_s']:.1f} | {r['runs']} | {r['shrunk_steps']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import conftest  # noqa: F401  (root conftest: registers the profiles)
    results = []
    for m in [m for m in MUTANTS.values() if m.reachable]:
        r = hunt(m, hunt_settings(m))
        results.append(r)
        print(f"\n## {m.name}\n{r['message']}\n" + "\n".join(r["program"]), flush=True)
    print()
    print(table(results))
