"""The conformance machines hunting the mutant set (stateful_tests/mutants.py:
the seed's historical bugs and the bugs issue 18 found guarded by one
directed test each), to prove the machines have teeth.

`hunt(mutant)` runs the mutant's conformance machine (impl's own checked
assertions off, IMPL_CHECK=False, so detection is by the machine's
invariants) under bounded settings and reports whether it failed, which
rule ids the failure cites, the time to the first failing example, the
total time (search + shrinking) and the number of steps of the shrunk
program. `python -m stateful_tests.historical_bugs` prints the table that
docs/stateful_tests.md records.
"""
from __future__ import annotations

import re
import statistics
import sys
import json
import time

from stateful_tests.machines import ConformanceMachine, machine_for
from stateful_tests.mutants import MUTANTS, Mutant, patched

__all__ = ["MUTANTS", "Mutant", "hunt", "hunt_settings", "table"]

RULE_ID = re.compile(r"\b([TSMPGEAC][1-5])\b")
FIELD = re.compile(r"'(?:tree|counter|path|live|seq|offset|clock|request|keys|victims)'")   # conformance mismatch fields


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
    from hypothesis.internal.conjecture import engine, providers
    from hypothesis.stateful import run_state_machine_as_test
    machine = machine_for(mutant.mix, base=HuntingMachine)
    _Hunt.t0, _Hunt.first_failure_s, _Hunt.failing_runs, _Hunt.last_failing_steps, _Hunt.runs = \
        time.perf_counter(), None, 0, None, 0
    error = None
    # Hypothesis mixes constants found in every loaded local module into what it draws, so a
    # derandomised search would depend on which tests ran before in the same process (pytest-xdist
    # hands them out by timing): the hunt draws from no such pool, and finds the same thing everywhere.
    none = providers.Constants()
    with mutant.apply(), patched(engine, "MAX_SHRINKING_SECONDS", shrink_seconds), \
            patched(providers, "_get_local_constants", lambda: none):
        try:
            run_state_machine_as_test(machine, settings=hyp_settings)
        except Exception as e:               # the failure we hunt for (or an impl crash)
            error = e
    total = time.perf_counter() - _Hunt.t0
    errors = list(getattr(error, "exceptions", None) or ([error] if error is not None else []))
    message = "\n".join(f"{type(e).__name__}: {e}" for e in errors)   # several when Hypothesis found distinct bugs
    notes = "\n".join(getattr(errors[0], "__notes__", [])) if errors else ""
    checks = ("state.checks(", "state.teardown(")
    program = [line for line in notes.splitlines() if line.startswith(("state.", "conversations_"))
               and not line.startswith(checks)]
    return {
        "mutant": mutant.name, "rule": mutant.rule, "mix": mutant.mix, "detected": error is not None,
        "max_examples": hyp_settings.max_examples,
        "cited": sorted(set(RULE_ID.findall(message)) | set(FIELD.findall(" ".join(
            line for line in message.splitlines() if "conformance mismatch" in line)))),
        "message": message.splitlines()[0][:300] if message else "",
        "first_failure_s": _Hunt.first_failure_s, "total_s": total, "runs": _Hunt.runs,
        "shrunk_steps": len(program) - 1 if program else None, "program": program,   # rules after configure
    }


def table(results) -> str:
    lines = ["| mutant | machine | max_examples | detected | cites | 1st failure (s) | total incl. shrink (s) | "
             "runs | shrunk steps |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        first = "-" if r["first_failure_s"] is None else f"{r['first_failure_s']:.1f}"
        lines.append(f"| {r['mutant']} | {r['mix']} | {r['max_examples']} | {r['detected']} | "
                     f"{', '.join(r['cited'])} | {first} | {r['total_s']:.1f} | {r['runs']} | {r['shrunk_steps']} |")
    return "\n".join(lines)


def medians(results) -> dict:
    """Median time to the first failure and median shrunk length over the detected mutants."""
    found = [r for r in results if r["detected"] and r["first_failure_s"] is not None]
    return {"detected": f"{len(found)}/{len(results)}",
            "median_first_failure_s": round(statistics.median(r["first_failure_s"] for r in found), 1) if found else None,
            "median_shrunk_steps": statistics.median(r["shrunk_steps"] for r in found if r["shrunk_steps"] is not None)
            if found else None}


if __name__ == "__main__":
    # python -m stateful_tests.historical_bugs [KEY ...]   (CI=true for the ci profile)
    import conftest  # noqa: F401  (root conftest: registers the profiles)
    if sys.argv[1:2] == ["--json"]:          # one hunt, its result as JSON (test_historical_bugs' fresh process)
        r = hunt(MUTANTS[sys.argv[2]], hunt_settings(MUTANTS[sys.argv[2]]))
        print("\n" + json.dumps({k: v for k, v in r.items() if k != "program"} | {"program": r["program"]}))
        sys.exit(0)
    results = []
    for m in [MUTANTS[k] for k in sys.argv[1:]] or list(MUTANTS.values()):
        r = hunt(m, hunt_settings(m))
        results.append(r)
        print(f"\n## {m.name}\n{r['message']}\n" + "\n".join(r["program"]), flush=True)
    print()
    print(table(results))
    print(medians(results))
