"""python -m fuzz.calibrate_report --report DIR [--model M ...] [--dtype D ...]

For each model and dtype on this device: the calibrated C1 tolerance (fuzz/calibrate.py) and every
planted wrong state of fuzz/planted.py, its divergence from the cold run and its margin over the
tolerance. Writes DIR/calibration.md and DIR/calibration.json; exit 1 if a planted state is flagged
by none of the oracles.

A planted state is flagged
  - by the exact oracle, where same-schedule replays are bit-identical here (fuzz/replay.py): its
    logits or greedy tokens differ at all from the unplanted state built by the same forwards
    (planted.exact_reference), or it has no legitimate schedule (a split non-causal item, M1);
  - else by the logits, when max |logits - cold| >= MARGIN x tol (MARGIN = 5: a wide, measured margin);
  - else by the greedy tokens, when its greedy run leaves the cold run's at a step whose cold top-2
    gap is at least the calibrated tie gap (noise of at most tol per logit cannot do that);
  - else by the float32 recheck (the campaign's --recheck: the case replayed on the float32 model,
    on the CPU when this device runs float32 in TF32), when the same plant in float32 on that device
    clears MARGIN x its own calibrated tolerance.
Half precision rounds the logits to 2^-8 (bfloat16) of their size: a plant whose effect is smaller
than that is invisible at the output of a half-precision run, whatever the threshold; only a
float32 run sees it, so that is the stronger oracle, not a looser threshold.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from . import calibrate, planted
from .replay import replay_is_exact

MARGIN = 5.0


def prompt(lm) -> tuple[list, int]:
    n = 40 if lm.name == "smollm2" else 48
    return np.random.default_rng(5).integers(1, lm.vocab_size, n).tolist(), n


def plant_rows(lm, cal, plants=planted.PLANTS) -> list:
    toks, n = prompt(lm)
    rows, cold = [], None
    for name in plants:
        r = n - 6 if name == "media_split" else n - 2
        run = planted.plant(lm, name, toks, r)
        if run is None:
            continue
        if name == "media_split":
            ref = planted.reference(lm, name, toks, r)
        else:                      # the stock cold run does not depend on the plant: computed once
            ref = cold = cold or planted.reference(lm, name, toks, r)
        dv = planted.divergence(run, ref)
        ex = planted.exact_reference(lm, name, toks, r)
        exact = None if ex is None else planted.divergence(run, ex)
        rows.append({"plant": name, "max": dv["max"], "rms": dv["rms"], "margin": dv["max"] / cal.tol,
                     "token_step": dv["token_step"], "token_gap": dv["gap"],
                     "by_tokens": dv["token_step"] is not None and dv["gap"] >= cal.tie,
                     "exact_diff": None if exact is None else exact["max"],
                     "by_exact": exact is None or exact["max"] > 0 or exact["token_step"] is not None})
    return rows


def float32_margins(name: str) -> tuple[dict, str]:
    """Each plant's margin on the float32 model on the recheck device (CPU under TF32)."""
    from impl.models import load
    with calibrate.recheck_device():
        lm = load(name, "float32")
        cal = calibrate.calibration(lm)
        return {r["plant"]: r["margin"] for r in plant_rows(lm, cal)}, calibrate.device_key()


def verdict(row: dict, f32: dict | None, exact: bool = False) -> str:
    if exact and row["by_exact"]:
        return "exact replay"
    if row["margin"] >= MARGIN:
        return "logits"
    if row["by_tokens"]:
        return "greedy tokens"
    if f32 is not None and f32.get(row["plant"], 0) >= MARGIN:
        return "float32 recheck"
    return "NOT SEPARATED"


def run(models, dtypes) -> list:
    from impl.models import load
    out = []
    for name in models:
        for dtype in dtypes:
            if dtype == "q4" and name != "smollm2":
                continue
            t0 = time.perf_counter()
            lm = load(name, dtype)
            cal = calibrate.calibration(lm)
            exact = replay_is_exact(lm)
            rows = plant_rows(lm, cal)
            weak = not exact and any(r["margin"] < MARGIN and not r["by_tokens"] for r in rows)
            f32, f32_dev = (float32_margins(name) if weak and (dtype != "float32" or "+tf32" in cal.device)
                            else (None, None))
            for r in rows:
                r["f32_margin"] = None if f32 is None else f32.get(r["plant"])
                r["verdict"] = verdict(r, f32, exact)
                r["calibrated_verdict"] = verdict(r, f32)
            out.append({"model": name, "dtype": dtype, "device": cal.device, "recheck_device": f32_dev,
                        "exact": exact, "new_platform": calibrate.announce(cal),
                        "calibration": cal.as_dict(), "plants": rows, "seconds": round(time.perf_counter() - t0, 1)})
            print(f"{name} {dtype} {cal.device}: noise {cal.noise:.3g} tol {cal.tol:.3g} | " + " | ".join(
                f"{r['plant']} {r['max']:.3g} ({r['margin']:.1f}x, {r['verdict']})" for r in rows), flush=True)
    return out


def markdown(res: list) -> str:
    lines = ["# C1 calibration and planted wrong states", "",
             f"tol = max(K x noise, {calibrate.FLOOR} ulp of the largest logit), K = {calibrate.K:g} "
             f"({calibrate.K_TF32:g} under TF32); flagged by the "
             f"logits at >= {MARGIN:g} x tol, else by greedy tokens at a non-tie step, else by the float32 "
             "recheck (fuzz/calibrate_report.py).", "",
             "| model | device | dtype | replay exact | noise (N, conf.) | tol | plant | max abs diff | margin (x tol) "
             "| greedy diverges at | float32 recheck margin | vs same schedule | flagged by | by the tolerance alone |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in res:
        c = e["calibration"]
        for r in e["plants"]:
            step = "-" if r["token_step"] is None else f"{r['token_step']} (gap {r['token_gap']:.2g})"
            f32 = "-" if r["f32_margin"] is None else f"{r['f32_margin']:.0f}x ({e['recheck_device']})"
            ex = "no schedule (M1)" if r["exact_diff"] is None else f"{r['exact_diff']:.3g}"
            lines.append(f"| {e['model']} | {e['device']} | {e['dtype']} | {'yes' if e['exact'] else 'no'} | "
                         f"{c['noise']:.2g} ({c['samples']}, {c['confidence']:.2f}) | {c['tol']:.2g} | "
                         f"{r['plant']} | {r['max']:.3g} | {r['margin']:.1f} | {step} | {f32} | {ex} | "
                         f"{r['verdict']} | {r['calibrated_verdict']} |")
    notes = [e["new_platform"] for e in res if e.get("new_platform")]
    return "\n".join(lines + [""] + [f"**{n}**" for n in notes]) + "\n"


def main(argv=None) -> int:
    from impl.models import DTYPES, MODEL_NAMES
    p = argparse.ArgumentParser(prog="python -m fuzz.calibrate_report")
    p.add_argument("--report", type=Path, default=Path("reports"))
    p.add_argument("--model", action="append", choices=MODEL_NAMES)
    p.add_argument("--dtype", action="append", choices=DTYPES)
    a = p.parse_args(argv)
    res = run(a.model or list(MODEL_NAMES), a.dtype or ["float32"])
    a.report.mkdir(parents=True, exist_ok=True)
    (a.report / "calibration.json").write_text(json.dumps(res, indent=1))
    (a.report / "calibration.md").write_text(markdown(res))
    print(f"wrote {a.report}/calibration.md")
    return 1 if any(r["verdict"] == "NOT SEPARATED" for e in res for r in e["plants"]) else 0


if __name__ == "__main__":
    sys.exit(main())
