"""python -m targets.watch run|failed|merge|latest: the nightly's watch on the peers (docs/fuzz.md "Sharded nightly").

  run TARGET --out DIR [--python PY] [--src CHECKOUT] [--minutes N] [--source TEXT]
      A bounded hunt of TARGET (mlx-lm, mlx-lm-hollow, mlx-vlm, ollama, vllm, sglang) on the peer installed for PY (the
      interpreter of the peer's own venv; default this one), or on Ollama checkout CHECKOUT, then a replay
      of every saved finding of that target (targets/<target>/findings/, an empty or missing folder is
      none). Writes DIR/result.json (format prefix-trie-peer-watch/1), DIR/hunt.log, DIR/replay.log and
      DIR/programs/ (the program file of every hunt violation). Exit 0 when the target ran, 1 when it
      failed to run (result.json says why), 2 bad arguments. mlx-lm-hollow is mlx-lm's fast tier
      (`check --hollow`: every rule but C1, each finding confirmed on the real models): its hunt is sorted
      against mlx-lm's saved findings, which it does not replay (the mlx-lm target replays them).
  failed TARGET --out DIR --reason TEXT
      The result of a target that could not be installed (status "failed").
  merge DIR|FILE... --out OUT [--expect a,b,...]
      One summary of the targets' results (targets/watch_merge.py): OUT/summary.md and OUT/summary.json.
  latest PACKAGE
      The newest release of PACKAGE on PyPI (its JSON API), printed.

Standard library only: the nightly's summary job needs nothing installed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from targets.watch_merge import FORMAT, merge_main
from targets.watch_merge import MergeError as WatchError      # bad input: one line, exit 2

ROOT = Path(__file__).resolve().parents[1]
# target -> (module, hunt arguments, hunt exit codes that mean "ran", PyPI distribution)
TARGETS = {
    "mlx-lm": ("targets.mlx_lm", ["check"], {0}, "mlx-lm"),
    "mlx-lm-hollow": ("targets.mlx_lm", ["check", "--hollow"], {0}, "mlx-lm"),
    "mlx-vlm": ("targets.mlx_vlm", ["check"], {0, 1}, "mlx-vlm"),
    "ollama": ("targets.ollama", [], {0, 1}, None),
    "vllm": ("targets.vllm", ["check"], {0}, "vllm"),
    "sglang": ("targets.sglang", [], {0, 1}, "sglang"),
}
FINDINGS_OF = {"mlx-lm-hollow": "mlx-lm"}     # a tier of another target: that target's saved findings
NO_REPLAY = {"mlx-lm-hollow"}                 # ... replayed by that target's own run, not twice
SLACK_S = 15 * 60          # hunt time beyond --minutes (set-up, shrinking, report) before it counts as hung
REPLAY_S = 30 * 60


def findings_dir(target: str) -> Path:
    return ROOT / "targets" / FINDINGS_OF.get(target, target).replace("-", "_") / "findings"


def saved_findings(target: str) -> list[Path]:
    """Every saved finding of the target (*.json under its findings folder, Ollama's per-commit folders
    included); none when the folder is missing or empty."""
    d = findings_dir(target)
    return sorted(d.rglob("*.json")) if d.is_dir() else []


def _recorded_fixed(path: Path) -> str | None:
    """The first version a saved finding records as fixed upstream (vLLM's findings keep `fixed_on`)."""
    try:
        fixed = json.loads(path.read_text()).get("fixed_on")
    except (OSError, ValueError, AttributeError):
        return None
    return str(fixed[0]) if isinstance(fixed, list) and fixed else None


def _rule(path: Path) -> str:
    try:
        rule = json.loads(path.read_text()).get("rule")
    except (OSError, ValueError, AttributeError):
        return "?"
    return rule if isinstance(rule, str) else "?"


def _run(cmd: list, timeout: float, log: Path) -> tuple[int | None, str, str]:
    """(exit status or None on timeout, stdout, stderr); both also go to `log`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = None
        out, err = (x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
    with log.open("a") as f:
        f.write(f"$ {' '.join(map(str, cmd))}\n{out}\n--- stderr\n{err}\n[exit {rc}]\n")
    return rc, out, err


def _last_line(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1][:300] if lines else "(no output)"


def peer_version(target: str, py: str, src: str | None) -> str:
    if target == "ollama":
        r = subprocess.run(["git", "-C", str(src), "log", "-1", "--format=%h %cs"], capture_output=True, text=True)
        return f"main@{r.stdout.split()[0]} ({r.stdout.split()[1]})" if r.returncode == 0 and r.stdout.split() \
            else "unknown commit"
    code = f"from importlib.metadata import version; print(version({TARGETS[target][3]!r}))"
    r = subprocess.run([py, "-c", code], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "not installed"


def replay_verdicts(target: str, out: str, findings: list[Path]) -> dict:
    """name -> (status, detail) read from the target's replay output; status "reproduces", "stopped" or
    "error". Each target prints its own form (its __main__.py); a finding with no line stays absent."""
    by_name = {_name(target, f): f for f in findings}
    got: dict = {}
    for line in out.splitlines():
        if target == "vllm" and line.startswith("{"):                       # replay-one: one JSON line each
            rec = _json(line)
            if not (isinstance(rec, dict) and isinstance(rec.get("program"), str)):
                continue
            name = _name(target, Path(rec["program"]))
            if rec.get("error"):
                got[name] = ("error", rec["error"])
            else:
                hit = _rule(by_name[name]) in rec["rules"] if name in by_name else False
                got[name] = ("reproduces" if hit else "stopped", f"vLLM {rec.get('version')}: {rec['rules']}")
        elif target == "sglang" and line.startswith("RESULT "):              # --replay-one: {what, found}
            d = _json(line[7:])
            for p, rules in (d.get("found") or {}).items() if isinstance(d, dict) else ():
                rule = _rule(Path(p))
                hit = rule in rules or (rule == "PANIC" and any(r.startswith("PANIC") for r in rules))
                got[_name(target, Path(p))] = ("reproduces" if hit else "stopped", f"{d.get('what')}: {rules}")
        elif target == "ollama":                                             # check-ollama: PATH: RULE still broken|not reproduced
            m = re.match(r"check-ollama: (\S+\.json): \S+ (still broken|not reproduced)", line)
            if m:
                got[_name(target, Path(m[1]))] = ("reproduces" if m[2] == "still broken" else "stopped", line)
        else:                                                                # mlx-lm / mlx-vlm: NAME: verdict ...
            m = re.match(r"(\S+\.json): (reproduces|does not reproduce|fixed upstream in .*?)( \(|:|$)", line)
            if m and target == "mlx-lm" and m[2] == "does not reproduce":   # on the version it was found on
                got[m[1]] = ("error", "does not reproduce on the mlx-lm it was found on (the harness changed?): "
                                      + line.strip())
            elif m:
                got[m[1]] = ("reproduces" if m[2] == "reproduces" else "stopped", line.strip())
    return got


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _name(target: str, path: Path) -> str:
    """A saved finding's name in the results: its path under the findings folder (Ollama: fb30760/E1.json)."""
    try:
        return str(path.resolve().relative_to(findings_dir(target).resolve()))
    except ValueError:
        return path.name


def replay_cmd(target: str, py: str, src: str | None, findings: list[Path]) -> list:
    files = [str(f) for f in findings]
    return {"mlx-lm": [py, "-m", "targets.mlx_lm", "replay"],
            "mlx-vlm": [py, "-m", "targets.mlx_vlm", "replay", *files],
            "ollama": [py, "-m", "targets.ollama", "--src", str(src), "--replay", *files],
            "vllm": [py, "-m", "targets.vllm", "replay-one", *files],
            "sglang": [py, "-m", "targets.sglang", "--replay-one", *files]}[target]


def hunt_violations(target: str, report: Path, saved: list[Path], out: Path) -> tuple[list, list]:
    """(new, known) violations of the hunt: its programs/*.json, each copied to out/programs/. Known: a
    saved finding has the same file name (mlx-lm RULE-cause, vLLM RULE-layout), or, where the hunt names
    its program by the rule alone (RULE.json: Ollama, mlx-vlm, SGLang), a saved finding breaks that rule."""
    saved_rules: dict = {}
    for f in saved:
        saved_rules.setdefault(_rule(f), []).append(_name(target, f))
    new, known = [], []
    (out / "programs").mkdir(parents=True, exist_ok=True)
    for p in sorted((report / "programs").glob("*.json")) if (report / "programs").is_dir() else []:
        rec = _json(p.read_text())
        rule = rec.get("rule") if isinstance(rec, dict) and isinstance(rec.get("rule"), str) else p.stem.split("-")[0]
        (out / "programs" / p.name).write_text(p.read_text())
        row = {"rule": rule, "name": p.stem, "program": f"programs/{p.name}",
               "message": str(rec.get("message", ""))[:300] if isinstance(rec, dict) else ""}
        same = [n for n in saved_rules.get(rule, []) if Path(n).stem == p.stem] or \
            (saved_rules.get(rule, []) if p.stem == rule else [])
        if same:
            known.append(dict(row, known_as=same[0]))
        else:
            new.append(row)
    return new, known


def run(a) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    module, args, ok_codes, _ = TARGETS[a.target]
    py = a.python or sys.executable
    if a.target == "ollama" and not a.src:
        raise WatchError("run ollama needs --src CHECKOUT (an ollama/ollama clone)")
    src_args = ["--src", a.src] if a.target == "ollama" else []
    version = peer_version(a.target, py, a.src)
    saved = saved_findings(a.target)
    result = {"format": FORMAT, "target": a.target, "status": "ok", "reason": None,
              "peer": {"version": version, "source": a.source or ("checkout " + a.src if a.target == "ollama"
                                                                   else "installed for " + py)},
              "hunt": None, "new": [], "known": [], "saved": []}
    report = out / "hunt"
    t = time.monotonic()
    rc, text, err = _run([py, "-m", module, *args, *src_args, "--minutes", str(a.minutes), "--report", str(report)],
                    a.minutes * 60 + SLACK_S, out / "hunt.log")
    new, known = hunt_violations(a.target, report, saved, out)
    result["hunt"] = {"minutes": a.minutes, "seconds": round(time.monotonic() - t, 1), "exit": rc,
                      "violations": len(new) + len(known), "rules": sorted({v["rule"] for v in new + known}),
                      "line": _last_line(text)}         # the target's own closing line
    result["new"], result["known"] = new, known
    if rc not in ok_codes or not (report / "report.md").is_file():     # exit 1 is also a Python traceback's
        result["status"] = "failed"
        result["reason"] = (f"hunt did not finish in {a.minutes:g} min + {SLACK_S // 60} min" if rc is None
                            else f"hunt exit {rc}{'' if rc not in ok_codes else ' and no report.md'}: "
                                 f"{_last_line(err or text)}")
    if saved and a.target not in NO_REPLAY:
        rc2, text2, err2 = _run(replay_cmd(a.target, py, a.src, saved), REPLAY_S, out / "replay.log")
        got = replay_verdicts(a.target, text2, saved)
        why = "replay did not finish" if rc2 is None else f"no verdict in the replay output (exit {rc2}): " \
                                                          f"{_last_line(err2 or text2)}"
        for f in saved:
            status, detail = got.get(_name(a.target, f), ("error", why))
            result["saved"].append({"finding": _name(a.target, f), "rule": _rule(f), "status": status,
                                    "detail": detail[:300], "recorded_fixed": _recorded_fixed(f)})
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(f"watch {a.target} ({version}): {result['status']}; {len(new)} new, {len(known)} known violations; "
          f"saved: {sum(s['status'] == 'reproduces' for s in result['saved'])} reproduce, "
          f"{sum(s['status'] == 'stopped' for s in result['saved'])} stopped, "
          f"{sum(s['status'] == 'error' for s in result['saved'])} not judged; {out / 'result.json'}")
    return 0 if result["status"] == "ok" else 1


def failed(a) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(
        {"format": FORMAT, "target": a.target, "status": "failed", "reason": a.reason,
         "peer": {"version": a.version or "not installed", "source": a.source or ""},
         "hunt": None, "new": [], "known": [], "saved": []}, indent=1))
    return 0


