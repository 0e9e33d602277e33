"""The vLLM check's report: report.md, the shrunk programs and the exported pytest tests.

Invariants: a finding's seconds are from its campaign's start to the first failing example; lengths
count operations (reset excluded); each finding names the vLLM function and line it points at in
the version that ran; policy differences (spec vs vLLM, no rule broken) are counted, never failures.
"""
from __future__ import annotations

import json
from pathlib import Path

from targets.report import meaning, program_text
from targets.vllm.export import export
from targets.vllm.rules import NOT_APPLICABLE, RULES, where


def write(d: Path, eng, runs, target) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "programs").mkdir(exist_ok=True)
    steps = sum(c.steps for c in runs)
    secs = sum(c.seconds for c in runs)
    md = [f"# Rule check of vLLM {eng.version}", "",
          f"vLLM at `{eng.path}`; stubbed (never called): {', '.join(eng.stubbed) or 'none'}.", "",
          f"{sum(c.minutes for c in runs):g} minutes, {sum(c.runs for c in runs)} Hypothesis runs over layouts "
          f"{', '.join(l for c in runs for l in c.layouts)}: {steps} operations judged in {secs:.0f} s = "
          f"**{steps / max(secs, 1e-9):.0f} operations/s** (reductions included); {target.refused} requests "
          "the pool refused.", "",
          f"Rules judged: {', '.join(sorted(RULES))} (C2 not on the -eagle layouts: their lookup drops the last "
          "matched block by design). Not applicable:", ""]
    md += [f"- {r}: {why}" for r, why in sorted(NOT_APPLICABLE.items())]
    md += ["", "| rule | layout | found after | shrunk length | violation |", "|---|---|---|---|---|"]
    findings = [f for c in runs for f in c.findings.values()]
    for f in findings:
        md.append(f"| {f.rule} | {f.layout} | {f.seconds:.1f} s | {f.length} | {f.message} |")
    if not findings:
        md.append("| (none) | | | | |")
    for f in findings:
        text, why = where(f.rule, f.layout)
        name = f"{f.rule}-{f.layout}"
        rec = dict(rule=f.rule, layout=f.layout, message=f.message, ops=f.ops, version=eng.version,
                   where=text, why=why)
        (d / "programs" / f"{name}.json").write_text(json.dumps(rec, indent=1))
        md += ["", f"## {f.rule} on `{f.layout}`", "", f"*Rule:* {meaning(f.rule)}", "", f"*Violation:* {f.message}", "",
               f"*Responsible:* {text}. {why}", "",
               f"Shrunk to {f.length} operations (`programs/{name}.json`, replay with `./dev check-vllm replay`):", "",
               "```", program_text(f.ops), "```"]
        test = export(rec)
        if test:
            tn = f"test_{f.rule.lower()}_{f.layout.replace('-', '_')}.py"
            (d / "programs" / tn).write_text(test)
            md += ["", f"As a pytest test against vLLM's API: `programs/{tn}`."]
    policy = {}
    for c in runs:
        for kind, (n, ex) in c.policy.items():
            policy[kind] = policy.get(kind, 0) + n
    md += ["", "## Policy differences (spec vs vLLM, no rule broken)", "",
           "The spec works in tokens, the view in blocks, so trie shapes and counters always differ; resume "
           "differences are the block granularity and vLLM's lookup choices.", "", "| kind | operations |", "|---|---|"]
    md += [f"| {k} | {n} |" for k, n in sorted(policy.items())]
    (d / "report.md").write_text("\n".join(md) + "\n")
    return d / "report.md"
