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
    verdict = machine.replay_status(rec, version("mlx-lm"))
    if verdict.startswith("fixed upstream"):
        pytest.skip(f"{verdict} (found on {rec['mlx_lm_version']})")
    assert verdict == "reproduces", f"{path.name}: {verdict} on mlx-lm {version('mlx-lm')}, the version it was found on"


def test_a_finding_gone_on_a_newer_version_is_fixed_upstream():
    rec = json.loads(FINDINGS[0].read_text())
    clean = {**rec, "program": {**rec["program"], "ops": [[[1, 2], [3], False, 0]]}}   # breaks nothing
    assert machine.replay_status(clean, "9.9.9") == "fixed upstream in 9.9.9"
    assert machine.replay_status({**clean, "mlx_lm_version": "9.9.9"}, "9.9.9") == "does not reproduce"