def latest(a) -> int:
    import urllib.request
    url = f"https://pypi.org/pypi/{a.package}/json"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            version = json.load(r)["info"]["version"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise WatchError(f"latest {a.package}: no version from {url} ({type(e).__name__}: {e})") from None
    print(version)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m targets.watch", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("target", choices=sorted(TARGETS))
    r.add_argument("--out", required=True)
    r.add_argument("--python", default="")
    r.add_argument("--src", default="")
    r.add_argument("--minutes", type=float, default=25.0)
    r.add_argument("--source", default="", help="where the peer came from (shown in the summary)")
    f = sub.add_parser("failed")
    f.add_argument("target", choices=sorted(TARGETS))
    f.add_argument("--out", required=True)
    f.add_argument("--reason", required=True)
    f.add_argument("--version", default="")
    f.add_argument("--source", default="")
    m = sub.add_parser("merge")
    m.add_argument("inputs", nargs="*")
    m.add_argument("--out", required=True)
    m.add_argument("--expect", default="", help="comma-separated targets; one with no result counts as failed")
    lt = sub.add_parser("latest")
    lt.add_argument("package")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "run" and a.minutes <= 0:
            raise WatchError(f"--minutes {a.minutes:g}: give a positive number of minutes")
        if a.cmd == "merge" and not a.inputs and not a.expect:
            raise WatchError("merge: no results given (result.json files or directories holding one)")
        unknown = [x for x in getattr(a, "expect", "").split(",") if x and x not in TARGETS]
        if unknown:
            raise WatchError(f"--expect {unknown[0]}: not a target (targets: {', '.join(sorted(TARGETS))})")
        return {"run": run, "failed": failed, "merge": merge_main, "latest": latest}[a.cmd](a)
    except WatchError as e:
        print(f"watch: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
