"""Mutation testing of impl's trie and prefix cache against the conformance
machines, with a report and a check that every surviving mutant is
explained.

    ./dev mutation [--max-children N] [--fresh] [--report DIR] [mutant-glob ...]

What runs: mutmut (configured in pyproject.toml, [tool.mutmut]) mutates
impl/trie.py, impl/prefix_cache.py (with impl/plan.py and impl/eviction.py)
and impl/settled.py and, for each mutant, runs the tests
that reach the mutated function among `stateful_tests/test_conformance.py`
(the seven conformance machines and the kept regressions) and
`stateful_tests/test_directed*.py` (what requests cannot reach) under the
Hypothesis profile "mutation": the ci profile's examples and steps,
derandomised, without shrinking (a kill needs one failure, not a short one).
Workers come from a fork server, because forking a process that has already
run MLX computations hangs.

A second pass reruns every survivor under the profile "mutation-deep"
(400 examples of 60 steps per machine), one pytest process per mutant,
because some mutants need a rare sequence (as the S3 historical bug needs
hundreds of examples): a survivor it kills counts as detected ("killed (deep)").

What it checks: every mutant is killed (or times out), or it is listed in
docs/mutation.md as equivalent, with the reason. A survivor is matched by
what it changes, not by mutmut's number (which shifts whenever a function
changes): the function, the original line(s) and the mutated line(s). The
run exits 1 if a mutant survives unexplained, if a mutant reaches no test,
or if an explained mutant no longer exists or no longer survives (the
explanation is stale and must go).

Report: DIR/report.md (score, counts per status and per function, the
unexplained survivors with their diffs) and DIR/summary.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPLAINED = ROOT / "docs" / "mutation.md"
DETECTED = {"killed", "killed (deep)", "timeout", "caught by type check"}


@dataclass(frozen=True, order=True)
class Change:
    """What a mutant changes: the function (e.g. "PrefixCache._source"), the
    original and the mutated line(s), stripped and joined with " ⏎ "."""
    function: str
    before: str
    after: str


def function_of(mutant: str) -> str:
    """mutmut's mangled name -> "Class.method" or "function".
    impl.prefix_cache.xǁPrefixCacheǁ_source__mutmut_7 -> PrefixCache._source
    impl.trie.x_match__mutmut_1 -> match"""
    mangled = mutant.rpartition("__mutmut_")[0].rpartition(".")[2]
    if mangled.startswith("xǁ"):
        cls, _, meth = mangled[2:].partition("ǁ")
        return f"{cls}.{meth}"
    return mangled[2:]


def change_of(mutant: str, diff: str) -> Change:
    """The Change a unified diff (as `mutmut show` prints it) describes."""
    minus = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    plus = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    return Change(function_of(mutant), " ⏎ ".join(minus), " ⏎ ".join(plus))


_HEADING = re.compile(r"^###\s+`?([\w.]+)`?\s*$")
_ITEM = re.compile(r"^- `(?P<before>[^`]*)` → `(?P<after>[^`]*)`\s+—\s+(?P<why>\S.*)$")


def explained(text: str) -> dict:
    """Change -> reason, from docs/mutation.md: under a heading
    `### Function.name`, one line per equivalent mutant:
        - `original line` → `mutated line` — why it cannot be observed
    Raises ValueError on an entry line that does not parse."""
    out, function = {}, None
    for number, line in enumerate(text.splitlines(), 1):
        m = _HEADING.match(line)
        if m:
            function = m.group(1)
            continue
        if function is None or not line.startswith("- `"):
            continue
        m = _ITEM.match(line)
        if not m:
            raise ValueError(f"docs/mutation.md line {number}: not '- `before` → `after` — reason': {line!r}")
        out[Change(function, m.group("before"), m.group("after"))] = m.group("why")
    return out


def statuses(mutants_dir: Path) -> dict:
    """mutant name -> status, from mutmut's .meta files."""
    from mutmut.stats import status_by_exit_code
    out = {}
    for meta in sorted(mutants_dir.rglob("*.py.meta")):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            out[name] = status_by_exit_code[code]
    return out


def verdict(status: dict, changes: dict, known: dict, partial: bool = False) -> dict:
    """Classify the run. `status`: name -> status; `changes`: name -> Change
    for every mutant that was not detected; `known`: explained Changes.
    `partial`: only some mutants were checked, so no explanation is stale."""
    counts = Counter(status.values())
    undetected = [n for n, s in status.items() if s not in DETECTED]
    equivalent = [n for n in undetected if status[n] == "survived" and changes[n] in known]
    unexplained = [n for n in undetected if n not in equivalent]
    still = {changes[n] for n in equivalent}
    stale = [] if partial else sorted(c for c in known if c not in still)
    total = len(status)
    detected = sum(counts[s] for s in DETECTED)
    return {
        "total": total, "counts": dict(counts), "detected": detected,
        "score": detected / total if total else 0.0,
        "score_without_equivalent": detected / (total - len(equivalent)) if total > len(equivalent) else 1.0,
        "equivalent": sorted(equivalent), "unexplained": sorted(unexplained), "stale": stale,
        "ok": bool(total) and not unexplained and not stale,
    }


def _selection() -> list:
    import tomllib
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return conf["pytest_add_cli_args_test_selection"]


