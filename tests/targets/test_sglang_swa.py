"""targets/sglang/swa: SGLang's SWARadixCache adapter, its windowed view and rules, on a planted-fault
fake (always, no sglang or torch needed), and on SGLang's own SWARadixCache when a release that has it
is given (SGLANG_SWA_SRC: an unpacked wheel or checkout of 0.4.10 - 0.5.20, with sglang's torch venv:
targets/sglang/install.sh), else skipped with the reason."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from targets.machine import replay
from targets.sglang.fixture_swa import FAULTS, FakeSwaApi
from targets.sglang.swa import SwaTarget


def req(keys, gen=()):
    return [dict(op="begin", keys=list(keys), spans=[]), dict(op="prefill", max_chunks=0),
            *[dict(op="step", key=k) for k in [keys[-1], *gen]], dict(op="close")]


# budget 64 bytes = 16 tokens, the SWA pool half of it: the third request tombstones [1, 2, 3] (an
# internal node, least recently used after [4, 5, 6] is evicted), the fourth follows it again
TOMBSTONE = [dict(op="reset", budget=64)] + req([1, 2, 3, 4, 5, 6]) + req([1, 2, 3, 7, 8]) + req([9, 9, 9, 9]) + \
    req([1, 2, 3, 7, 8, 5])
RULE = {"tombstone-match": "C1", "swa-leak": "A2", "swa-counter": "A1"}
CLEAN = [dict(op="reset", budget=1 << 40)] + req([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [2, 3]) + \
    req([1, 2, 3, 4, 5, 9]) + req([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 2, 3, 4]) + \
    [dict(op="set_budget", budget=40)] + req([2, 2]) + \
    [dict(op="begin", keys=[1, 2, 3, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7], spans=[]), dict(op="prefill", max_chunks=1),
     dict(op="close"), dict(op="set_budget", budget=0)]


def test_swa_rules_cover_every_id():
    from targets.base import ALL_RULES
    from targets.sglang.rules_swa import CAUSES, NOT_APPLICABLE, RULES
    assert set(RULES) | set(NOT_APPLICABLE) == set(ALL_RULES)
    assert set(RULES) <= set(CAUSES)


@pytest.mark.parametrize("fault", FAULTS)
def test_each_planted_swa_fault_is_caught_by_its_rule(fault):
    assert RULE[fault] in {r for r, _ in replay(SwaTarget(FakeSwaApi(fault)), TOMBSTONE)}
    assert replay(SwaTarget(FakeSwaApi(None)), TOMBSTONE) == []


def test_clean_swa_fake_breaks_no_rule():
    assert replay(SwaTarget(FakeSwaApi(None)), CLEAN) == []


def test_unknown_fault_is_refused():
    with pytest.raises(ValueError, match="unknown fault"):
        FakeSwaApi("nope")


# ------------------------------------------------------------------ the real engine (optional)
SRC = os.environ.get("SGLANG_SWA_SRC", "")
HAVE = bool(SRC) and importlib.util.find_spec("torch") is not None
needs_swa = pytest.mark.skipif(not HAVE, reason="SGLANG_SWA_SRC (an sglang 0.4.10 - 0.5.20 wheel or checkout: "
                               "0.5.23 has no SWARadixCache) and torch not given: targets/sglang/install.sh, then "
                               "SGLANG_SWA_SRC=... SGLANG_PYTHON=... ./dev python -m pytest")


@needs_swa
def test_real_swa_radix_cache_clean_programs():
    from targets.sglang.swa import load_swa
    t = SwaTarget(load_swa(SRC))
    assert replay(t, CLEAN) == []
    assert replay(t, TOMBSTONE) == []


def test_swa_replay_names_where_a_program_stops(tmp_path):
    p = tmp_path / "C1.json"
    p.write_text(json.dumps(dict(rule="C1", ops=TOMBSTONE)))
    run = lambda fx: subprocess.run([sys.executable, "-m", "targets.sglang", "--cache", "swa", "--replay", str(p),
                                     "--fixture", fx], capture_output=True, text=True)
    bad, good = run("tombstone-match"), run("none")
    assert bad.returncode == 1 and "still reproduces" in bad.stdout
    assert good.returncode == 0 and "stops reproducing at SWA fixture (none)" in good.stdout


def test_swa_campaign_on_the_fixture_finds_shrinks_and_reports(tmp_path):
    from hypothesis import settings

    from targets.sglang import machine, report
    # One hunt, derandomised whatever the profile: a wrong counter can first show as an E1 overshoot
    # (eviction trusts the counter) in some random programs; this test is about finding, shrinking and
    # reporting the plant's own A1 (the dev profile drew E1 first in 3 of 6 runs)
    profile = settings._current_profile
    settings.load_profile("ci")
    try:
        c = machine.campaign(SwaTarget(FakeSwaApi("swa-counter")), 0.001, max_examples=400)
    finally:
        settings.load_profile(profile)
    assert "A1" in c.findings and c.findings["A1"].length <= 12
    out = report.write(tmp_path, c, "SWA fixture (swa-counter)", "--cache swa --fixture swa-counter", swa=True)
    assert "SWARadixCache inc_lock_ref" in out.read_text() and (tmp_path / "programs" / "A1.json").exists()
