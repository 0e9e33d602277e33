"""targets/watch.py and targets/watch_merge.py: the nightly's watch on the peers, without any peer.

The merge over small generated results (a new finding, a saved finding that stopped, a failed target,
a target with no result), its bad-input errors (exit 2, naming the file), the reading of each target's
replay output, the sorting of hunt violations into new and known, and the workflow's matrix.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from targets import watch
from targets.watch_merge import FORMAT, MERGED

ROOT = Path(__file__).resolve().parent.parent


def result(target, status="ok", new=(), saved=(), version="1.0", reason=None, hunt=True):
    return {"format": FORMAT, "target": target, "status": status, "reason": reason,
            "peer": {"version": version, "source": "PyPI latest release"},
            "hunt": {"minutes": 25, "seconds": 1500.0, "exit": 0, "violations": len(new), "rules": [],
                     "line": "done"} if hunt else None,
            "new": list(new), "known": [], "saved": list(saved)}


def write(d: Path, rec: dict) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "result.json").write_text(json.dumps(rec))
    return d


@pytest.fixture
def three(tmp_path):
    a = write(tmp_path / "peer-mlx-lm-7", result("mlx-lm", version="0.33.1", saved=[
        {"finding": "E1-bytes-limit-not-passed.json", "rule": "E1", "status": "stopped",
         "detail": "E1-bytes-limit-not-passed.json: fixed upstream in 0.33.1"},
        {"finding": "C2-one-token-prefix.json", "rule": "C2", "status": "reproduces", "detail": ""}]))
    b = write(tmp_path / "peer-sglang-7", result("sglang", version="0.5.30", new=[
        {"rule": "S1", "name": "S1", "program": "programs/S1.json", "message": "served a stale page"}]))
    rc = watch.main(["failed", "vllm", "--out", str(tmp_path / "peer-vllm-7"), "--reason", "install failed"])
    assert rc == 0
    return tmp_path, [a, b, tmp_path / "peer-vllm-7"]


def test_merge_reports_new_stopped_and_failed(three, capsys):
    tmp, dirs = three
    out = tmp / "summary"
    rc = watch.main(["merge", *map(str, dirs), "--out", str(out), "--expect", "mlx-lm,sglang,vllm,ollama"])
    assert rc == 1                                   # vllm failed, ollama has no result
    m = json.loads((out / "summary.json").read_text())
    assert m["format"] == MERGED
    assert [(v["target"], v["rule"], v["program"]) for v in m["new"]] == [("sglang", "S1", "programs/S1.json")]
    assert [(s["target"], s["finding"], s["fixed_in"]) for s in m["stopped"]] == \
        [("mlx-lm", "E1-bytes-limit-not-passed.json", "0.33.1")]
    assert {f["target"]: f["reason"] for f in m["failed"]} == {
        "vllm": "install failed", "ollama": "no result uploaded (the job ended before writing one)"}
    md = (out / "summary.md").read_text()
    assert "`E1-bytes-limit-not-passed.json` (E1): fixed upstream in mlx-lm 0.33.1" in md
    assert "**sglang** 0.5.30: S1 `S1` (programs/S1.json): served a stale page" in md
    assert "**vllm** (not installed): install failed" in md
    row = next(l for l in md.splitlines() if l.startswith("| mlx-lm "))
    assert "| 1 / 1 / 0 of 2 |" in row


def test_merge_all_ran_nothing_new_exits_0(tmp_path):
    d = write(tmp_path / "r", result("ollama", version="main@abc1234 (2026-12-05)", saved=[
        {"finding": "fb30760/E1.json", "rule": "E1", "status": "reproduces", "detail": ""}]))
    assert watch.main(["merge", str(d / "result.json"), "--out", str(tmp_path / "o")]) == 0
    md = (tmp_path / "o" / "summary.md").read_text()
    assert md.count("None.") == 3                    # no new, no stopped, no failed


@pytest.mark.parametrize("content, why", [
    ("{not json", "not JSON"),
    (json.dumps({"format": "prefix-trie-fuzz-report/1"}), "expected 'prefix-trie-peer-watch/1'"),
    (json.dumps({**result("vllm"), "saved": [{"finding": "x.json", "status": "gone"}]}), "lacks a finding name"),
    (json.dumps({k: v for k, v in result("vllm").items() if k != "peer"}), "field 'peer' missing"),
])
def test_merge_bad_input_exits_2_naming_the_file(tmp_path, capsys, content, why):
    f = tmp_path / "peer-x" / "result.json"
    f.parent.mkdir()
    f.write_text(content)
    assert watch.main(["merge", str(f.parent), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and why in err


def test_merge_bad_arguments_exit_2(tmp_path, capsys):
    assert watch.main(["merge", str(tmp_path / "absent"), "--out", str(tmp_path / "o")]) == 2
    assert "absent: no such file" in capsys.readouterr().err
    write(tmp_path / "r", result("vllm"))
    assert watch.main(["merge", str(tmp_path / "r"), "--out", str(tmp_path / "o"), "--expect", "vlm"]) == 2
    assert "--expect vlm: not a target" in capsys.readouterr().err
    assert watch.main(["merge", "--out", str(tmp_path / "o")]) == 2
    assert watch.main(["merge", str(tmp_path / "r"), str(tmp_path / "r"), "--out", str(tmp_path / "o")]) == 2
    assert "a second result for vllm" in capsys.readouterr().err
    assert watch.main(["run", "ollama", "--out", str(tmp_path / "o")]) == 2      # no --src
    assert "needs --src" in capsys.readouterr().err


def test_replay_output_of_each_target(tmp_path):
    lm = watch.saved_findings("mlx-lm")
    out = "\n".join([f"{lm[0].name}: reproduces (found on mlx-lm 0.32.2, installed 0.33.0)",
                     f"{lm[1].name}: fixed upstream in 0.33.0 (found on mlx-lm 0.32.2, installed 0.33.0)"])
    out += f"\n{lm[2].name}: does not reproduce (found on mlx-lm 0.32.2, installed 0.32.2)"
    got = watch.replay_verdicts("mlx-lm", out, lm)
    assert [got[f.name][0] for f in lm[:3]] == ["reproduces", "stopped", "error"] and len(got) == 3

    vlm = watch.saved_findings("mlx-vlm")
    got = watch.replay_verdicts("mlx-vlm", f"{vlm[0].name}: reproduces: C1 ...\n{vlm[1].name}: does not reproduce", vlm)
    assert [got[f.name][0] for f in vlm[:2]] == ["reproduces", "stopped"]

    ol = watch.saved_findings("ollama")
    e1 = next(f for f in ol if f.name == "E1.json")
    out = f"check-ollama: {e1}: E1 not reproduced\ncheck-ollama: {ol[0]}: {watch._rule(ol[0])} still broken: x"
    got = watch.replay_verdicts("ollama", out, ol)
    assert got["fb30760/E1.json"][0] == "stopped" and got[watch._name("ollama", ol[0])][0] == "reproduces"

    vl = watch.saved_findings("vllm")
    lines = [json.dumps({"program": str(vl[0]), "version": "0.40.0", "rules": [watch._rule(vl[0])], "error": None}),
             json.dumps({"program": str(vl[1]), "version": "0.40.0", "rules": [], "error": None}),
             json.dumps({"program": str(vl[2]), "version": "0.40.0", "rules": [], "error": "KeyError: x"})]
    got = watch.replay_verdicts("vllm", "{stray warning text\n" + "\n".join(lines), vl)
    assert [got[f.name][0] for f in vl] == ["reproduces", "stopped", "error"]

    progs = []
    for rule in ("S1", "PANIC", "E1"):
        p = tmp_path / f"{rule}.json"
        p.write_text(json.dumps({"rule": rule, "ops": []}))
        progs.append(p)
    found = {str(progs[0]): ["S1"], str(progs[1]): ["PANIC: KeyError: 3"], str(progs[2]): ["C2"]}
    got = watch.replay_verdicts("sglang", "noise\nRESULT " + json.dumps({"what": "sglang 0.5.30", "found": found}),
                                progs)
    assert [got[p.name][0] for p in progs] == ["reproduces", "reproduces", "stopped"]


def test_hunt_violations_new_and_known(tmp_path):
    saved = watch.saved_findings("mlx-lm")
    progs = tmp_path / "hunt" / "programs"
    progs.mkdir(parents=True)
    (progs / "C1-trim-partial.json").write_text(json.dumps({"rule": "C1", "message": "m"}))
    (progs / "E1-other-cause.json").write_text(json.dumps({"rule": "E1"}))
    (progs / "M2-new.json").write_text(json.dumps({"rule": "M2", "message": "media"}))
    (progs / "E3.json").write_text(json.dumps({"rule": "E3"}))          # named by the rule alone
    (progs / "S9-broken.json").write_text("{truncated")
    (progs / "C1-trim-partial_repro.py").write_text("")
    new, known = watch.hunt_violations("mlx-lm", tmp_path / "hunt", saved, tmp_path / "out")
    assert [(v["rule"], v["program"]) for v in new] == [("E1", "programs/E1-other-cause.json"),
                                                        ("M2", "programs/M2-new.json"),
                                                        ("S9", "programs/S9-broken.json")]
    assert {v["name"]: v["known_as"] for v in known} == {"C1-trim-partial": "C1-trim-partial.json",
                                                         "E3": "E3-fetch-not-a-use.json"}
    assert (tmp_path / "out" / "programs" / "M2-new.json").exists()
    assert not (tmp_path / "out" / "programs" / "C1-trim-partial_repro.py").exists()


def test_findings_folder_may_be_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(watch, "ROOT", tmp_path)
    assert watch.saved_findings("sglang") == []


def test_workflow_matrix_is_every_target():
    wf = (ROOT / ".github" / "workflows" / "nightly-fuzz.yml").read_text()
    m = re.search(r"target: \[([^\]]*)\]", wf)
    assert m and sorted(x.strip() for x in m[1].split(",")) == sorted(watch.TARGETS)
    assert "--expect " + ",".join(x.strip() for x in m[1].split(",")) in wf


def test_recorded_fixed_findings_are_apart(tmp_path):
    """vLLM's findings record the release that fixed them (`fixed_on`): stopping there is no news, and
    reproducing again is a regression upstream."""
    assert watch._recorded_fixed(watch.saved_findings("vllm")[0]) == "0.26.0"
    assert watch._recorded_fixed(watch.saved_findings("mlx-lm")[0]) is None
    d = write(tmp_path / "r", result("vllm", version="0.40.0", saved=[
        {"finding": "C1-hybrid-eagle.json", "rule": "C1", "status": "stopped", "recorded_fixed": "0.26.0"},
        {"finding": "S1-hybrid-eagle.json", "rule": "S1", "status": "reproduces", "recorded_fixed": "0.26.0"}]))
    assert watch.main(["merge", str(d), "--out", str(tmp_path / "o")]) == 0
    m = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert m["stopped"] == [] and [s["finding"] for s in m["still_fixed"]] == ["C1-hybrid-eagle.json"]
    assert [s["finding"] for s in m["again"]] == ["S1-hybrid-eagle.json"]
    md = (tmp_path / "o" / "summary.md").read_text()
    assert "vllm `C1-hybrid-eagle.json` (fixed in 0.26.0)" in md
    assert "`S1-hybrid-eagle.json` (S1): recorded fixed in 0.26.0, reproduces on 0.40.0" in md


def test_run_with_a_peer_that_cannot_run_writes_a_failed_result(tmp_path, capsys):
    """An interpreter that fails at once (/bin/false): the result says failed with the reason, and every
    saved finding is "error" (not judged), never "stopped"."""
    assert watch.main(["run", "mlx-vlm", "--python", "/bin/false", "--out", str(tmp_path), "--minutes", "1"]) == 1
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["status"] == "failed" and r["reason"] == "hunt exit 1 and no report.md: (no output)"
    assert r["peer"]["version"] == "not installed"
    assert {s["status"] for s in r["saved"]} == {"error"} and len(r["saved"]) == len(watch.saved_findings("mlx-vlm"))
    assert (tmp_path / "hunt.log").read_text().startswith("$ /bin/false -m targets.mlx_vlm check")
    assert watch.main(["run", "vllm", "--python", "/bin/false", "--out", str(tmp_path / "v"), "--minutes", "1"]) == 1
    assert json.loads((tmp_path / "v" / "result.json").read_text())["reason"] == "hunt exit 1: (no output)"


def test_ollama_version_is_the_checkouts_commit(tmp_path):
    import subprocess
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert watch.peer_version("ollama", "", str(tmp_path)).startswith(f"main@{head} (")
    assert watch.peer_version("ollama", "", str(tmp_path / "none")) == "unknown commit"


def test_latest_release_from_pypi_json(monkeypatch, capsys):
    import io
    import urllib.error
    import urllib.request
    asked = []

    def fake(url, timeout):
        asked.append(url)
        if "absent" in url:
            raise urllib.error.HTTPError(url, 404, "Not Found", {}, None)
        return io.BytesIO(json.dumps({"info": {"version": "0.5.31"}}).encode())
    monkeypatch.setattr(urllib.request, "urlopen", fake)
    assert watch.main(["latest", "sglang"]) == 0
    assert capsys.readouterr().out == "0.5.31\n" and asked == ["https://pypi.org/pypi/sglang/json"]
    assert watch.main(["latest", "absent-pkg"]) == 2
    assert "latest absent-pkg: no version from https://pypi.org/pypi/absent-pkg/json (HTTPError" in capsys.readouterr().err


def test_hollow_tier_hunts_against_mlx_lms_findings_and_replays_none(tmp_path):
    """mlx-lm-hollow runs `check --hollow` on the mlx-lm install, sorts its violations against mlx-lm's
    saved findings, and leaves their replay to the mlx-lm row (no second replay, no replay.log)."""
    saved = watch.saved_findings("mlx-lm-hollow")
    assert saved and saved == watch.saved_findings("mlx-lm")
    assert watch.main(["run", "mlx-lm-hollow", "--python", "/bin/false", "--out", str(tmp_path), "--minutes", "1"]) == 1
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["target"] == "mlx-lm-hollow" and r["status"] == "failed" and r["saved"] == []
    assert (tmp_path / "hunt.log").read_text().startswith("$ /bin/false -m targets.mlx_lm check --hollow --minutes 1")
    assert not (tmp_path / "replay.log").exists()
    progs = tmp_path / "hunt" / "programs"
    progs.mkdir(parents=True)
    (progs / "C1-trim-partial.json").write_text(json.dumps({"rule": "C1"}))
    (progs / "M2-new.json").write_text(json.dumps({"rule": "M2"}))
    new, known = watch.hunt_violations("mlx-lm-hollow", tmp_path / "hunt", saved, tmp_path / "out")
    assert [v["name"] for v in new] == ["M2-new"]
    assert [(v["name"], v["known_as"]) for v in known] == [("C1-trim-partial", "C1-trim-partial.json")]