def deep_pass(names: list, env: dict, workers: int, timeout_s: float) -> dict:
    """Rerun each mutant under the "mutation-deep" profile in mutants/ (where
    mutmut's trampolines pick the mutant named by MUTANT_UNDER_TEST): name ->
    "killed (deep)", "timeout" or "survived"."""
    from concurrent.futures import ThreadPoolExecutor
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:xdist", *_selection()]

    def one(name):
        try:
            r = subprocess.run(cmd, cwd=ROOT / "mutants", capture_output=True, timeout=timeout_s,
                               env=dict(env, MUTANT_UNDER_TEST=name, HYPOTHESIS_PROFILE="mutation-deep"))
        except subprocess.TimeoutExpired:
            return name, "timeout"
        if r.returncode not in (0, 1):
            raise RuntimeError(f"deep pass of {name}: pytest exited {r.returncode}\n{r.stdout[-2000:]}")
        return name, "survived" if r.returncode == 0 else "killed (deep)"
    out = {}
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for k, (name, result) in enumerate(pool.map(one, names), 1):
            out[name] = result
            print(f"  deep pass {k}/{len(names)}: {name}: {result}", flush=True)
    return out


def _mutmut(args: list, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=cwd, env=env, text=True,
                          capture_output=True)


def report(v: dict, status: dict, changes: dict, diffs: dict, seconds: dict) -> str:
    by_function = defaultdict(list)
    for n in status:
        by_function[function_of(n)].append(n)
    lines = ["# Mutation testing: impl/trie.py, impl/prefix_cache.py, impl/plan.py, impl/eviction.py and impl/settled.py", "",
             f"mutants: {v['total']}; detected (killed or timed out): {v['detected']}; "
             f"score **{v['score']:.1%}**; explained as equivalent: {len(v['equivalent'])} "
             f"(score without them **{v['score_without_equivalent']:.1%}**); "
             f"unexplained: {len(v['unexplained'])}; stale explanations: {len(v['stale'])}"
             + "".join(f"; {k} {s / 60:.1f} min" for k, s in seconds.items()), "",
             "| status | mutants |", "|---|---|"]
    lines += [f"| {s} | {c} |" for s, c in sorted(v["counts"].items(), key=lambda x: -x[1])]
    lines += ["", "| function | mutants | detected | equivalent | unexplained |", "|---|---|---|---|---|"]
    eq, un = set(v["equivalent"]), set(v["unexplained"])
    for fn, names in sorted(by_function.items()):
        lines.append(f"| {fn} | {len(names)} | {sum(status[n] in DETECTED for n in names)} | "
                     f"{sum(n in eq for n in names)} | {sum(n in un for n in names)} |")
    if v["unexplained"]:
        lines += ["", "## Unexplained (make a test or a rule kill it, or explain it in docs/mutation.md)", ""]
        for n in v["unexplained"]:
            c = changes[n]
            lines += [f"### {n} ({status[n]})", "", f"    ### {c.function}",
                      f"    - `{c.before}` → `{c.after}` — ", "", "```diff", diffs.get(n, ""), "```", ""]
    if v["stale"]:
        lines += ["", "## Stale explanations (no surviving mutant makes this change any more)", ""]
        lines += [f"- {c.function}: `{c.before}` → `{c.after}`" for c in v["stale"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mutants", nargs="*", help="mutant names or globs (default: all; a partial run "
                                               "reports on those only and calls no explanation stale)")
    ap.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--fresh", action="store_true", help="forget earlier results (delete mutants/)")
    ap.add_argument("--report", type=Path, default=ROOT / "reports" / "mutation")
    ap.add_argument("--no-run", action="store_true", help="only report on the results already in mutants/")
    ap.add_argument("--no-deep", action="store_true", help="skip the second pass over the survivors")
    ap.add_argument("--deep-timeout", type=float, default=1800.0, help="seconds per mutant in the second pass")
    a = ap.parse_args(argv)
    try:
        import mutmut  # noqa: F401
    except ImportError:
        print("mutmut is not installed: pip install -e '.[mutation]' (./dev mutation does it)", file=sys.stderr)
        return 2
    env = dict(os.environ, HYPOTHESIS_PROFILE="mutation", OPENBLAS_NUM_THREADS="1", CI="")
    if a.fresh:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    t0, seconds = time.perf_counter(), {}
    if not a.no_run:
        r = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(a.max_children),
                            *a.mutants], cwd=ROOT, env=env)
        seconds["mutmut"] = time.perf_counter() - t0
        if r.returncode != 0:
            print(f"mutmut run exited {r.returncode}", file=sys.stderr)
            return r.returncode
    status = statuses(ROOT / "mutants")
    if a.mutants:                                   # a partial run: report on what it checked
        status = {n: st for n, st in status.items() if st != "not checked"}
    survivors = sorted(n for n, st in status.items() if st == "survived")
    if survivors and not a.no_deep:
        print(f"deep pass over {len(survivors)} survivors ...", flush=True)
        t1 = time.perf_counter()
        status.update(deep_pass(survivors, env, a.max_children, a.deep_timeout))
        seconds["deep pass"] = time.perf_counter() - t1
    diffs, changes = {}, {}
    for n, s in status.items():
        if s not in DETECTED:
            diffs[n] = _mutmut(["show", n], ROOT, env).stdout.split("\n", 1)[-1].rstrip()
            changes[n] = change_of(n, diffs[n])
    v = verdict(status, changes, explained(EXPLAINED.read_text()), partial=bool(a.mutants))
    a.report.mkdir(parents=True, exist_ok=True)
    (a.report / "report.md").write_text(report(v, status, changes, diffs, seconds))
    summary = dict(v, stale=[vars(c) for c in v["stale"]], wall_s=seconds,
                   status=status, changes={n: vars(c) for n, c in changes.items()})
    (a.report / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    print(f"mutants {v['total']}, detected {v['detected']} ({v['score']:.1%}), equivalent {len(v['equivalent'])} "
          f"({v['score_without_equivalent']:.1%} without them), unexplained {len(v['unexplained'])}, "
          f"stale {len(v['stale'])}; report: {a.report / 'report.md'}")
    return 0 if v["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
