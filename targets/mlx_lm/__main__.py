"""`./dev check-mlx-lm [--minutes N] [--report DIR] [--models a,b] [--lru FILE.py:FACTORY] [--save] [--hollow]`
`python -m targets.mlx_lm replay` (saved findings on the installed mlx-lm) and
`python -m targets.mlx_lm render DIR` (report.md and scripts again from DIR/report.json).
`python -m targets.mlx_lm onefix [--dir D]` (every saved finding's script against a copy of mlx-lm per
bug with only that bug fixed: targets/mlx_lm/onefix.py; exit 1 when the table is not the identity).

check: hunts distinct rule violations from scratch for N minutes (default 10), writes the report
(report.md, report.json, programs/<RULE>-<cause>.json and _repro.py per violation) to DIR (default
reports/mlx-lm); --save also stores the findings in targets/mlx_lm/findings/. --lru runs against
another cache: FACTORY(prompt_cache_size, prompt_cache_bytes) stands for server.run's construction
(a hand-fixed copy, to show the adapter raises no false alarms). --hollow is the fast tier: hollow
models (targets/mlx_lm/hollow.py), every rule but C1, each finding confirmed on the real models.
Exit status: 0 whatever is found (findings are the product); 2 on bad arguments, or an mlx-lm without
mlx_lm.models.cache.LRUPromptCache (before 0.32), in one line.
replay: every saved finding; "reproduces" on the pinned version, "fixed upstream in X" when a newer
mlx-lm no longer shows it; exit 1 only when a finding stops reproducing on the version it was found on.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path


def _version() -> str:
    from importlib.metadata import version
    return version("mlx-lm")


def _lru(spec):
    if not spec:
        return None
    path, _, name = spec.partition(":")
    if path.endswith(".py"):
        import importlib.util
        s = importlib.util.spec_from_file_location("scratch_lru", path)
        mod = importlib.util.module_from_spec(s)
        s.loader.exec_module(mod)
    else:
        mod = importlib.import_module(path)
    return getattr(mod, name or "LRUPromptCache")


def _unsupported() -> str | None:
    """Why the installed mlx-lm cannot be driven (one line), or None: the target drives the cache the
    0.32 server keeps in mlx_lm.models.cache (earlier versions keep another in mlx_lm/server.py)."""
    try:
        from mlx_lm.models.cache import LRUPromptCache  # noqa: F401
    except ImportError:
        from targets.mlx_lm import MLX_LM_RANGE
        return (f"mlx-lm {_version()} has no mlx_lm.models.cache.LRUPromptCache, the server prompt cache "
                f"this target drives (checked against mlx-lm {MLX_LM_RANGE}; pip install 'mlx-lm{MLX_LM_RANGE}')")
    return None


def check(args) -> int:
    from targets.mlx_lm import machine, models, report
    names = args.models.split(",") if args.models else list(models.MODEL_NAMES)
    bad = [n for n in names if n not in models.MODEL_NAMES]
    if bad:
        print(f"unknown models {bad}; known: {models.MODEL_NAMES}", file=sys.stderr)
        return 2
    version = _version()
    print(f"mlx-lm {version}; models {names}; {args.minutes} min", flush=True)
    t = time.perf_counter()
    found = machine.search(names, args.minutes, lru_class=_lru(args.lru), log=lambda s: print(s, flush=True),
                           hollow=args.hollow)
    seconds = time.perf_counter() - t
    meta = {"seconds": seconds, "steps": machine.STATS["steps"],
            "steps_per_s": machine.STATS["steps"] / max(machine.STATS["seconds"], 1e-9),
            "steps_per_s_overall": machine.STATS["steps"] / max(seconds, 1e-9),
            "command": "./dev check-mlx-lm " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "./dev check-mlx-lm",
            "lru": args.lru or "mlx_lm.models.cache:LRUPromptCache",
            "models": [r for r in report.model_rows() if r["name"] in names],
            "e1_worst": machine.E1_WORST, "paths": machine.PATHS,
            "hollow": args.hollow, "unconfirmed": machine.UNCONFIRMED,
            "rules": sorted(machine.tier_checker(args.hollow).enabled)}
    out = report.write(Path(args.report), found, machine.POLICY, meta, version)
    if args.save:
        for f in found:
            report.save_finding(report.finding_record(f, version))
    print(f"{len(found)} rule violations, {len(machine.POLICY)} kinds of policy difference; "
          f"{meta['steps_per_s']:.1f} steps/s; report: {out}")
    return 0


def replay(args) -> int:
    from targets.mlx_lm import machine, report
    version, status = _version(), 0
    for p in sorted(report.FINDINGS_DIR.glob("*.json")):
        rec = json.loads(p.read_text())
        verdict = machine.replay_status(rec, version)
        print(f"{p.name}: {verdict} (found on mlx-lm {rec['mlx_lm_version']}, installed {version})")
        status |= verdict == "does not reproduce"
    return int(status)


def render(args) -> int:
    """Re-write report.md and the scripts of DIR from its report.json (on the installed mlx-lm)."""
    from targets.mlx_lm import report
    d = json.loads((Path(args.dir) / "report.json").read_text())
    print(report.write(Path(args.dir), d["violations"], d["policy"], d["meta"], d["version"]))
    return 0


def onefix(args) -> int:
    from targets.mlx_lm.onefix import main as run
    return run(args.dir)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="check-mlx-lm")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--minutes", type=float, default=10.0)
    c.add_argument("--report", default="reports/mlx-lm")
    c.add_argument("--models", default="")
    c.add_argument("--lru", default="")
    c.add_argument("--save", action="store_true")
    c.add_argument("--hollow", action="store_true",
                   help="the fast tier: hollow models (the same cache states, no arithmetic), every rule but C1; "
                        "findings are confirmed on the real models")
    sub.add_parser("replay")
    r = sub.add_parser("render")
    r.add_argument("dir")
    o = sub.add_parser("onefix")
    o.add_argument("--dir", default="/tmp/mlx-lm-onefix")
    args = ap.parse_args(argv)
    why = _unsupported()
    if why:
        print(f"check-mlx-lm: {why}", file=sys.stderr)
        return 2
    return {"check": check, "replay": replay, "render": render, "onefix": onefix}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
