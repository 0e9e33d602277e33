"""`./dev check-mlx-vlm [--minutes N] [--seed S] [--report DIR]` | `./dev check-mlx-vlm replay F.json ...` |
`./dev check-mlx-vlm onefix [--dir DIR]`

Runs in mlx-vlm's own venv (MLXVLM_PYTHON; targets/mlx_vlm/install.sh).
check: random request programs (targets/program.py) against mlx-vlm's automatic prefix cache for N
minutes (default 10), on qwen2_vl (block mode), qwen3_5 (checkpoint mode) and gemma3 (windowed,
checkpoint mode, text-only programs), with random and
blank-page images, and random and blank clips (videos); writes DIR/report.md (default
reports/mlx-vlm) and DIR/programs/RULE.json (each violation's shrunk program), and replays the saved
findings (targets/mlx_vlm/findings/*.json).
replay: re-judges saved findings or programs; prints whether each reproduces.
onefix: every finding's standalone test against the installed mlx-vlm and one copy per fix, each
with only that bug fixed (targets/mlx_vlm/onefix.py; DIR default /tmp/mlx-vlm-onefix); prints the
table; exit 1 where it is not the identity.
Exit status: 0 no violation; 1 violations (check) or a finding still reproducing (replay); 2 mlx-vlm
missing or bad arguments.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def replay(paths) -> list:
    from targets.mlx_vlm.search import run
    out = []
    for p in paths:
        f = json.loads(Path(p).read_text())
        v = run(f["ops"], f["config"], f["rule"])
        ok = f["rule"] in v.rules
        print(f"{Path(p).name}: {'reproduces' if ok else 'does not reproduce'}"
              f"{': ' + str(v.violations[0]) if ok else ''}")
        out.append((Path(p).name, ok, f.get("script", "")))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="check-mlx-vlm")
    ap.add_argument("cmd", nargs="?", default="check", choices=("check", "replay", "onefix"))
    ap.add_argument("--dir", default="/tmp/mlx-vlm-onefix")
    ap.add_argument("files", nargs="*")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report", default="reports/mlx-vlm")
    a = ap.parse_args(argv)
    try:
        import mlx_vlm
    except ImportError:
        print("mlx-vlm is not importable here: run targets/mlx_vlm/install.sh, then "
              "MLXVLM_PYTHON=VENV/bin/python ./dev check-mlx-vlm", file=sys.stderr)
        return 2
    from targets.mlx_vlm import report, search
    version = getattr(mlx_vlm, "__version__", "?")
    if a.cmd == "onefix":
        from targets.mlx_vlm import onefix
        return onefix.main(a.dir)
    if a.cmd == "replay":
        if not a.files:
            ap.error("replay needs finding or program files")
        return 1 if any(ok for _, ok, _ in replay(a.files)) else 0
    result = search.hunt(a.minutes, a.seed)
    result["configs"] = [f"{c['arch']}/{c['image_kind']}/{c.get('media', 'image')}" for c in search.CONFIGS]
    replays = replay(sorted(report.FINDINGS.glob("*.json")))
    out = report.write(a.report, result, version, replays)
    print(f"{result['stats']['programs']} programs, {len(result['found'])} rule(s) violated: "
          f"{', '.join(sorted(result['found'])) or 'none'}; report {out}")
    return 1 if result["found"] else 0


if __name__ == "__main__":
    sys.exit(main())
