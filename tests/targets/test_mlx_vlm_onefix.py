"""One bug, one fix for mlx-vlm (targets/mlx_vlm/onefix.py): every saved finding names a fix and a test;
each fix's text applies exactly once to the installed mlx-vlm; a fixed copy makes its own finding's
test pass and leaves another's failing. Runs where mlx-vlm is importable
(MLXVLM_PYTHON's venv: targets/mlx_vlm/install.sh), else skipped with the reason."""
from __future__ import annotations

import importlib.util

import pytest

from targets.mlx_vlm import onefix

HAVE_MLX_VLM = importlib.util.find_spec("mlx_vlm") is not None
needs_mlx_vlm = pytest.mark.skipif(not HAVE_MLX_VLM, reason="mlx-vlm is not installed here: run "
                                   "targets/mlx_vlm/install.sh and the tests with MLXVLM_PYTHON")


def test_every_finding_names_a_known_fix_and_an_existing_test():
    for stem, rec in onefix.findings().items():
        assert rec["fix"] in onefix.FIXES, stem
        file, name = rec["test"].split("::")
        assert f"def {name}(" in (onefix.FINDINGS / file).read_text(), stem
    assert set(onefix.FIXES) <= {rec["fix"] for rec in onefix.findings().values()}


def test_identity_check_flags_a_test_passing_on_another_fix():
    recs = {"a": {"fix": "x"}, "b": {"fix": "y"}}
    good = {"a": {"stock": "fails", "x": "passes", "y": "fails"}, "b": {"stock": "fails", "x": "fails", "y": "passes"}}
    assert onefix.check_identity(good, recs) == []
    bad = {"a": good["a"], "b": {"stock": "fails", "x": "passes", "y": "passes"}}
    assert onefix.check_identity(bad, recs) == [("b", "x", "passes")]


@needs_mlx_vlm
def test_a_fix_whose_text_is_missing_is_refused(tmp_path, monkeypatch):
    monkeypatch.setitem(onefix.FIXES, "nowhere", [(onefix.GENERATION, "text mlx-vlm does not have", "")])
    with pytest.raises(ValueError, match="occurs 0 times"):
        onefix.build("nowhere", tmp_path)


@needs_mlx_vlm
def test_a_fixed_copy_fixes_its_own_bug_only(tmp_path):
    """The image fix's copy: the image finding's test fails on the installed mlx-vlm (0.7.10) and
    passes on the copy; the video finding's test still fails there. (The whole table, every test on
    every copy, takes minutes: `MLXVLM_PYTHON=... ./dev check-mlx-vlm onefix`, in docs/peers.md.)"""
    recs = onefix.findings()
    where, copy = onefix.scripts(tmp_path), onefix.build("image-dims-not-in-key", tmp_path)
    image, video = recs["C1-image-dims-not-in-key-checkpoint"]["test"], recs["C1-video-dims-not-in-key-checkpoint"]["test"]
    assert onefix.run_test(image, where, None) == "fails"
    assert onefix.run_test(image, where, copy) == "passes"
    assert onefix.run_test(video, where, copy) == "fails"
