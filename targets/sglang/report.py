"""check-sglang's report: report.md and programs/RULE.json (replayable with --replay).

Also programs/test_<rule>_sglang.py per violation: the program as a standalone pytest test
(targets.sglang.export).
Invariants: each violation names the rule's meaning (spec.rules' docstring), the SGLang function
it is attributed to (rules.CAUSES), the seconds to first detection and the shrunk program; policy
differences (spec vs SGLang, no rule broken) are counted apart.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from targets.report import meaning, program_text
from targets.sglang.export import export
from targets.sglang import rules as full_rules


PANIC_MEANING = ("SGLang's own code raised an exception on a well-formed program (targets.sglang.crash: the "
                 "innermost frame of SGLang's or ours is SGLang's)")


def cause(rule: str, message: str, causes: dict) -> tuple:
    """(SGLang function, why) for a violated rule; for PANIC the raising frame named in the message."""
    if rule == "PANIC":
        m = re.search(r"(\w+) in (\S+) \(([^)]+)\)", message)
        if m:
            return f"{m.group(2)} ({m.group(3)})", f"raised {m.group(1)} there"
    return causes.get(rule, ("(the cache under check)", ""))


def write(d, c, what: str, command: str, page_size: int = 1, swa: bool = False, target=None,
          rules_of: str = "") -> Path:
    """`swa`: the rules and causes of targets.sglang.rules_swa; no pytest export (the exported test
    drives RadixCache only): the program replays with `--cache swa --replay`. `target`: a
    targets.sglang.reqcalls.ReqTarget (`--cache req`) or swa_eagle.SwaPagedTarget (`--cache swa
    --eagle` / `--page-size`): its rules, and the export of targets.sglang.export_req / export_swa.
    `rules_of` ("mamba", "unified", "unified_swa"): the rules of targets.sglang.rules_<rules_of>, no pytest export
    (the programs replay with `--cache mamba|unified --replay`)."""
    if rules_of:
        import importlib
        rules = importlib.import_module(f"targets.sglang.rules_{rules_of}")
        swa = True
    elif swa:
        from targets.sglang import rules_swa as rules
    else:
        rules = full_rules
    RULES, NOT_APPLICABLE, CAUSES = rules.RULES, rules.NOT_APPLICABLE, rules.CAUSES
    if target is not None:
        RULES, NOT_APPLICABLE = target.RULES, target.NOT_APPLICABLE
    d = Path(d)
    (d / "programs").mkdir(parents=True, exist_ok=True)
    rate = c.steps / c.seconds if c.seconds else 0.0
    md = [f"# Rule check of SGLang's {'SWARadixCache' if swa else 'RadixCache'}: {what}" if not rules_of else
          f"# Rule check of SGLang's {rules_of} radix cache: {what}", "",
          f"`./dev check-sglang {command}`: {c.minutes:g} minutes, {c.runs} Hypothesis runs, {c.steps} operations "
          f"judged in {c.seconds:.0f} s = **{rate:.0f} operations/s** (reductions included).", "",
          f"Rules judged: {', '.join(sorted(RULES))}. Not applicable:", ""]
    md += [f"- {r}: {why}" for r, why in sorted(NOT_APPLICABLE.items())]
    md += ["", "| rule | found after | shrunk length | SGLang function | violation |", "|---|---|---|---|---|"]
    for rule, f in sorted(c.findings.items()):
        fn = cause(rule, f.message, CAUSES)[0]
        md.append(f"| {rule} | {f.seconds:.1f} s | {f.length} | `{fn}` | {f.message} |")
    if not c.findings:
        md.append("| (none) | | | | |")
    md.append("")
    for rule, f in sorted(c.findings.items()):
        fn, why = cause(rule, f.message, CAUSES)
        (d / "programs" / f"{rule}.json").write_text(json.dumps(
            dict(rule=rule, what=what, message=f.message, ops=f.ops), indent=1))
        md += [f"## {rule}", "", f"*Rule:* {PANIC_MEANING if rule == 'PANIC' else meaning(rule)}", "", f"*Where:* `{fn}`: {why}.", "",
               f"Found after {f.seconds:.1f} s; shrunk to {f.length} operations (`programs/{rule}.json`; "
               f"`./dev check-sglang --replay programs/{rule}.json --releases A,B,...` names the first release "
               "where it stops):", "", "```", program_text(f.ops), "```", ""]
        if swa and target is None:
            continue
        if target is not None:
            from targets.sglang.export_req import export as export_req
            from targets.sglang.export_swa import export as export_swa
            text = (export_swa if swa else export_req)(rule, what, f.message, f.ops, page_size, eagle=target.eagle)
        else:
            text = export(rule, what, f.message, f.ops, page_size)
        (d / "programs" / f"test_{rule.lower()}_sglang.py").write_text(text)
        md += [f"As a pytest test against SGLang's public API (`programs/test_{rule.lower()}_sglang.py`; it checks "
               + ("S1, A1 and A2 (leaks included)" if target is not None else "S1, C1, C2, A1 and A2") +
               " on the tree after every operation; other rules: replay the program).", ""]
    md += ["## Policy differences (spec vs SGLang, no rule broken)", "",
           "| kind | operations | first example |", "|---|---|---|"]
    for kind, (n, ex) in sorted(c.policy.items()):
        md.append(f"| {kind} | {n} | {ex['example'] if ex else ''} |")
    md.append("")
    (d / "report.md").write_text("\n".join(md))
    (d / "report.json").write_text(json.dumps({"what": what, "steps": c.steps, "seconds": c.seconds,
                                               "findings": sorted(c.findings), "policy": {k: n for k, (n, _) in
                                                                                         c.policy.items()}}, indent=1))
    return d / "report.md"
