"""Every case in fuzz/corpus/ replays (python -m fuzz replay) as a regression test.

A case with "expect": "pass" must pass every oracle now. A case with "expect": "fail" records a
known, not yet fixed bug found by the campaign: it must still fail with its recorded signature
(strict: once the bug is fixed this test fails and the case is flipped to "pass").
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fuzz.campaign import run_case
from fuzz.oracle import ColdOracle

CORPUS = Path(__file__).resolve().parents[1] / "fuzz" / "corpus"
CASES = sorted(CORPUS.glob("*.json"))
ORACLE = ColdOracle()


def test_corpus_has_the_historical_scenarios():
    names = {p.name for p in CASES}
    assert {"hist-prefix-response-hybrid.json", "hist-resume-inside-edge-evict.json",
            "hist-long-conversation-over-budget.json"} <= names


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_corpus_case(path):
    case = json.loads(path.read_text())
    res = run_case(case, ORACLE)
    if case.get("expect", "pass") == "fail":
        assert res.failure is not None, f"{path.name} no longer fails: the bug is fixed, set expect to pass"
        assert res.failure.signature == case["expect_signature"], str(res.failure)
        return
    assert res.failure is None, f"{path.name} operation {res.failed_at}: {res.failure}"
    assert len(res.records) == len(case["requests"])
    assert all(r.checks > 0 for r in res.records)
