"""The mlx-lm target's report: rule violations and policy differences kept apart.

Writes, under the report directory (the layout of targets/report.py, the Ollama command's):
report.md (the tables), report.json (every figure), and per violation programs/<RULE>-<cause>.json
(the finding with its shrunk program, replayable) and programs/<RULE>-<cause>_repro.py (the
standalone script).
Invariants: a violation row names the mlx-lm version, the function responsible with its line as
installed, the shrunk program's length and the seconds to first detection; whether a public issue
reports it comes from ISSUES (searched on ml-explore/mlx-lm's tracker, 2026-12-03) and says so.
"""
from __future__ import annotations

import json
from pathlib import Path

from targets.mlx_lm import models
from targets.mlx_lm.export import export
from targets.mlx_lm.rules import CAUSES, quote

ISSUES = {
    "exact-hit-no-seed": "yes: #1215 (closed, reported on 0.31.3; still reproduces), open PR #1887; PRs #1581/#1596",
    "bytes-limit-not-passed": "yes: open PRs #1118, #1392, #1409 (#1267 closed); issue #883",
    "one-token-prefix": "yes: #1495 (closed unfixed as non-essential), PR #1496 (closed)",
    "fetch-not-a-use": "yes: #1495 (closed unfixed as non-essential), PR #1496 (closed)",
    "shallower-restore": "not found (related, not the same: #1437, #1494 on windowed trims)",
    "typed-priority": "by design (PR #906 / CacheOrder)",
    "trim-partial": "issue 50 cites public reports closed unfixed; not searched here",
    "speculative-key-ahead": "not searched",
    "draft-behind": "not searched",
    "resume-behind-match": "by design (entries only at segment ends and at the finish)",
}

FINDINGS_DIR = Path(__file__).resolve().parent / "findings"


def finding_record(f: dict, version: str) -> dict:
    c = CAUSES[f["cause"]]
    path, line, text = quote(c)
    return {**f, "mlx_lm_version": version, "module": c.module, "function": c.function, "line": line,
            "quote": text, "why": c.why, "public_issue": ISSUES.get(f["cause"], "not searched")}


def save_finding(rec: dict, directory: Path = FINDINGS_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    p = directory / f"{rec['rule']}-{rec['cause']}.json"
    p.write_text(dumps(rec))
    return p


def dumps(rec: dict) -> str:
    """JSON with one request per line (programs stay readable in a diff)."""
    ops = rec["program"]["ops"]
    body = {**rec, "program": {**rec["program"], "ops": "@OPS@"}}
    text = json.dumps(body, indent=1)
    return text.replace('"@OPS@"', "[\n   " + ",\n   ".join(json.dumps(op) for op in ops) + "\n  ]") + "\n"


def write(out: Path, found: list, policy: dict, meta: dict, version: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    recs = [finding_record(f, version) for f in found]
    lines = [f"# mlx-lm {version}: server prompt cache (LRUPromptCache) against the rules", "",
             f"Run: `{meta.get('command', './dev check-mlx-lm')}` -- {meta['seconds']:.0f} s, "
             f"{meta['steps']} requests by the machine, {meta['steps_per_s']:.1f} steps/s while hunting "
             f"({meta['steps_per_s_overall']:.1f}/s over the run, shrinking included; one step = one request "
             f"served on the path mlx_lm.server chooses, with its checks and C1's same-schedule replay). Cache under check: "
             f"`{meta['lru']}`.", ""]
    if meta.get("hollow"):
        lines += ["**Fast tier (`--hollow`):** the models are hollow (targets/mlx_lm/hollow.py: the same cache "
                  "writes, no arithmetic), so every rule but C1 is judged and a step has no replay; each finding "
                  "below was shrunk there and then failed the same way on the real models. "
                  f"Found on hollow models only and not reproduced on the real ones: {len(meta.get('unconfirmed', []))}"
                  + "".join(f"; {u['rule']} ({u['cause']}) on {u['model']}" for u in meta.get("unconfirmed", []))
                  + ".", ""]
    lines += [
             "| model | layer caches | server path (text, no seed) | C1 noise | planted: shifted by one | planted: a token changed |",
             "|---|---|---|---|---|---|"]
    for m in meta["models"]:
        lines.append(f"| {m['name']} | {', '.join(m['caches'])} | {m['path']} | {m['noise']:.1e} | "
                     f"{m['planted']:.1e} | {m['changed']:.1e} |")
    from targets.mlx_lm.rules import NOT_APPLICABLE, RULES
    lines += ["", f"Rules judged: {', '.join(meta.get('rules', sorted(RULES)))}. Not applicable:", ""]
    lines += [f"- {r}: {why}" for r, why in sorted(NOT_APPLICABLE.items())]
    lines += ["", "## Rule violations", "",
              "| rule | cause | model | steps | s to first detection | mlx-lm function (line) | public issue |",
              "|---|---|---|---|---|---|---|"]
    for r in recs:
        lines.append(f"| {r['rule']} | {r['cause']} | {r['model']} | {r['steps']} | {r['seconds_to_detect']} | "
                     f"`{r['module']}.{r['function']}` line {r['line']}: `{r['quote']}` | {r['public_issue']} |")
    for r in recs:
        name = f"{r['rule']}-{r['cause']}"
        (out / "programs").mkdir(exist_ok=True)
        (out / "programs" / f"{name}.json").write_text(dumps(r))
        (out / "programs" / f"{name}_repro.py").write_text(export(r, version))
        lines += ["", f"### {r['rule']} ({r['cause']})", "", r["message"], "", r["why"], "",
                  f"Shrunk program ({r['steps']} requests; [prompt, generated, chat, system length]), "
                  f"flags --prompt-cache-size {r['program']['prompt_cache_size']} --prompt-cache-bytes "
                  f"{r['program']['prompt_cache_bytes']}:", "", "```", json.dumps(r["program"]["ops"]), "```",
                  f"Replayable: `programs/{name}.json`; standalone script: `programs/{name}_repro.py`."]
    if meta.get("e1_worst"):
        lines += ["", "## E1: the worst growth the run saw, per serving path", "",
                  "| path | requests on it | bytes held at rest | --prompt-cache-bytes | entries | model |",
                  "|---|---|---|---|---|---|"]
        for path, w in sorted(meta["e1_worst"].items()):
            lines.append(f"| {path} | {meta.get('paths', {}).get(path, '?')} | {w['held']:,} | {w['limit']:,} | "
                         f"{w['entries']} | {w['model']} |")
    lines += ["", "## Policy differences (no rule broken)", "",
              "| kind | count | first example |", "|---|---|---|"]
    for kind, (n, example) in sorted(policy.items()):
        lines.append(f"| {kind} | {n} | {example} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "report.json").write_text(json.dumps({"version": version, "meta": meta, "violations": recs,
                                                 "policy": policy}, indent=1) + "\n")
    return out / "report.md"


def model_rows() -> list:
    from targets.mlx_lm.rules import calibrate
    rows = []
    for name in models.MODEL_NAMES:
        m = models.build(name)
        cal = calibrate(name)
        rows.append({"name": name, "caches": sorted(set(models.cache_kinds(m))), "path": models.server_path(m),
                     "noise": cal["noise"], "planted": cal["planted_shift"], "changed": cal["planted_changed"]})
    return rows
