"""targets/sglang/unified: SGLang 0.5.23's UnifiedRadixCache (Full + Mamba components) driven through
match_prefix / lock / checkpoint / free_kv_row / unlock / on_release, on a planted-fault fake (always, no
sglang or torch needed) and on SGLang's own cache when SGLANG_UNIFIED_SRC names 0.5.23 or 0.5.15 (0.5.15:
cache_*_req, targets/sglang/unified_legacy.py; an unpacked wheel or checkout, with sglang's torch venv:
targets/sglang/install.sh, install_overlay.sh for 0.5.15), else skipped with the reason."""
from __future__ import annotations

import importlib.util
import os

import pytest

from targets.machine import replay
from targets.sglang.fixture_unified import FAULTS, FakeUnifiedApi
from targets.sglang.unified import UnifiedTarget
from tests.targets.test_sglang_mamba import PROGRAM, RULE


def test_unified_rules_cover_every_id():
    from targets.base import ALL_RULES
    from targets.sglang.rules_unified import CAUSES, NOT_APPLICABLE, RULES
    assert set(RULES) | set(NOT_APPLICABLE) == set(ALL_RULES) and set(RULES) <= set(CAUSES)


@pytest.mark.parametrize("fault", FAULTS)
def test_each_planted_fault_is_caught_through_the_unified_calls(fault):
    assert RULE[fault] in {r for r, _ in replay(UnifiedTarget(FakeUnifiedApi(fault)), PROGRAM)}


def test_clean_unified_fake_breaks_no_rule():
    assert replay(UnifiedTarget(FakeUnifiedApi(None)), PROGRAM) == []


def test_unified_campaign_on_the_fixture_finds_and_shrinks(tmp_path):
    from targets.sglang import machine, report
    c = machine.campaign(UnifiedTarget(FakeUnifiedApi("split-state")), 0.001, max_examples=400)
    assert "S2" in c.findings and c.findings["S2"].length <= 12
    out = report.write(tmp_path, c, "unified fixture (split-state)", "--cache unified --fixture split-state",
                       rules_of="unified")
    assert "UnifiedRadixCache/MambaComponent" in out.read_text()


SRC = os.environ.get("SGLANG_UNIFIED_SRC", "")


@pytest.mark.skipif(not SRC or importlib.util.find_spec("torch") is None,
                    reason="SGLANG_UNIFIED_SRC (sglang 0.5.23) and torch not given: targets/sglang/install.sh, then "
                    "SGLANG_UNIFIED_SRC=... SGLANG_PYTHON=... ./dev python -m pytest")
def test_real_unified_radix_cache_clean_program():
    from targets.sglang.unified import load_unified
    from targets.sglang.unified_legacy import LegacyUnifiedTarget, has_legacy_unified, load_legacy_unified
    t = LegacyUnifiedTarget(load_legacy_unified(SRC)) if has_legacy_unified(SRC) else UnifiedTarget(load_unified(SRC))
    assert replay(t, PROGRAM) == []
