"""Delta debugging over a failing case's operation list.

Every trial replays a subset of the operations, in order, on a fresh engine (fuzz.cases.run_ops)
with every oracle on; a subset "still fails" when it fails with the same signature (the rule ids or
oracle name, e.g. "rule:S3" or "C1-logits"). Operations are concrete, so any subset is a valid case.
The result is 1-minimal when the time bound allows (Zeller's ddmin: try removing each of n chunks,
refine n up to the list length), otherwise the smallest failing list found so far.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .cases import run_ops
from .oracle import ColdOracle, Failure


@dataclass
class Shrunk:
    ops: list
    failure: Failure | None


def shrink(loaded, settings: dict, ops: list, signature: str, seconds: float, oracle: ColdOracle | None = None):
    """Returns (Shrunk, trials)."""
    oracle = oracle or ColdOracle()
    deadline = time.perf_counter() + seconds
    trials = 0
    best = Shrunk(list(ops), None)

    def fails(cand: list):
        nonlocal trials
        trials += 1
        res = run_ops(loaded, settings, cand, oracle)
        if res.failure is not None and res.failure.signature == signature:
            return Shrunk(cand[:res.failed_at + 1], res.failure)
        return None

    first = fails(best.ops)
    if first is None:              # not reproducible from a fresh engine: keep the whole list
        return best, trials
    best = first
    n = 2
    while len(best.ops) >= 2 and time.perf_counter() < deadline:
        size = -(-len(best.ops) // n)
        chunks = [best.ops[i:i + size] for i in range(0, len(best.ops), size)]
        reduced = False
        for i in range(len(chunks)):
            if time.perf_counter() >= deadline:
                break
            cand = [op for j, c in enumerate(chunks) if j != i for op in c]
            got = fails(cand) if cand else None
            if got is not None:
                best, n, reduced = got, max(n - 1, 2), True
                break
        if not reduced:
            if n >= len(best.ops):
                break
            n = min(len(best.ops), 2 * n)
    return best, trials
