"""One bug, one fix for vLLM and SGLang (targets/onefix.py, targets/vllm/onefix.py,
targets/sglang/onefix.py; issue 50).

Always (no peer needed, well under a second): the substitution refuses text it does not find exactly
once, with the file named; a copy is built from a source directory with the edits applied and the
original untouched; every saved finding names a fix; the identity check flags a test that passes off
its own fix or fails on it. Where the peer is available, the real table: VLLM_ONEFIX_SRC (an unpacked
vLLM 0.25.0, e.g. `./dev check-vllm release 0.25.0`) or SGLANG_ONEFIX_SRC (an unpacked sglang 0.5.5),
run by an interpreter that imports the peer (VLLM_PYTHON / SGLANG_PYTHON of docs/peers.md); else
skipped with that reason. About 2 and 4 minutes on 2 shared cores.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from targets import onefix
from targets.sglang import onefix as sgl
from targets.vllm import onefix as vl


def test_a_substitution_that_no_longer_matches_is_refused():
    with pytest.raises(ValueError, match=r"pkg/a\.py: the text to replace occurs 0 times"):
        onefix.substitute("x = 1\n", "x = 2\n", "y\n", "pkg/a.py")
    with pytest.raises(ValueError, match="occurs 2 times"):
        onefix.substitute("x = 1\nx = 1\n", "x = 1\n", "y\n", "pkg/a.py")
    assert onefix.substitute("a\nx = 1\nb\n", "x = 1\n", "x = 2\n", "f") == "a\nx = 2\nb\n"


def _fake_release(root: Path, text: str) -> Path:
    (root / "vllm" / "v1" / "core").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / vl.COORD).write_text(text)
    return root


def test_build_applies_the_fix_to_a_copy_and_refuses_a_release_whose_text_moved(tmp_path, capsys):
    (old, new), = [(o, n) for _, o, n in vl.FIXES["mamba-no-eagle-margin"]]
    src = _fake_release(tmp_path / "rel", "def f():\n" + old + "                    pass\n")
    out = onefix.build(src, "vllm", tmp_path / "copy", vl.FIXES["mamba-no-eagle-margin"])
    assert new in (out / "vllm" / vl.COORD).read_text()
    assert old in (src / "vllm" / vl.COORD).read_text()          # the release itself is untouched
    moved = _fake_release(tmp_path / "moved", old.replace("if drop_eagle_block:", "if drop_eagle_block :"))
    with pytest.raises(ValueError, match="kv_cache_coordinator.py: the text to replace occurs 0 times"):
        onefix.build(moved, "vllm", tmp_path / "copy2", vl.FIXES["mamba-no-eagle-margin"])
    with pytest.raises(FileNotFoundError, match="no sglang package"):
        onefix.build(src, "sglang", tmp_path / "copy3", [])
    assert vl.main(str(tmp_path / "run"), str(moved)) == 2                 # no copy, no table: one line, status 2
    assert "occurs 0 times" in capsys.readouterr().err


def test_every_saved_finding_names_a_fix_and_every_fix_a_finding():
    for mod in (vl, sgl):
        recs = mod.findings()
        assert recs and {mod.FIX_OF[s] for s in recs} == set(mod.FIXES)


def test_the_identity_check_flags_a_test_passing_off_its_fix_or_failing_on_it():
    tab = {"a": {"stock": "fails", "fa": "passes", "fb": "fails"},
           "b": {"stock": "passes", "fa": "fails", "fb": "error: x"}}
    assert onefix.check_identity(tab, {"a": "fa", "b": "fb"}) == [("b", "stock", "passes"), ("b", "fb", "error: x")]
    assert "| a | fails | **passes** | fails |" in onefix.markdown(tab)


@pytest.mark.parametrize("mod,env", [(vl, "VLLM_ONEFIX_SRC"), (sgl, "SGLANG_ONEFIX_SRC")], ids=["vllm", "sglang"])
def test_each_fixed_copy_passes_its_own_findings_only(mod, env, tmp_path, capsys):
    src = os.environ.get(env)
    if not src:
        pytest.skip(f"{env} is not set: name an unpacked vLLM {vl.AFFECTED} / sglang {sgl.AFFECTED} and run with an "
                    "interpreter that imports it (docs/peers.md)")
    assert mod.main(str(tmp_path), src) == 0, capsys.readouterr().out
