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
from tests.targets.test_sglang_swa import CLEAN, RULE, req

# test_sglang_swa's TOMBSTONE with its tombstones made by a set_budget at rest: the unified driver applies
# the SWA part of the budget at set_budget and before a decode step's allocation, not at close
TOMBSTONE = [dict(op="reset", budget=64)] + req([1, 2, 3, 4, 5, 6]) + req([1, 2, 3, 7, 8]) + req([9, 9, 9, 9]) + \
    [dict(op="set_budget", budget=64)] + req([1, 2, 3, 7, 8, 5])

# found by a 10-minute run on 0.5.23 (Full + SWA), shrunk: the second close's checkpoint splits
# [5, 1, 5, 6, 1] at 2 (the tail keeps its SWA slots); a tombstone of that tail by the budget in the same
# close read, to S4, as the split taking the window off the tail
SPLIT_THEN_TOMBSTONE = [dict(op="reset", budget=64), dict(op="begin", keys=[5, 1, 5, 6, 1, 2], spans=[]),
                        dict(op="prefill", max_chunks=1), *[dict(op="step", key=k) for k in (2, 5, 2)],
                        dict(op="close"), *req([5, 1], [6])]


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


def test_no_swa_tombstone_in_the_close_that_splits():
    # the old driver (the SWA budget at close) breaks S4 here on the fake as on SGLang
    assert replay(UnifiedSwaTarget(FakeUnifiedSwaApi(None)), SPLIT_THEN_TOMBSTONE) == []


def test_unified_swa_finding_shrinks_and_is_reported(tmp_path):
    # deterministic: the directed program reduced by the campaign's minimize, then the campaign's report
    from targets.machine import minimize
    from targets.report import Campaign, Finding
    from targets.sglang import report
    t = UnifiedSwaTarget(FakeUnifiedSwaApi("swa-leak"))
    ops = minimize(t, TOMBSTONE, "A2")
    assert len(ops) <= 12 and "A2" in {r for r, _ in replay(t, ops)}
    c = Campaign("sglang-unified-swa", ("kv",), 0.0, findings={"A2": Finding("A2", "kv", 0.0, "leak", ops)})
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
    assert replay(t, SPLIT_THEN_TOMBSTONE) == []
