"""Iso-memory: ours at the budget that makes its bytes held equal mlx-lm's, then prefilled tokens compared.

The two caches' budgets mean different things (bench/suite.py): ours bounds paged-out bytes beyond the
live caches, mlx-lm's server bounds everything it holds. Equal nominal budgets therefore leave them
holding different bytes, so the comparison is made at equal bytes held instead. ``search`` bisects
ours' budget (bytes) over real runs of the workload, every run the same requests in the same order on a
fresh engine, for the largest budget at which ours' bytes held at the end of the workload (paged-out
snapshots + live caches, as ``held_ours``) do not exceed ``target`` (mlx-lm's), starting from ours'
run at its nominal budget: downwards when that run holds more, upwards when it holds less. Bytes held
move in steps (whole snapshots), so "equal" is the closest from below; the run just above it (budget,
bytes) is reported too. Where ours holds less than ``target`` even with an unlimited budget, that run is
the comparison.
"""
from __future__ import annotations

import gc

import mlx.core as mx

from bench.runners import Ours


def requests_of(wl, responses: dict) -> list:
    """(prompt, max_tokens, {sys_end, boundaries}) per request, with the responses of the reference run."""
    return [(wl.prompt(i, responses), r.max_tokens,
             {"sys_end": wl.sys_end(i, responses), "boundaries": wl.boundaries(i, responses)})
            for i, r in enumerate(wl.requests)]


def run_ours(lm, requests: list, budget: int, s) -> dict:
    """One real run of the workload by ours at ``budget``: tokens prefilled and evaluated, bytes held."""
    r = Ours(lm, budget, chunk=s.chunk, interval=s.interval, near_end=s.near_end, check=s.check_rules)
    prefilled = evaluated = held_max = 0
    tokens = []
    for prompt, max_tokens, meta in requests:
        out = r.run(prompt, max_tokens, **meta)
        prefilled += out.prefilled
        evaluated += out.prefilled + max(0, len(out.tokens) - 1)    # as suite.py's evaluated_ours
        held_max = max(held_max, r.held())
        tokens.append(out.tokens)
    held = r.held()
    r.close()
    gc.collect()
    mx.clear_cache()
    return {"budget": budget, "held": held, "held_max": held_max, "prefilled": prefilled, "evaluated": evaluated,
            "tokens": tokens}


AMPLE = 1 << 62


def search(lm, requests: list, s, target: int, step: int, start: dict) -> dict:
    """The largest budget (to within ``step`` bytes) at which ours' bytes held <= ``target``, by bisection
    from ``start`` (a run_ours result already made): downwards from it when it holds more than ``target``
    (``found`` is False when even budget 0 does: ours' live caches and protected nodes alone exceed it),
    upwards when it holds no more (when an unlimited budget holds no more either, that run is returned
    and ``above`` is None). ``above``: the run just above the boundary."""
    if step < 1 or target < 0:
        raise ValueError(f"iso-memory search needs step >= 1 and target >= 0 (got {step}, {target})")
    trials = []

    def trial(budget):
        x = run_ours(lm, requests, budget, s)
        trials.append({k: v for k, v in x.items() if k != "tokens"})
        return x

    if start["held"] > target:
        lo, hi = trial(0), start
        if lo["held"] > target:
            return {"found": False, "at": lo, "above": hi, "trials": trials}
    else:
        ample = trial(AMPLE)
        if ample["held"] <= target:
            return {"found": True, "at": ample, "above": None, "trials": trials}
        lo, hi = start, trial(max(start["budget"] + step, ample["held_max"]))    # pages out no more than ample
        if hi["held"] <= target:
            return {"found": True, "at": hi, "above": ample, "trials": trials}
    while hi["budget"] - lo["budget"] > step:
        x = trial((lo["budget"] + hi["budget"]) // 2)
        lo, hi = (x, hi) if x["held"] <= target else (lo, x)
    return {"found": True, "at": lo, "above": hi, "trials": trials}


def row_fields(lm, geom, wl, responses: dict, s, row: dict, ours_tokens: list) -> dict:
    """The iso-memory figures of one tight row of bench/suite.py (``row``: its figures at the nominal
    budgets; ``ours_tokens``: what ours generated there; the search starts from that run). Step: one
    token's KV bytes or one checkpoint, whichever is smaller, or 1/256 of the target if larger."""
    target = row["held_lru"]
    nominal = {"budget": row["budget_bytes"], "held": row["held_ours"], "held_max": row["held_max_ours"],
               "prefilled": row["prefilled_ours"], "evaluated": row["evaluated_ours"], "tokens": ours_tokens}
    step = max(1, min(x for x in (geom.kv_bytes_per_token, geom.checkpoint_bytes) if x > 0), target // 256)
    res = search(lm, requests_of(wl, responses), s, target, step, nominal)
    at, above = res["at"], res["above"]
    return {"iso_found": res["found"], "iso_budget": at["budget"],
            "iso_step": step,
            "iso_held_ours": at["held"], "iso_held_max_ours": at["held_max"],
            "iso_prefilled_ours": at["prefilled"], "iso_evaluated_ours": at["evaluated"],
            "iso_above_budget": None if above is None else above["budget"],
            "iso_above_held": None if above is None else above["held"], "iso_trials": res["trials"]}
