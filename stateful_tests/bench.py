"""Throughput of the conformance machines (docs/stateful_tests.md, "Throughput").

    python -m stateful_tests.bench SECONDS [mix...]

prints steps/second per machine: Hypothesis generation, both sides, decoding
and every check included. A step is one operation on both sides (a begin, a
prefill chunk, a `produce` call, a close/cancel or a budget change).
"""
from __future__ import annotations

import time

from stateful_tests.machines import MIXES, ConformanceMachine, machine_for


class _Tally:
    steps = 0
    runs = 0


class CountingMachine(ConformanceMachine):
    """A conformance machine that adds its steps to the bench's tally."""

    def teardown(self):
        super().teardown()
        _Tally.steps += self.steps
        _Tally.runs += 1


def bench(seconds: float = 5.0, names=None) -> dict:
    """Steps per second of each machine (Hypothesis generation included),
    failures ignored: runs random examples until `seconds` have passed."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test
    out = {}
    for name in names or MIXES:
        cls = machine_for(name, base=CountingMachine)
        _Tally.steps = _Tally.runs = 0
        t0 = time.perf_counter()
        failures = 0
        while time.perf_counter() - t0 < seconds:
            try:
                run_state_machine_as_test(cls, settings=settings(
                    max_examples=20, stateful_step_count=40, deadline=None, database=None,
                    phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
            except Exception:
                failures += 1
        wall = time.perf_counter() - t0
        out[name] = {"steps": _Tally.steps, "runs": _Tally.runs, "wall_s": round(wall, 2),
                     "steps_per_s": round(_Tally.steps / wall), "failing_runs": failures}
    return out


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(bench(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0, sys.argv[2:] or None), indent=1))
