"""The mlx-vlm report: which rules apply (and why the others do not), what ran, each violation with
its shrunk program and the mlx-vlm code responsible, and the saved findings' replay.

Invariants: nothing here judges; the verdicts come from spec.rules through targets.program.judge.
Causes are named only where a saved finding (findings/*.json) reproduces with the same rule and the
same first violation message; any other violation is reported as "unexplained".
"""
from __future__ import annotations

import json
from pathlib import Path

from targets.mlx_vlm.target import NOT_APPLICABLE, RULES, S1_CHECKPOINT
from targets.report import meaning

FINDINGS = Path(__file__).parent / "findings"


def saved() -> list:
    return [json.loads(p.read_text()) for p in sorted(FINDINGS.glob("*.json"))]


def cause_of(rule: str, violations: list) -> dict | None:
    for f in saved():
        if f["rule"] == rule and violations and violations[0] in f["violations"]:
            return f
    return None


def write(report_dir, result: dict, version: str, replays: list) -> Path:
    d = Path(report_dir)
    (d / "programs").mkdir(parents=True, exist_ok=True)
    s = result["stats"]
    lines = [f"# mlx-vlm {version}: automatic prefix cache under the rules", "",
             f"{s['programs']} programs, {s['ops']} operations, {s['seconds']} s "
             f"(targets/program.py random programs; model/images {', '.join(result.get('configs', []))}).", "",
             "## Rules", "", "| rule | applied | why not |", "|---|---|---|"]
    for r in sorted(RULES | set(NOT_APPLICABLE)):
        why = NOT_APPLICABLE.get(r, "") + (f" (qwen3_5: {S1_CHECKPOINT})" if r == "S1" else "")
        lines.append(f"| {r} | {'yes' if r in RULES else 'no'} | {why} |")
    lines += ["", "## Violations", ""]
    if not result["found"]:
        lines.append("None.")
    for r, f in sorted(result["found"].items()):
        (d / "programs" / f"{r}.json").write_text(json.dumps(f, indent=1))
        c = cause_of(r, f["violations"])
        lines += [f"### {r}: {meaning(r)}", "", f"- first seen after {f['seconds']} s; shrunk to {len(f['ops'])} ops "
                  f"(programs/{r}.json, {f['config']})",
                  f"- {'; '.join(f['violations'][:2])}",
                  f"- cause: {c['why'] + ' (' + c['function'] + ')' if c else 'unexplained'}", ""]
    if s["errors"]:
        lines += ["## Target errors (not verdicts)", ""] + [f"- {e}" for e in s["errors"][:10]] + [""]
    lines += ["## Saved findings, replayed", "", "| finding | reproduces | script |", "|---|---|---|"]
    lines += [f"| {name} | {'yes' if ok else 'no'} | {script} |" for name, ok, script in replays]
    out = d / "report.md"
    out.write_text("\n".join(lines) + "\n")
    return out
