"""`./dev check-vllm [check] [--minutes N] [--report DIR] [--src PATH | --release X.Y.Z] [--layouts a,b]`
`./dev check-vllm replay [--src PATH ... | --release X ... | --repo CHECKOUT --range A..B] PROGRAM.json ...`
  (also spelled `--replay PROGRAM.json ...`; `--version X` = `--release X`)
`./dev check-vllm release X.Y.Z` (unpack a release's Python sources from PyPI: prints the --src path)
`./dev check-vllm onefix [--release 0.25.0 | --src PATH] [--dir DIR]` (targets/vllm/onefix.py: the findings'
  exported tests on the affected release and on a copy with only their cause fixed)

check: hunts rule violations of vLLM's prefix cache (targets.vllm.adapter) for N minutes (default 10)
over the layouts (full, swa, mamba, hybrid, full-spec, swa-spec; then the -eagle ones, judged without
C2), shrinks each, writes DIR/report.md (default reports/vllm) with the rule, the vLLM function
responsible (file and line in the version run), the shrunk program (programs/RULE-layout.json,
replayable) and a pytest test against vLLM's API (programs/test_RULE_layout.py).
replay: runs saved programs on each source (a directory holding the `vllm` package: a checkout, an
unpacked release, or each commit of A..B in CHECKOUT, archived under /tmp), one process per
source, and names for each program the first source where it stops reproducing.
vLLM itself comes from --src/--release, else the installed package; the interpreter must be able to
import vLLM's managers (see docs/peers.md, "vLLM": the install recipe). When it cannot, and
VLLM_PYTHON names an interpreter that can, the command re-runs itself there.
Exit status: 0 (findings are the product); 2 on bad arguments or when vLLM cannot be imported.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAIN_LAYOUTS = ("full", "swa", "mamba", "hybrid", "full-spec", "swa-spec")
EAGLE_LAYOUTS = ("full-eagle", "mamba-eagle", "hybrid-eagle")
CACHE = Path(os.environ.get("VLLM_SRC_CACHE", Path.home() / ".cache" / "prefix-trie-mlx" / "vllm-src"))


def release(version: str) -> Path:
    """A release's Python sources from PyPI (the wheel, --no-deps; only vllm/**/*.py kept)."""
    import glob
    import tempfile
    import zipfile
    d = CACHE / version
    if (d / "vllm" / "__init__.py").exists():
        return d
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"vllm=={version}", "-d", tmp],
                       check=True)
        z = zipfile.ZipFile(glob.glob(f"{tmp}/*.whl")[0])
        for n in z.namelist():
            if n.startswith("vllm/") and n.endswith(".py"):
                z.extract(n, d)
    return d


def _src(args):
    if getattr(args, "release", None):
        return str(release(args.release))
    return getattr(args, "src", None) or os.environ.get("VLLM_SRC") or None


def _engine(src):
    from targets.vllm.engine import load
    return load(src)


def check(args) -> int:
    from targets.report import campaign
    from targets.vllm import report
    from targets.vllm.adapter import VllmTarget
    eng = _engine(_src(args))
    layouts = args.layouts.split(",") if args.layouts else list(MAIN_LAYOUTS + EAGLE_LAYOUTS)
    main = [l for l in layouts if not l.endswith("-eagle")]
    eagle = [l for l in layouts if l.endswith("-eagle")]
    print(f"vLLM {eng.version} ({eng.path}); layouts {layouts}; {args.minutes} min", flush=True)
    t = VllmTarget(eng)
    runs = []
    share = len(main) / max(1, len(layouts))
    t0 = time.monotonic()
    for group, minutes in ((main, args.minutes * share), (eagle, args.minutes * (1 - share))):
        if not group:
            continue
        t.reset(layout=group[0])                 # RULES follow the layout family (eagle: no C2)
        runs.append(campaign(t, group, minutes, on_finding=lambda f: print(
            f"[{time.monotonic() - t0:6.1f}s] {f.rule} on {f.layout}: {f.message}", flush=True)))
    out = report.write(Path(args.report), eng, runs, t)
    n = sum(len(c.findings) for c in runs)
    steps = sum(c.steps for c in runs)
    secs = sum(c.seconds for c in runs)
    print(f"{n} rule violations; {steps / max(secs, 1e-9):.0f} operations/s; report: {out}")
    return 0


