"""Saved findings (targets/mlx_lm/findings/*.json) replay: on the version they were found on each
reproduces with its rule and cause; on a newer mlx-lm one that no longer reproduces is reported as
fixed upstream (skipped with that message), never failed."""
import json
from importlib.metadata import version

import pytest

from targets.mlx_lm import machine
from targets.mlx_lm.report import FINDINGS_DIR
from targets.mlx_lm.rules import RULES

FINDINGS = sorted(FINDINGS_DIR.glob("*.json"))


def test_there_are_saved_findings():
    assert len({json.loads(p.read_text())["rule"] for p in FINDINGS}) >= 3


@pytest.mark.parametrize("path", FINDINGS, ids=[p.stem for p in FINDINGS])
def test_saved_finding_replays(path):
    rec = json.loads(path.read_text())
    assert rec["rule"] in RULES and len(rec["program"]["ops"]) <= 10
    installed = version("mlx-lm")
    if machine.reproduces(rec):
        return
    if installed != rec["mlx_lm_version"]:
        pytest.skip(f"fixed upstream in {installed} (found on {rec['mlx_lm_version']})")
    pytest.fail(f"{path.name} no longer reproduces on mlx-lm {installed}, the version it was found on")
