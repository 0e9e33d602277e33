"""targets/sglang/unified_swa: SGLang 0.5.23's UnifiedRadixCache with its SWA component (Full + SWA, Full +
SWA + Mamba) through its own request calls, on a planted-fault fake (always, no sglang or torch needed)
and on SGLang's own cache when SGLANG_UNIFIED_SRC names 0.5.23 (an unpacked wheel or checkout, with
sglang's torch venv: targets/sglang/install.sh), else skipped with the reason."""
from __future__ import annotations

import importlib.util
import os

import pytest

from targets.machine import replay
from targets.sglang.fixture_unified_swa import FAULTS, FakeUnifiedSwaApi
from targets.sglang.unified_swa import UnifiedSwaTarget
from tests.targets.test_sglang_swa import CLEAN, RULE, TOMBSTONE


def test_unified_swa_rules_cover_every_id():
    from targets.base import ALL_RULES
    from targets.sglang.rules_unified_swa import CAUSES, NOT_APPLICABLE, RULES
    assert set(RULES) | set(NOT_APPLICABLE) == set(ALL_RULES) and set(RULES) <= set(CAUSES)


@pytest.mark.parametrize("fault", FAULTS)
def test_each_window_fault_is_caught_through_the_unified_calls(fault):
    assert RULE[fault] in {r for r, _ in replay(UnifiedSwaTarget(FakeUnifiedSwaApi(fault)), TOMBSTONE)}


def test_clean_unified_swa_fake_breaks_no_rule():
    assert replay(UnifiedSwaTarget(FakeUnifiedSwaApi(None)), TOMBSTONE) == []
    assert replay(UnifiedSwaTarget(FakeUnifiedSwaApi(None)), CLEAN) == []


def test_unified_swa_campaign_on_the_fixture_finds_and_shrinks(tmp_path):
    from targets.sglang import machine, report
    # one Hypothesis run of up to 400 examples whatever the machine's load (not a time budget); the
    # leak needs a tombstone, so its shrunk program is 6 - 18 operations depending on the example found
    c = machine.campaign(UnifiedSwaTarget(FakeUnifiedSwaApi("swa-leak")), 0.001, max_examples=400)
    assert "A2" in c.findings and c.findings["A2"].length <= 20
    out = report.write(tmp_path, c, "unified SWA fixture (swa-leak)", "--cache unified --components full,swa "
                       "--fixture swa-leak", rules_of="unified_swa")
    assert "UnifiedRadixCache" in out.read_text() and (tmp_path / "programs" / "A2.json").exists()


SRC = os.environ.get("SGLANG_UNIFIED_SRC", "")


@pytest.mark.skipif(not SRC or importlib.util.find_spec("torch") is None,
                    reason="SGLANG_UNIFIED_SRC (sglang 0.5.23) and torch not given: targets/sglang/install.sh, then "
                    "SGLANG_UNIFIED_SRC=... SGLANG_PYTHON=... ./dev python -m pytest")
@pytest.mark.parametrize("mamba", [False, True])
def test_real_unified_swa_clean_programs(mamba):
    from targets.sglang.unified_swa import load_unified_swa
    t = UnifiedSwaTarget(load_unified_swa(SRC, mamba=mamba))
    assert replay(t, CLEAN) == []
    assert replay(t, TOMBSTONE) == []
