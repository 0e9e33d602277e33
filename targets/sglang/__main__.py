"""`./dev check-sglang [--cache full|swa|req|mamba|unified [--components full,swa[,mamba]]] [--eagle] [--minutes N] [--report DIR]
[--src PATH | --release V] [--fixture FAULT]`
`./dev check-sglang --replay P.json [...] --releases V1,V2,... | --srcs PATH1,PATH2,... | --repo GITDIR --range A..B`
`./dev check-sglang --export targets/sglang/findings/*.json --report DIR`
`./dev check-sglang --onefix [--src PATH | --release 0.5.5] [--report DIR]` (targets/sglang/onefix.py)

check: runs the rule machines against SGLang's RadixCache for N minutes (default 10) and writes
DIR/report.md (default reports/sglang): per violated rule its meaning, the SGLang function
responsible, seconds to detection, the shrunk program (DIR/programs/RULE.json, replayable).
The sglang used: the installed one, or --src (a source checkout or an unpacked wheel; SGLANG_SRC),
or --release V (the PyPI wheel, fetched --no-deps with pip and unpacked under ~/.cache).
--fixture FAULT runs the planted-fault fake (targets/sglang/fixture.py; with --cache swa
targets/sglang/fixture_swa.py, mamba fixture_mamba.py, unified fixture_unified.py, unified --components
full,swa fixture_unified_swa.py) instead (no sglang needed). An exception raised inside SGLang is rule PANIC
(targets/sglang/crash.py); one raised in our code stops the run with its traceback. --cache mamba / unified: targets/sglang/hybrid_cli.py; --cache full on a RadixCache with
`checkpoint` (0.5.23) drives it through that call (targets/sglang/full_req.py).

--replay: each program on each sglang in order (oldest first), one process per sglang; prints
whether it reproduces and names the first one where each program stops reproducing.
Exit status: 0 no violation / every program stopped; 1 violations (check) or a program still
reproducing on the last one (replay); 2 bad arguments or an sglang that cannot be loaded.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "prefix-trie-mlx" / "sglang"


def release_dir(v: str) -> Path:
    """The sglang package of PyPI release `v`, unpacked (pip download --no-deps; no install)."""
    d = CACHE / v
    if (d / "sglang").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={v}", "-d", str(d)],
                   check=True)
    import zipfile
    whl = next(d.glob("sglang-*.whl"))
    with zipfile.ZipFile(whl) as z:
        z.extractall(d, [n for n in z.namelist() if n.startswith("sglang/")])
    whl.unlink()
    return d


def make_target(a):
    from targets.sglang.target import SglangTarget
    if a.cache in ("mamba", "unified"):
        from targets.sglang.hybrid_cli import make_hybrid
        return make_hybrid(a, release_dir)
    if a.cache == "req":
        from targets.sglang import engine
        from targets.sglang.reqcalls import ReqTarget
        src = a.src or (str(release_dir(a.release)) if a.release else None)
        api = engine.load(src)
        return ReqTarget(api, page_size=a.page_size, eagle=a.eagle), \
            f"sglang {engine.version(api)} RadixCache via cache_*_req" + (", EAGLE bigram keys" if a.eagle else "") + \
            (f", page size {a.page_size}" if a.page_size > 1 else "")
    if a.cache == "swa":
        from targets.sglang.swa import SwaTarget
        if a.fixture:
            from targets.sglang.fixture_swa import FakeSwaApi
            return SwaTarget(FakeSwaApi(None if a.fixture == "none" else a.fixture)), f"SWA fixture ({a.fixture})"
        from targets.sglang import engine
        from targets.sglang.swa import load_swa
        src = a.src or (str(release_dir(a.release)) if a.release else None)
        api = load_swa(src)
        what = f"sglang {engine.version(engine.load(src))} SWARadixCache"
        if a.eagle or a.page_size > 1:
            from targets.sglang.swa_eagle import SwaPagedTarget
            return SwaPagedTarget(api, page_size=a.page_size, eagle=a.eagle), what + \
                (", EAGLE bigram keys" if a.eagle else "") + (f", page size {a.page_size}" if a.page_size > 1 else "")
        return SwaTarget(api), what
    if a.fixture:
        from targets.sglang.fixture import FakeApi
        return SglangTarget(FakeApi(None if a.fixture == "none" else a.fixture), page_size=a.page_size), \
            f"fixture ({a.fixture})"
    from targets.sglang import engine
    src = a.src or (str(release_dir(a.release)) if a.release else None)
    api = engine.load(src)
    from targets.sglang.full_req import CheckpointTarget, has_checkpoint    # 0.5.23: its own checkpoint()
    if has_checkpoint(api):
        return CheckpointTarget(api, page_size=a.page_size), f"sglang {engine.version(api)} (checkpoint)" + \
            (f", page size {a.page_size}" if a.page_size > 1 else "")
    return SglangTarget(api, page_size=a.page_size), f"sglang {engine.version(api)}" + \
        (f", page size {a.page_size}" if a.page_size > 1 else "")


def check(a) -> int:
    from targets.sglang import machine, report
    target, what = make_target(a)
    print(f"check-sglang: {what}; {a.minutes} min", flush=True)
    c = machine.campaign(target, a.minutes, log=lambda s: print(s, flush=True))
    out = report.write(Path(a.report), c, what, " ".join(sys.argv[1:]), target.page_size, swa=a.cache == "swa",
                       rules_of=("unified_swa" if a.cache == "unified" and "swa" in a.components else a.cache)
                       if a.cache in ("mamba", "unified") else "",
                       target=None if a.cache in ("mamba", "unified") else
                       target if a.cache == "req" or hasattr(target, "eagle") else None)
    print(f"{len(c.findings)} rule violations, {sum(n for n, _ in c.policy.values())} policy differences "
          f"({len(c.policy)} kinds); {c.steps / max(c.seconds, 1e-9):.0f} steps/s; report: {out}")
    return 1 if c.findings else 0


def replay_one(a) -> int:
    """In this process: each program once; prints one JSON line {path: [rules]}."""
    from targets.machine import replay_checked
    from targets.ollama.target import TargetPanic
    from targets.sglang.crash import guard
    target, what = make_target(a)
    target = guard(target)
    res = {}
    for p in a.replay:
        prog = json.loads(Path(p).read_text())
        try:
            found = replay_checked(target, prog["ops"])
            res[p] = sorted({r for r, _ in found})
        except TargetPanic as e:            # SGLang's code raised: a result (ours raise: traceback, exit 1)
            res[p] = [f"PANIC: {e}"]
    print("RESULT " + json.dumps({"what": what, "found": res}))
    return 0


def replay(a) -> int:
    points = [("", "--src", s) for s in a.srcs.split(",") if s] + \
        [("", "--release", v) for v in a.releases.split(",") if v]
    if a.repo or a.range:
        if not (a.repo and a.range):
            raise RuntimeError("--replay over commits needs both --repo GITDIR and --range A..B")
        from targets.commits import range_trees
        points += [(sha[:12], "--src", str(tree)) for sha, tree in
                   range_trees("sglang", a.repo, a.range, "python/sglang/srt/mem_cache", Path("/tmp/sglang-replay"))]
    if not points:
        points = [("", "--fixture", a.fixture)] if a.fixture else [("", "", "")]
    progs = {p: json.loads(Path(p).read_text())["rule"] for p in a.replay}
    first_ok: dict = {}
    last = {}
    for label, flag, val in points:
        cmd = [sys.executable, "-m", "targets.sglang", "--replay-one", *a.replay, "--page-size", str(a.page_size),
               "--cache", a.cache, "--components", a.components] + (["--eagle"] if a.eagle else []) + \
            ([flag, val] if flag else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{label or val or 'installed'}: could not load ({(r.stderr.strip().splitlines() or ['?'])[-1]})")
            continue
        d = json.loads(line[7:])
        if label:                                    # a commit's tree: its id, not the version it declares
            d["what"] = f"commit {label} ({d['what']})"
        for p, rule in progs.items():
            got = d["found"][p]
            hit = rule in got or (rule == "PANIC" and any(g.startswith("PANIC") for g in got))
            last[p] = hit
            print(f"{d['what']}: {Path(p).name} ({rule}): {'reproduces' if hit else 'does not reproduce'}"
                  + (f" (other rules: {', '.join(g for g in got if g != rule)})" if [g for g in got if g != rule] else ""))
            if not hit and p not in first_ok:
                first_ok[p] = d["what"]
            if hit:
                first_ok.pop(p, None)
    for p in progs:
        print(f"{Path(p).name}: " + (f"stops reproducing at {first_ok[p]}" if p in first_ok else "still reproduces"))
    return 1 if any(last.values()) else 0


def export_findings(a) -> int:
    """Each saved finding (targets/sglang/findings/*.json) as a pytest module under --report."""
    from targets.sglang import export_req, export_swa
    out = Path(a.report)
    out.mkdir(parents=True, exist_ok=True)
    for p in a.export:
        rec = json.loads(Path(p).read_text())
        ex = export_swa if rec["cache"] == "swa" else export_req
        text = ex.export(rec["rule"], f"sglang {rec['found_on']}", rec["message"], rec["ops"], rec["page_size"],
                         eagle=rec.get("eagle", False))
        (out / f"test_{Path(p).stem.lower().replace('-', '_')}.py").write_text(text)
        print(out / f"test_{Path(p).stem.lower().replace('-', '_')}.py")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="check-sglang")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--report", default="reports/sglang")
    ap.add_argument("--src", default=os.environ.get("SGLANG_SRC", ""))
    ap.add_argument("--release", default="")
    ap.add_argument("--cache", choices=("full", "swa", "req", "mamba", "unified"), default="full",
                    help="full: RadixCache; swa: SWARadixCache (releases 0.4.10-0.5.20) with a window of 4; "
                    "req: RadixCache through its own cache_unfinished_req / cache_finished_req; "
                    "mamba: MambaRadixCache (0.5.6-0.5.20); unified: UnifiedRadixCache (0.5.15 on), "
                    "targets/sglang/hybrid_cli.py")
    ap.add_argument("--components", default="full,mamba", help="with --cache unified: full,mamba (default) | "
                    "full,swa | full,swa,mamba (0.5.23; targets/sglang/unified_swa.py)")
    ap.add_argument("--eagle", action="store_true", help="with --cache req (0.5.3 on) or swa (0.5.4 on): EAGLE bigram keys")
    ap.add_argument("--page-size", type=int, default=1, help="the radix cache's page size (default 1)")
    ap.add_argument("--fixture", default="", help="none | a fault of targets/sglang/fixture.py (fixture_swa.py "
                    "with --cache swa)")
    ap.add_argument("--replay", nargs="+", metavar="PROGRAM")
    ap.add_argument("--replay-one", nargs="+", metavar="PROGRAM", help=argparse.SUPPRESS)
    ap.add_argument("--export", nargs="+", metavar="FINDING", help="saved findings (targets/sglang/findings/"
                    "*.json) -> pytest modules against SGLang's API under --report")
    ap.add_argument("--onefix", action="store_true", help="each finding's exported test on the release and on "
                    "copies with one bug fixed each (DIR/onefix)")
    ap.add_argument("--srcs", default="", help="comma-separated checkouts, oldest first (--replay)")
    ap.add_argument("--releases", default="", help="comma-separated PyPI releases, oldest first (--replay)")
    ap.add_argument("--repo", default="", help="a git directory with SGLang's history (--replay over --range)")
    ap.add_argument("--range", default="", help="A..B: --replay on each commit of it that touched "
                    "python/sglang/srt/mem_cache, oldest first")
    a = ap.parse_args(argv)
    if a.replay_one:
        a.replay = a.replay_one
        return replay_one(a)
    if a.export:
        return export_findings(a)
    if a.onefix:
        from targets.sglang import onefix
        return onefix.main(str(Path(a.report) / "onefix"), a.src or str(release_dir(a.release or onefix.AFFECTED)))
    try:
        if a.replay:
            return replay(a)
        return check(a)
    except (FileNotFoundError, RuntimeError, ValueError, ImportError, subprocess.CalledProcessError) as e:
        print(f"check-sglang: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
