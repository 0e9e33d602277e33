"""Every case in fuzz/corpus/ replays (python -m fuzz replay) as a regression test.

Each case runs in a `python -m fuzz replay` subprocess, exactly as a user replays it (and with
OpenBLAS preloaded: the CLI re-executes itself with it on Linux, ~10x faster for SmolLM2).

A case with "expect": "pass" must pass every oracle now. A case with "expect": "fail" records a
known, not yet fixed bug found by the campaign: it must still fail with its recorded signature
(strict: once the bug is fixed this test fails and the case is flipped to "pass").
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "fuzz" / "corpus"
CASES = sorted(CORPUS.glob("*.json"))


def test_corpus_has_the_historical_scenarios():
    names = {p.name for p in CASES}
    assert {"hist-prefix-response-hybrid.json", "hist-resume-inside-edge-evict.json",
            "hist-long-conversation-over-budget.json"} <= names


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_corpus_case(path):
    case = json.loads(path.read_text())
    p = subprocess.run([sys.executable, "-m", "fuzz", "replay", "-v", str(path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=900, env=dict(os.environ, PYTHONHASHSEED="0"))
    out = p.stdout + p.stderr
    if case.get("expect", "pass") == "fail":
        assert p.returncode == 1 and ": FAIL at operation" in out, f"{path.name} no longer fails: the bug is " \
            f"fixed, set expect to pass\n{out[-3000:]}"
        assert f"\n{case['expect_signature']}:" in out, out[-3000:]
        return
    assert p.returncode == 0 and ": pass (" in out, out[-3000:]
    assert sum(line.startswith("  #") for line in out.splitlines()) == len(case["requests"]), out[-3000:]
