"""The power table (docs/spec.md): for every rule id, a policy mutant of the
spec and of impl that breaks that rule is flagged by the rule's predicate
alone, run the way a target run is (targets.program.judge over
targets.reference: views and spec.rules, no comparison with anything).

Also: the unmutated spec and impl run the same programs with no violation
(no false alarm), every rule id of REFERENCE has a row in the table, and no
predicate reads a policy method of the cache under check.
"""
from __future__ import annotations

import ast
import itertools
import re
import time
from pathlib import Path

import pytest

from spec.rules import OPERATION, PREDICATES, STATE, check, check_step
from spec.view import View
from targets.program import judge, random_programs
from targets.reference import SpecTarget, ImplTarget
from mutants import MIXES, MUTANTS, WEAKER

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = 40                  # per mix, at most, before a mutant counts as missed
CONFIGS = [dict(interval=0, near_end=2), dict(interval=3, near_end=0), dict(interval=4, near_end=4)]
BUDGETS = [1 << 40, 150, 60, 400]


def hunt(side: str, rule: str, mutant, monkeypatch) -> dict:
    """Run random programs on the mutated side until `rule` is flagged."""
    (mutant.spec if side == "spec" else mutant.impl)(monkeypatch)
    t0, runs, steps = time.monotonic(), 0, 0
    for mix in mutant.mixes:
        for k, prog in enumerate(itertools.islice(random_programs(seed=sum(map(ord, rule + mix))), PROGRAMS)):
            cfg = dict(CONFIGS[k % len(CONFIGS)], budget=BUDGETS[k % len(BUDGETS)])
            target = (SpecTarget(MIXES[mix], chunk=3, **cfg) if side == "spec"
                      else ImplTarget(MIXES[mix], chunk=3, **cfg))
            verdict = judge(target, prog, want=rule)
            target.shutdown()
            runs, steps = runs + 1, steps + verdict.steps
            if rule in verdict.rules:
                return {"found": True, "mix": mix, "programs": runs, "steps": steps,
                        "seconds": time.monotonic() - t0, "message": next(str(v) for v in verdict.violations
                                                                          if v.rule == rule)}
    return {"found": False, "programs": runs, "steps": steps}


@pytest.mark.parametrize("rule", sorted(MUTANTS))
def test_spec_policy_mutant_is_flagged_by_its_predicate(rule, monkeypatch):
    got = hunt("spec", rule, MUTANTS[rule], monkeypatch)
    assert got["found"], f"{rule}: {MUTANTS[rule].what}: not flagged in {got['programs']} programs"


@pytest.mark.parametrize("rule", sorted(r for r, m in MUTANTS.items() if callable(m.impl)))
def test_impl_policy_mutant_is_flagged_through_its_view(rule, monkeypatch):
    got = hunt("impl", rule, MUTANTS[rule], monkeypatch)
    assert got["found"], f"{rule}: {MUTANTS[rule].what}: not flagged on impl in {got['programs']} programs"


@pytest.mark.parametrize("side", ["spec", "impl"])
@pytest.mark.parametrize("name", sorted(WEAKER))
def test_weaker_reading_is_flagged_by_its_predicate(name, side, monkeypatch):
    rule, mutant = WEAKER[name]
    got = hunt(side, rule, mutant, monkeypatch)
    assert got["found"], f"{name}: {mutant.what}: not flagged by {rule} on {side} in {got['programs']} programs"


@pytest.mark.parametrize("side", ["spec", "impl"])
def test_unmutated_caches_raise_no_alarm(side):
    count = 25 if side == "spec" else 4
    for mi, (mix, layers) in enumerate(MIXES.items()):
        for k, prog in enumerate(itertools.islice(random_programs(seed=100 + mi), count)):
            cfg = dict(CONFIGS[k % len(CONFIGS)], budget=BUDGETS[k % len(BUDGETS)])
            target = SpecTarget(layers, chunk=3, **cfg) if side == "spec" else ImplTarget(layers, chunk=3, **cfg)
            verdict = judge(target, prog)
            target.shutdown()
            assert verdict.error is None and not verdict.violations, (mix, k, verdict)


# ------------------------------------------------------------ the table itself
def reference_rule_ids() -> list:
    text = (ROOT.parent / "shared" / "REFERENCE.md")
    ids = re.findall(r"\*\*([TSMPGEACFR][0-9])\b", text.read_text()) if text.exists() else []
    return sorted(set(ids)) or sorted(PREDICATES) + ["A3", "F1", "F2", "R1"]


def power_table_rows() -> dict:
    doc = (ROOT / "docs" / "spec.md").read_text()
    section = doc.split("## Power table", 1)[1]
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| ([A-Z][0-9]) \|.*$", section, re.M)}


def test_every_rule_has_one_predicate_and_a_power_row():
    ids = reference_rule_ids()
    rows = power_table_rows()
    missing = [r for r in ids if r not in rows]
    assert not missing, f"rules without a row in docs/spec.md's power table: {missing}"
    assert not set(STATE) & set(OPERATION), "a rule id with two predicates"
    view_rules = [r for r in ids if r not in ("A3", "F1", "F2", "R1")]
    assert sorted(PREDICATES) == sorted(view_rules), "every view rule id has exactly one predicate"
    for rule in PREDICATES:
        assert rule in MUTANTS or rule == "M3", f"{rule} has no policy mutant"


POLICY = {"evict_order", "evictable", "reachable", "source", "node_bytes", "restore", "store",
          "touch", "compact", "evict", "page_out", "advance", "attach", "victims"}


def test_no_predicate_reads_a_policy_method():
    read = {n.attr for f in ("rules.py", "rules_eviction.py", "violation.py")
            for n in ast.walk(ast.parse((ROOT / "spec" / f).read_text())) if isinstance(n, ast.Attribute)}
    assert not read & POLICY, f"spec's rules read {sorted(read & POLICY)} of the cache it judges"
    assert not POLICY & set(dir(View)), "the view carries a policy method"
