"""Random request programs (targets/program.py) against MlxVlmTarget, judged by spec.rules, and the
shrinking of a violating program to the fewest requests that still break the same rule.

Invariants: every program runs on a fresh target (a fresh manager, disk folder and model instance);
a program is kept as the JSON op list with the target's settings (`config`: image kind, images), so
`replay` rebuilds the same run; shrinking drops whole requests (begin .. close) and set_budget ops,
then shortens prompts from the end, keeping each media item whole.
"""
from __future__ import annotations

import time

from targets.mlx_vlm.target import MlxVlmTarget
from targets.program import judge, random_programs


def run(ops: list, config: dict, rule: str | None = None):
    t = MlxVlmTarget(**config)
    try:
        return judge(t, ops, want=rule)
    finally:
        t.shutdown()


def requests(ops: list) -> list:
    """The program as units: each request's ops (begin .. close), or a lone set_budget."""
    units, cur = [], []
    for op in ops:
        if op["op"] == "set_budget" and not cur:
            units.append([op])
            continue
        cur.append(op)
        if op["op"] == "close":
            units.append(cur)
            cur = []
    return units + ([cur] if cur else [])


def shrink(ops: list, config: dict, rule: str) -> list:
    """Drop units while `rule` is still broken."""
    units = requests(ops)
    i = 0
    while i < len(units):
        trial = units[:i] + units[i + 1:]
        flat = [op for u in trial for op in u]
        if flat and rule in run(flat, config, rule).rules:
            units = trial
        else:
            i += 1
    return [op for u in units for op in u]


CONFIGS = tuple({"arch": a, "image_kind": k, "media": m} for m in ("image", "video")
                for a in ("qwen2_vl", "qwen3_5") for k in ("random", "solid")) + \
    ({"arch": "gemma3", "image_kind": "random", "media": "none"},)        # windowed: text-only programs


def hunt(minutes: float, seed: int = 0, configs=CONFIGS, log=print) -> dict:
    """Programs until `minutes` pass, round-robin over `configs`; returns {"found": {rule: the first
    violating program, shrunk}, "stats": counts of programs and operations run}."""
    t0, found, stats = time.monotonic(), {}, {"programs": 0, "ops": 0, "errors": []}
    gens = [random_programs(seed, media=c.get("media") != "none") for c in configs]
    while time.monotonic() - t0 < minutes * 60:
        for config, gen in zip(configs, gens):
            ops = next(gen)
            v = run(ops, config)
            stats["programs"] += 1
            stats["ops"] += v.steps
            if v.error:
                stats["errors"].append(v.error)
            for r in sorted(v.rules - set(found)):
                small = shrink(ops[:v.steps], config, r)
                found[r] = {"rule": r, "config": config, "ops": small,
                            "violations": [str(x) for x in run(small, config, r).violations],
                            "seconds": round(time.monotonic() - t0, 1)}
                log(f"{r} after {found[r]['seconds']} s: {len(small)} ops")
    stats["seconds"] = round(time.monotonic() - t0, 1)
    return {"found": found, "stats": stats}
