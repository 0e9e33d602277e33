"""check-ollama: build the harness from an Ollama checkout, run the rule
machines against its prefix cache, write a report.

  ./dev check-ollama --src PATH [--minutes N] [--report DIR] [--layouts a,b]
  ./dev check-ollama --src PATH --replay DIR/programs/S1.json [...]
  (OLLAMA_SRC stands for --src; --fixture runs our own Go fixture instead)

--replay runs saved programs (a report's programs/*.json) on this checkout
instead of a campaign, one line each: whether the program still breaks the
rule it was saved for, and which other rules it breaks here. Exit 1 if any
still breaks its rule, 0 if none: `git bisect run` can find the commit that
fixed (or brought) a bug.

Bad input gets one line on stderr and a non-zero exit, never a traceback:
  2  no checkout / no x/mlxrunner / Go build failure (the compiler's first error)
     / a --replay file that is missing or not a saved program
  3  the harness process crashed mid-run (the program that crashed it is kept
     in DIR/crash.json)
  4  a fault of the machine itself (one line, the last operations sent)
  1  the run found rule violations (the report lists them); 0 none
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from targets.ollama.build import BuildError, build, build_fixture
from targets.ollama.gotest import export
from targets.ollama.target import DRAFT_LAYOUTS, LAYOUTS, LAZY_LAYOUTS, HarnessCrash, HarnessTarget, TargetPanic

def causes(target, c) -> dict:
    """rule -> its cause in this campaign's program (targets/ollama/cause.py: read from the program's own run,
    "unexplained: ..." where no mechanism we know shows its evidence)."""
    from targets.ollama.cause import diagnose
    try:
        return {rule: diagnose(target, rule, f.ops) for rule, f in c.findings.items()}
    finally:
        target.shutdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="check-ollama", description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=os.environ.get("OLLAMA_SRC"), help="an ollama/ollama checkout (or OLLAMA_SRC)")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--report", default="ollama-report")
    ap.add_argument("--layouts", default=",".join(LAYOUTS),
                    help=f"comma-separated, of {', '.join(LAYOUTS)}; on an Ollama checkout also their -lazy variants "
                         "(KV snapshots as lazy views of the live rows, as Ollama's KVCache makes them) and their "
                         "-draft variants (a draft KV cache with one token of look-ahead, as with an MTP draft head)")
    ap.add_argument("--fixture", action="store_true", help="run our own Go fixture, not Ollama (CI)")
    ap.add_argument("--pyside", choices=("impl", "spec"),
                    help="no Go: run the same machine on our impl or spec (a check of the machine itself)")
    ap.add_argument("--replay", nargs="+", metavar="PROGRAM",
                    help="replay saved programs (a report's programs/*.json) instead of a campaign")
    ap.add_argument("--go-test", nargs="+", metavar="FILE",
                    help="run exported Go tests (a report's programs/*_test.go) as pasted into this checkout's "
                         "x/mlxrunner, its prefix cache unchanged: one line each, PASS or FAIL with the rule's message")
    a = ap.parse_args(argv)
    if a.go_test:
        return run_go_tests(a.src, a.go_test)
    try:
        programs = [load_program(p) for p in a.replay or ()]
    except ValueError as e:
        print(f"check-ollama: {e}", file=sys.stderr)
        return 2
    from targets.report import campaign, write
    layouts = [x for x in a.layouts.split(",") if x]
    known = LAYOUTS if a.fixture or a.pyside else LAYOUTS + LAZY_LAYOUTS + DRAFT_LAYOUTS
    bad = [x for x in layouts if x not in known]
    if bad:
        print(f"check-ollama: unknown layout {bad[0]} (known{' here' if known == LAYOUTS else ''}: "
              f"{', '.join(known)})", file=sys.stderr)
        return 2
    report = Path(a.report)
    if not (a.fixture or a.pyside) and any(x in DRAFT_LAYOUTS for x in layouts):
        from targets.ollama.build import check_checkout, draft_supported
        try:
            if not draft_supported(check_checkout(a.src) / "x/mlxrunner"):
                print(f"check-ollama: {a.src} has no draft look-ahead (prefixCache.draftLookahead, speculate.go's "
                      "scheduleSpeculation and commitSpeculation): the -draft layouts need a newer x/mlxrunner",
                      file=sys.stderr)
                return 2
        except BuildError as e:
            print(f"check-ollama: {e}", file=sys.stderr)
            return 2
    if a.pyside:
        from targets.ollama.pyside import Resettable
        target = Resettable(a.pyside)
        target.RULES = HarnessTarget.RULES
    else:
        try:
            work = Path(tempfile.mkdtemp(prefix="check-ollama-"))
            exe = build_fixture(work) if a.fixture else build(a.src, work)
        except BuildError as e:
            print(f"check-ollama: {e}", file=sys.stderr)
            return 2
        target = HarnessTarget(exe, name="fixture" if a.fixture else f"Ollama at {a.src}")
    if programs:
        try:
            return replay_programs(target, programs)
        except HarnessCrash as e:
            print(f"check-ollama: {e}", file=sys.stderr)
            return 3
        finally:
            target.shutdown()
    ours = a.fixture or a.pyside
    say = lambda f: print(f"check-ollama: {f.rule} after {f.seconds:.1f} s, {f.length} operations: {f.message}",
                          flush=True)
    try:
        c = campaign(target, layouts, a.minutes, on_finding=say)
    except HarnessCrash as e:
        report.mkdir(parents=True, exist_ok=True)
        (report / "crash.json").write_text(json.dumps(dict(error=str(e), ops=target.sent), indent=1))
        print(f"check-ollama: {e}; the program that crashed it is in {report / 'crash.json'}", file=sys.stderr)
        return 3
    except Exception as e:                      # a fault of ours, not of the target: still one line
        print(f"check-ollama: internal error ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
              f"last operations: {target.sent[-3:]}", file=sys.stderr)
        return 4
    finally:
        target.shutdown()
    found = {} if ours else causes(target, c)
    draft = [x for x in layouts if x in DRAFT_LAYOUTS]
    extra = "" if not draft else (
        f"On the -draft layouts ({', '.join(draft)}) the views' keys are the token pairs Ollama's trie keys pack "
        "(a violation prints a pair key as m<its look-ahead token, last 16 bits in hex>), and every rule the "
        "other layouts judge is judged there too; " + "; ".join(
            f"{r} is {why}" for r, why in HarnessTarget.DRAFT_PARTIAL_WHY.items()) + ".")
    path = write(report, c, explain=None if ours else (lambda rule, layout: found.get(rule)),
                 exporter=None if ours else export, extra=extra)
    if found:   # the causes are read from this checkout's run (cause.py), not quoted from fb30760
        path.write_text(path.read_text().replace(
            "*Why (the cause at Ollama fb30760, the stored copy; check it on other commits):*",
            "*Why (read from this program's run on this checkout; \"unexplained\" where no known mechanism shows):*"))
    rate = c.steps / c.seconds if c.seconds else 0
    print(f"check-ollama: {len(c.findings)} rules violated, {c.steps} operations at {rate:.0f}/s; report: {path}")
    return 1 if c.findings else 0


def run_go_tests(src, files: list) -> int:
    """Each exported test file pasted beside prefix_cache_test.go; exit 1 while any test fails, 0 if all pass,
    2 when the files are missing or do not compile."""
    from targets.ollama.build import go_test
    try:
        tests = {Path(f).name: Path(f).read_text() for f in files}
        result = go_test(src, tests)
    except OSError as e:
        print(f"check-ollama: --go-test {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    except BuildError as e:
        print(f"check-ollama: {e}", file=sys.stderr)
        return 2
    for name, (passed, msg) in result.items():
        print(f"check-ollama: {name}: " + ("PASS" if passed else f"FAIL: {msg}"), flush=True)
    failed = sum(not p for p, _ in result.values())
    print(f"check-ollama: {failed} of {len(result)} exported tests fail on {src}")
    return 1 if failed else 0


def load_program(path: str) -> tuple:
    """(path, rule, ops) of a saved program; ValueError naming what is wrong with the file."""
    try:
        saved = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"--replay {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--replay {path}: not JSON ({e.msg}, line {e.lineno})") from None
    ops = saved.get("ops") if isinstance(saved, dict) else None
    if not (isinstance(ops, list) and ops and isinstance(ops[0], dict) and ops[0].get("op") == "reset"
            and isinstance(saved.get("rule"), str)):
        raise ValueError(f"--replay {path}: not a saved program (a report's programs/*.json: "
                         f"a rule and ops starting with reset)")
    from targets.machine import seeds_checked
    try:
        seeds_checked(ops)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"--replay {path}: not a pipeline program ({e})") from None
    return path, saved["rule"], ops


def replay_programs(target, programs: list) -> int:
    """Each program on the target, one line each; 1 if any still breaks the rule it was saved for."""
    from targets.machine import replay_checked

    still = 0
    for path, rule, ops in programs:
        try:
            found = replay_checked(target, ops)
        except TargetPanic as e:
            found = [("PANIC", str(e).splitlines()[0] if str(e) else "panic")]
        except (KeyError, TypeError, ValueError) as e:
            print(f"check-ollama: --replay {path}: not a program this harness runs ({type(e).__name__}: {e})",
                  file=sys.stderr)
            return 2
        first = next((m for r, m in found if r == rule), None)
        still += first is not None
        others = sorted({r for r, _ in found} - {rule})
        print(f"check-ollama: {path}: {rule} " + (f"still broken: {first}" if first else "not reproduced")
              + (f"; also breaks {', '.join(others)}" if others else ""), flush=True)
    print(f"check-ollama: {still} of {len(programs)} programs still break their rule")
    return 1 if still else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("check-ollama: interrupted")
