"""targets/sglang --cache req: SGLang's RadixCache through its own request calls (cache_unfinished_req,
cache_finished_req), with EAGLE bigram keys or not. The adapter, bigram view and rules on a
planted-fault fake (always); the saved findings (targets/sglang/findings/) on the SGLang named by
SGLANG_REQ_SRC (an unpacked 0.5.3 - 0.5.20 wheel or a checkout, loadable by this interpreter),
else skipped with the reason; each saved finding's exported pytest module compiles (always)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from targets.machine import replay
from targets.sglang.fixture_req import FakeReqApi
from targets.sglang.reqcalls import ReqTarget, bigrams, vkey


def req(keys, gen=()):
    return [dict(op="begin", keys=list(keys), spans=[]), dict(op="prefill", max_chunks=None),
            *[dict(op="step", key=k) for k in [keys[-1], *gen]], dict(op="close")]


RESET = [dict(op="reset", budget=1 << 40, chunk=3)]
SHARED = RESET + req([1, 2, 3, 4, 5, 6, 7], [2]) + req([1, 2, 3, 4, 5, 6, 7, 2, 9]) + req([1, 2, 3, 4, 8, 8]) + \
    req([1, 2, 3, 4])
CLEAN = SHARED + req([1, 2, 3, 7, 7]) + [dict(op="set_budget", budget=12)] + req([1, 2, 3, 4, 5, 6, 7, 2, 9, 9]) + \
    [dict(op="begin", keys=[1, 2, 9, 9, 9, 9, 9, 9], spans=[]), dict(op="prefill", max_chunks=1), dict(op="close"),
     dict(op="set_budget", budget=0)]
FINDINGS = sorted((Path(__file__).resolve().parents[2] / "targets" / "sglang" / "findings").glob("*.json"))


def test_bigram_keys():
    assert vkey((3, 4)) == 3004 and vkey(7) == 7 and bigrams([1, 2, 3]) == [1002, 2003]


def test_rules_cover_every_id():
    from targets.base import ALL_RULES
    for eagle in (False, True):
        t = ReqTarget(FakeReqApi(None), eagle=eagle)
        assert set(t.RULES) | set(t.NOT_APPLICABLE) == set(ALL_RULES) and not set(t.RULES) & set(t.NOT_APPLICABLE)


@pytest.mark.parametrize("eagle", [False, True])
def test_clean_fake_breaks_no_rule(eagle):
    assert replay(ReqTarget(FakeReqApi(None), eagle=eagle), CLEAN) == []


@pytest.mark.parametrize("fault,eagle", [("stale-protected", False), ("stale-protected", True), ("keep-tail", True)])
def test_each_planted_fault_is_caught(fault, eagle):
    """(keep-tail needs bigram keys: with token keys nothing lies past the inserted keys)"""
    assert "A2" in {r for r, _ in replay(ReqTarget(FakeReqApi(fault), eagle=eagle), SHARED)}


def test_campaign_on_the_fixture_finds_shrinks_and_exports(tmp_path):
    from targets.sglang import machine, report
    t = ReqTarget(FakeReqApi("stale-protected"), eagle=True)
    c = machine.campaign(t, 0.001, max_examples=400)
    assert "A2" in c.findings and c.findings["A2"].length <= 12
    out = report.write(tmp_path, c, "fixture (stale-protected)", "--cache req --eagle", target=t)
    text = (tmp_path / "programs" / "test_a2_sglang.py").read_text()
    assert "cache_finished_req" in out.read_text() and "PAGE, EAGLE, CHUNK = 1, True" in text
    compile(text, "test_a2_sglang.py", "exec")


@pytest.mark.parametrize("path", FINDINGS, ids=[p.stem for p in FINDINGS])
def test_each_saved_finding_exports_a_pytest_module(path):
    from targets.sglang import export_req, export_swa
    rec = json.loads(path.read_text())
    ex = export_swa if rec["cache"] == "swa" else export_req
    text = ex.export(rec["rule"], rec["found_on"], rec["message"], rec["ops"], rec["page_size"], eagle=rec["eagle"])
    compile(text, path.stem + ".py", "exec")
    assert "cache_finished_req" in text and f"PAGE, EAGLE, CHUNK" in text


def _src():
    src = os.environ.get("SGLANG_REQ_SRC")
    if not src:
        pytest.skip("SGLANG_REQ_SRC is not set: name an unpacked sglang 0.5.3 - 0.5.20 wheel (docs/peers.md, "
                    "SGLang) and run with its venv's python")
    return src


@pytest.mark.parametrize("path", FINDINGS, ids=[p.stem for p in FINDINGS])
def test_a_saved_finding_reproduces_on_its_version_only(path):
    """In a subprocess (one sglang per process): the program replayed by `--replay-one`."""
    src = _src()
    rec = json.loads(path.read_text())
    cmd = [sys.executable, "-m", "targets.sglang", "--replay-one", str(path), "--cache", rec["cache"],
           "--page-size", str(rec["page_size"]), "--src", src] + (["--eagle"] if rec.get("eagle") else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        pytest.skip(f"sglang at {src} does not load here: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    got = json.loads(line[7:])
    version = got["what"].split()[1]
    found = got["found"][str(path)]
    if version in rec["reproduces_on"]:
        assert rec["rule"] in found
    elif version in rec["fixed_on"]:
        assert found == []
    else:
        pytest.skip(f"sglang {version}: the finding names {rec['reproduces_on']} and {rec['fixed_on']}")
