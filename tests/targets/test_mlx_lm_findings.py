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


@pytest.mark.parametrize("cmd", [["replay"], ["check", "--minutes", "0.01"]])
def test_an_mlx_lm_without_the_server_prompt_cache_is_refused_in_one_line(cmd, monkeypatch, capsys):
    """mlx-lm before 0.32 keeps its LRUPromptCache in mlx_lm/server.py, which the adapter does not drive:
    check and replay say so in one line (exit 2) instead of an ImportError traceback."""
    import mlx_lm.models.cache as cache_module

    from targets.mlx_lm.__main__ import main

    monkeypatch.delattr(cache_module, "LRUPromptCache")
    assert main(cmd) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no mlx_lm.models.cache.LRUPromptCache" in err[0] and "0.32.2" in err[0], err
