"""A campaign over a target and its report.

`campaign(target, layouts, minutes)` runs targets.machine hunts round-robin over
the layouts until the time is up. Each hunt is one Hypothesis run that fails on
the first new rule it sees; the program is reduced to that rule (targets.machine
.minimize); a rule found once is not hunted again. `write(report_dir, ...)` writes:

  report.md               per rule: meaning, layout, seconds to first detection,
                          shrunk length, the program; the policy differences;
                          throughput (operations per second)
  programs/<RULE>.json    the shrunk program, replayable (targets.machine.replay)
  programs/<RULE>_test.go (with `exporter`) the program as a Go test

Invariants: seconds are from the campaign's start to the first example that
broke the rule (before reduction); lengths count target operations (reset
excluded).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import spec.rules as R
from targets.machine import Hunt, hunt_once, minimize


@dataclass
class Finding:
    rule: str
    layout: str
    seconds: float
    message: str
    ops: list

    @property
    def length(self) -> int:
        return sum(1 for o in self.ops if o["op"] != "reset")


@dataclass
class Campaign:
    target: str
    layouts: tuple
    minutes: float
    findings: dict = field(default_factory=dict)   # rule -> Finding
    policy: dict = field(default_factory=dict)
    steps: int = 0
    seconds: float = 0.0
    runs: int = 0


def meaning(rule: str) -> str:
    f = R.PREDICATES.get(rule)
    if rule == "PANIC":
        return "the cache under test panicked (a Go runtime error or an explicit panic)"
    if f is None or not f.__doc__:
        return ""
    return " ".join(f.__doc__.split())


def campaign(target, layouts, minutes: float, config: dict | None = None, max_examples: int = 40,
             steps: int = 15, on_finding=None, shrink: bool = False) -> Campaign:
    """Hunt until `minutes` are up. Without `shrink`, Hypothesis does not shrink:
    each failing program is reduced by `minimize` (replays, milliseconds each),
    which keeps detection times from waiting on minutes of shrinking."""
    cfg = dict(interval=8, near_end=4, chunk=8, **(config or {}))
    hunt = Hunt(rules=frozenset(target.RULES) | {"PANIC"})
    hunt.deadline = time.monotonic() + minutes * 60
    out = Campaign(getattr(target, "name", "target"), tuple(layouts), minutes)
    i = 0
    while time.monotonic() < hunt.deadline:
        layout = layouts[i % len(layouts)]
        i += 1
        out.runs += 1
        e = hunt_once(target, hunt, dict(cfg, layout=layout), max_examples=max_examples, steps=steps, shrink=shrink)
        if e is not None and e.rule not in out.findings:
            ops = minimize(target, e.ops, e.rule)
            f = Finding(e.rule, layout, hunt.seen.get(e.rule, hunt.found[e.rule]), e.message, ops)
            out.findings[e.rule] = f
            if on_finding:
                on_finding(f)
    out.seconds = time.monotonic() - hunt.t0
    out.steps, out.policy = hunt.steps, hunt.policy
    return out


def program_text(ops: list) -> str:
    lines = []
    for o in ops:
        args = ", ".join(f"{k}={v}" for k, v in o.items() if k not in ("op", "tokens", "media") and v is not None
                         and not (k == "max_chunks" and v == 0))       # a prefill of every chunk: prefill()
        lines.append(f"{o['op']}({args})")
    return "\n".join(lines)


def write(report_dir, c: Campaign, explain=None, exporter=None, extra: str = "") -> Path:
    """`explain(rule, layout)`: the cause in the target's code, or None; `exporter(rule, ops)`: the program
    in the target's own test language, or None where it cannot be expressed there."""
    d = Path(report_dir)
    (d / "programs").mkdir(parents=True, exist_ok=True)
    rate = c.steps / c.seconds if c.seconds else 0.0
    md = [f"# Rule check of {c.target}", "",
          f"{c.minutes:g} minutes over layouts {', '.join(c.layouts)}: {c.runs} Hypothesis runs, "
          f"{c.steps} target operations judged in {c.seconds:.0f} s = **{rate:.0f} operations/s** "
          "(reducing failing programs included).", ""]
    if extra:
        md += [extra, ""]
    md += ["| rule | found after | shrunk length | layout | violation |", "|---|---|---|---|---|"]
    for rule, f in sorted(c.findings.items()):
        md.append(f"| {rule} | {f.seconds:.1f} s | {f.length} | {f.layout} | {f.message} |")
    if not c.findings:
        md.append("| (none) | | | | |")
    md.append("")
    for rule, f in sorted(c.findings.items()):
        (d / "programs" / f"{rule}.json").write_text(json.dumps(
            dict(rule=rule, layout=f.layout, message=f.message, ops=f.ops), indent=1))
        md += [f"## {rule}", "", f"*Rule:* {meaning(rule)}", ""]
        why = explain(rule, f.layout) if explain else None
        if why:
            md += [f"*Why (the cause at Ollama fb30760, the stored copy; check it on other commits):* {why}", ""]
        md += [f"Found after {f.seconds:.1f} s on layout `{f.layout}`; shrunk to {f.length} operations "
               f"(`programs/{rule}.json`):", "", "```", program_text(f.ops), "```", ""]
        go = exporter(rule, f.ops) if exporter else None
        if go is not None:
            (d / "programs" / f"{rule}_test.go").write_text(go)
            md += [f"As a Go test (`programs/{rule}_test.go`, paste into x/mlxrunner):", "", "```go", go, "```", ""]
        elif exporter:
            md += ["No Go test: the target's own fakes cannot express this layout; replay the program with "
                   "`--replay`.", ""]
    md += ["## Policy differences (spec vs target, no rule broken)", "",
           "| kind | operations | first example |", "|---|---|---|"]
    for kind, (n, ex) in sorted(c.policy.items()):
        md.append(f"| {kind} | {n} | {ex['example'] if ex else ''} |")
    md.append("")
    (d / "report.md").write_text("\n".join(md))
    return d / "report.md"
