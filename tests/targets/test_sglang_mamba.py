"""targets/sglang/mamba: SGLang's MambaRadixCache adapter, its recurrent view and rules, on a planted-fault
fake (always, no sglang or torch needed), and on SGLang's own MambaRadixCache when a release that has it is
given (SGLANG_MAMBA_SRC: an unpacked wheel or checkout of 0.5.6 - 0.5.20, with sglang's torch venv:
targets/sglang/install.sh, install_overlay.sh for 0.5.10 - 0.5.15), else skipped with the reason."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from targets.machine import replay
from targets.sglang.fixture_mamba import FAULTS, FakeMambaApi
from targets.sglang.mamba import MambaTarget


def req(keys, gen=()):
    return [dict(op="begin", keys=list(keys), spans=[]), dict(op="prefill", max_chunks=0),
            *[dict(op="step", key=k) for k in [keys[-1], *gen]], dict(op="close")]


# chunked prefills (8 tokens) and closes put states at 8, 10, 13, 5 ...; [1..5, 9] branches inside an edge
# (a split head without a state: the match backs off); the budgets evict KV and tombstone states
PROGRAM = [dict(op="reset", budget=1 << 40)] + req([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [2, 3]) + \
    req([1, 2, 3, 4, 5, 9]) + req([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 2, 3, 4]) + \
    [dict(op="set_budget", budget=200)] + req([2, 2]) + req([1, 2, 3, 4, 5, 9, 9]) + \
    [dict(op="set_budget", budget=40)] + req([1, 2, 3, 7, 7])
RULE = {"split-state": "S2", "no-fork": "S2", "state-leak": "A2", "mamba-counter": "A1", "no-backoff": "C1"}


def test_mamba_rules_cover_every_id():
    from targets.base import ALL_RULES
    from targets.sglang.rules_mamba import CAUSES, NOT_APPLICABLE, RULES
    assert set(RULES) | set(NOT_APPLICABLE) == set(ALL_RULES)
    assert set(RULES) <= set(CAUSES)


@pytest.mark.parametrize("fault", FAULTS)
def test_each_planted_mamba_fault_is_caught_by_its_rule(fault):
    assert RULE[fault] in {r for r, _ in replay(MambaTarget(FakeMambaApi(fault)), PROGRAM)}


def test_clean_mamba_fake_breaks_no_rule():
    assert replay(MambaTarget(FakeMambaApi(None)), PROGRAM) == []


def test_unknown_mamba_fault_is_refused():
    with pytest.raises(ValueError, match="unknown fault"):
        FakeMambaApi("nope")


def test_mamba_replay_names_where_a_program_stops(tmp_path):
    p = tmp_path / "C1.json"
    p.write_text(json.dumps(dict(rule="C1", ops=PROGRAM)))
    run = lambda fx: subprocess.run([sys.executable, "-m", "targets.sglang", "--cache", "mamba", "--replay", str(p),
                                     "--fixture", fx], capture_output=True, text=True)
    bad, good = run("no-backoff"), run("none")
    assert bad.returncode == 1 and "still reproduces" in bad.stdout
    assert good.returncode == 0 and "stops reproducing at Mamba fixture (none)" in good.stdout


def test_mamba_campaign_on_the_fixture_finds_shrinks_and_reports(tmp_path):
    from targets.sglang import machine, report
    c = machine.campaign(MambaTarget(FakeMambaApi("split-state")), 0.001, max_examples=400)
    assert "S2" in c.findings and c.findings["S2"].length <= 12
    out = report.write(tmp_path, c, "Mamba fixture (split-state)", "--cache mamba --fixture split-state",
                       rules_of="mamba")
    assert "MambaRadixCache._insert_helper" in out.read_text() and (tmp_path / "programs" / "S2.json").exists()


# ------------------------------------------------------------------ the real engine (optional)
SRC = os.environ.get("SGLANG_MAMBA_SRC", "")
HAVE = bool(SRC) and importlib.util.find_spec("torch") is not None


@pytest.mark.skipif(not HAVE, reason="SGLANG_MAMBA_SRC (an sglang 0.5.6 - 0.5.20 wheel or checkout: 0.5.23 has no "
                    "MambaRadixCache) and torch not given: targets/sglang/install.sh, then SGLANG_MAMBA_SRC=... "
                    "SGLANG_PYTHON=... ./dev python -m pytest")
def test_real_mamba_radix_cache_clean_program():
    from targets.sglang.mamba import load_mamba
    assert replay(MambaTarget(load_mamba(SRC)), PROGRAM) == []