def replay_one(args) -> int:
    """In this process: each program on the source given; prints one JSON line per program."""
    from targets.machine import replay
    from targets.vllm.adapter import VllmTarget
    eng = _engine(_src(args))
    t = VllmTarget(eng)
    for p in args.programs:
        rec = json.loads(Path(p).read_text())
        try:
            found = sorted({r for r, _ in replay(t, rec["ops"])})
            err = None
        except Exception as e:                     # a layout this version cannot build, an API change
            found, err = [], f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(json.dumps({"program": p, "version": eng.version, "rules": found, "error": err}), flush=True)
    return 0


def _sources(args) -> list:
    out = [("release " + v, str(release(v))) for v in args.release or ()]
    out += [(s, s) for s in args.src or ()]
    if args.repo and args.range:
        from targets.commits import range_trees
        out += [(sha[:12], str(tree)) for sha, tree in
                range_trees("vllm", args.repo, args.range, "vllm/v1/core", Path("/tmp/vllm-replay"))]
    return out


def replay(args) -> int:
    sources = _sources(args)
    if not sources:
        print("replay: give --src, --release or --repo with --range", file=sys.stderr)
        return 2
    table = {p: [] for p in args.programs}
    for label, src in sources:
        r = subprocess.run([sys.executable, "-m", "targets.vllm", "replay-one", "--src", src, *args.programs],
                           capture_output=True, text=True, cwd=ROOT)
        lines = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
        if not lines:
            print(f"{label}: could not run ({(r.stderr.strip().splitlines() or ['?'])[-1]})")
            continue
        for rec in lines:
            want = json.loads(Path(rec["program"]).read_text())["rule"]
            hit = want in rec["rules"]
            table[rec["program"]].append((label, rec["version"], hit, rec["error"]))
            print(f"{label} (vLLM {rec['version']}): {Path(rec['program']).name}: "
                  f"{'reproduces' if hit else 'does not reproduce'}" + (f" ({rec['error']})" if rec["error"] else ""),
                  flush=True)
    for p, rows in table.items():
        first = next((i for i, row in enumerate(rows) if row[2]), None)
        fixed = next((row for row in rows[first + 1:] if not row[2] and not row[3]), None) if first is not None else None
        if first is None:
            print(f"{p}: reproduces on none of the sources")
        elif fixed:
            print(f"{p}: reproduces on {rows[first][0]}; first source where it stops: {fixed[0]} (vLLM {fixed[1]})")
        else:
            print(f"{p}: reproduces from {rows[first][0]} on; never stops in the sources given")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--replay" in argv:                       # check-ollama's spelling: --replay P.json ... = replay P.json ...
        argv = ["replay"] + [a for a in argv if a != "--replay"]
    if not argv or argv[0].startswith("-"):
        argv = ["check"] + argv
    ap = argparse.ArgumentParser(prog="check-vllm")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--minutes", type=float, default=10.0)
    c.add_argument("--report", default="reports/vllm")
    c.add_argument("--layouts", default="")
    c.add_argument("--src")
    c.add_argument("--release", "--version", dest="release")
    r = sub.add_parser("replay")
    r.add_argument("programs", nargs="+")
    r.add_argument("--src", action="append")
    r.add_argument("--release", "--version", dest="release", action="append")
    r.add_argument("--repo")
    r.add_argument("--range")
    o = sub.add_parser("replay-one")
    o.add_argument("programs", nargs="+")
    o.add_argument("--src")
    f = sub.add_parser("onefix")
    f.add_argument("--src")
    f.add_argument("--release", "--version", dest="release")
    f.add_argument("--dir", default="reports/vllm/onefix")
    rel = sub.add_parser("release")
    rel.add_argument("version")
    args = ap.parse_args(argv)
    if args.cmd == "release":
        print(release(args.version))
        return 0
    if args.cmd in ("check", "replay-one", "onefix"):
        try:
            _engine(_src(args))
        except Exception as e:                   # noqa: BLE001 -- one line, then maybe re-run elsewhere
            py = os.environ.get("VLLM_PYTHON")
            if py and os.path.realpath(py) != os.path.realpath(sys.executable):
                env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
                return subprocess.run([py, "-m", "targets.vllm", *argv], cwd=ROOT, env=env).returncode
            print(f"check-vllm: cannot import vLLM's prefix-cache managers ({type(e).__name__}: {e}); "
                  f"install as docs/peers.md says, or set VLLM_PYTHON", file=sys.stderr)
            return 2
    if args.cmd == "onefix":
        from targets.vllm import onefix
        return onefix.main(args.dir, _src(args) or str(release(onefix.AFFECTED)))
    return {"check": check, "replay": replay, "replay-one": replay_one}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
