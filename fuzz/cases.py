"""Fuzz cases: one fresh engine and a sequence of concrete operations (fuzz.workload), run with
every oracle on (fuzz.oracle), and their replayable JSON form.

Shared by the campaign (fuzz/campaign.py), the shrinker (fuzz/shrink.py), replay
(``python -m fuzz replay``) and the corpus builder (fuzz/make_corpus.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from impl.models import load

from .oracle import ColdOracle, Failure, Runner
from .workload import CASE_FORMAT, checkpoint_bytes, parse_budget, strip_private


def resolve_settings(loaded, budget="8ckpt", chunk_size=16, capture_interval=32, near_end=4) -> dict:
    per_ckpt = checkpoint_bytes(loaded, capture_interval)
    return {"budget": parse_budget(budget, per_ckpt), "budget_spec": str(budget), "ckpt_bytes": per_ckpt,
            "chunk_size": int(chunk_size), "capture_interval": int(capture_interval), "near_end": int(near_end)}


def case_settings(case: dict, loaded) -> dict:
    """Engine settings of a case; a budget given as '<n>ckpt' is resolved on this machine."""
    e = dict(case["engine"])
    s = resolve_settings(loaded, e.get("budget_spec", e["budget"]), e.get("chunk_size", 16),
                         e.get("capture_interval", 32), e.get("near_end", 4))
    if "budget_spec" not in e:
        s["budget"] = int(e["budget"])
    ops = []
    for op in case["requests"]:
        if op["op"] == "set_budget" and isinstance(op["bytes"], str):
            op = {**op, "bytes": parse_budget(op["bytes"], s["ckpt_bytes"])}
        ops.append(op)
    return s, ops


@dataclass
class CaseResult:
    records: list
    failure: Failure | None = None
    failed_at: int | None = None
    leaked: int = 0
    ties: list = field(default_factory=list)


def run_ops(loaded, settings: dict, ops: list, oracle: ColdOracle, on_op=None) -> CaseResult:
    runner = Runner(loaded, settings, oracle)
    res = CaseResult(runner.records)
    try:
        for i, op in enumerate(ops):
            try:
                rec, _ = runner.run(op, i)
            except Failure as f:
                res.failure, res.failed_at = f, i
                break
            except Exception as e:       # a bug of the harness or an unexpected impl error
                res.failure, res.failed_at = Failure(f"exception:{type(e).__name__}", repr(e)), i
                break
            if on_op is not None:
                on_op(rec)
    finally:
        res.leaked = runner.close()
        res.ties = runner.tie_notes
    if res.failure is None and res.leaked:
        res.failure = Failure("A2", f"{res.leaked} snapshots alive after the engine was torn down")
        res.failed_at = len(ops) - 1
    return res


def run_case(case: dict, oracle: ColdOracle | None = None, on_op=None) -> CaseResult:
    if case.get("format") != CASE_FORMAT:
        raise ValueError(f"not a fuzz case (format {case.get('format')!r}, expected {CASE_FORMAT})")
    loaded = load(case["model"], case.get("dtype"))
    settings, ops = case_settings(case, loaded)
    return run_ops(loaded, settings, ops, oracle or ColdOracle(), on_op)


def make_case(model: str, settings: dict, ops: list, failure: Failure | None = None, **meta) -> dict:
    return {"format": CASE_FORMAT, "model": model,
            "engine": {k: settings[k] for k in ("budget", "budget_spec", "chunk_size", "capture_interval",
                                                "near_end")},
            "requests": [strip_private(op) for op in ops],
            "failure": None if failure is None else {"signature": failure.signature, "message": failure.message},
            **meta}
