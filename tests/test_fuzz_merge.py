"""fuzz/merge.py merges the reports of a sharded campaign (the nightly's merge job).

The shard reports in tests/data/fuzz_shards/ are real campaign output, checked in (a campaign takes
15-45 s here, too slow for this test): summary.json and cases/ as `python -m fuzz` wrote them with
fuzz/ at b29410f (the two SmolLM2 shards on the shared working tree, whose impl/ then held other
uncommitted work; the mamba2 shard on a clean `git archive b29410f` copy plus the plant):

  smollm2-seed1, smollm2-seed2   ./dev fuzz --requests 3 --model smollm2 --seed 1|2 --report DIR --no-progress
  mamba2-seed3-planted           ./dev fuzz --requests 4 --case-len 4 --model mamba2 --seed 3 --report DIR
                                 --no-progress --shrink-seconds 20, on a copy of the tree whose
                                 impl/caches/recurrent.py restores `a * 1.001` instead of `a` (a planted
                                 wrong restore): one real C1-exact failure, shrunk, with its case file

test_the_fixtures_have_the_format_the_campaign_writes keeps them honest: every field the merge reads is
one fuzz.campaign.ModelStats or fuzz/report.py writes under the format tag they carry.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz import merge

ROOT = Path(__file__).resolve().parents[1]
SHARDS = ROOT / "tests" / "data" / "fuzz_shards"
CLEAN = [SHARDS / "smollm2-seed1", SHARDS / "smollm2-seed2"]
PLANTED = SHARDS / "mamba2-seed3-planted"


def _run(*args: str):
    """python -S: no site-packages, as the merge job has none (standard library only)."""
    return subprocess.run([sys.executable, "-S", "-m", "fuzz.merge", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_two_clean_shards_merge_per_model(tmp_path):
    p = _run(*map(str, CLEAN), "--out", str(tmp_path / "m"))
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads((tmp_path / "m" / "summary.json").read_text())
    shards = [json.loads((d / "summary.json").read_text()) for d in CLEAN]
    assert rep["format"] == merge.MERGED
    assert [s["shard"] for s in rep["shards"]] == ["smollm2-seed1", "smollm2-seed2"]
    assert [s["seed"] for s in rep["shards"]] == [1, 2]
    m = rep["per_model"]["smollm2"]
    for k in ("requests", "checks", "prefilled", "reused", "ideal", "no_cache", "cases"):
        assert m[k] == sum(s["per_model"]["smollm2"][k] for s in shards), k
    assert m["requests"] == 6 and m["shards"] == 2 and m["failures"] == 0
    assert m["ideal"] <= m["prefilled"] <= m["no_cache"]
    assert m["max_paged_out"] == max(s["per_model"]["smollm2"]["max_paged_out"] for s in shards)
    assert rep["totals"]["requests"] == 6 and rep["failures"] == [] and not (tmp_path / "m" / "cases").exists()
    md = (tmp_path / "m" / "summary.md").read_text()
    assert "2 shards merged" in md and "No failures." in md and "| smollm2 | 2 | cpu | exact | 6 |" in md


def test_a_failing_shard_brings_its_case_and_exit_1(tmp_path):
    out = tmp_path / "m"
    p = _run(*map(str, CLEAN), str(PLANTED), "--out", str(out))
    assert p.returncode == 1, p.stdout + p.stderr
    rep = json.loads((out / "summary.json").read_text())
    assert set(rep["per_model"]) == {"smollm2", "mamba2"}
    assert rep["per_model"]["mamba2"]["failures"] == 1 and rep["totals"]["failures"] == 1
    (f,) = rep["failures"]
    assert (f["model"], f["signature"], f["shard"], f["seed"]) == ("mamba2", "C1-exact", "mamba2-seed3-planted", 3)
    # the campaign recorded the path it ran with (/tmp/...); the copy sits under the merged report
    assert f["shard_case"].startswith("/tmp/") and f["case"] == "cases/mamba2-seed3-planted/mamba2-C1-exact-1.json"
    case = json.loads((out / f["case"]).read_text())
    assert case["format"] == "prefix-trie-fuzz-case/1" and case["model"] == "mamba2"
    assert case == json.loads((PLANTED / "cases" / "mamba2-C1-exact-1.json").read_text())
    md = (out / "summary.md").read_text()
    assert "**1 failures**" in md and "**mamba2 C1-exact** (shard mamba2-seed3-planted, seed 3, cpu)" in md
    assert "cases/mamba2-seed3-planted/mamba2-C1-exact-1.json" in md
    assert "FAILURE mamba2 C1-exact" in p.stdout


def test_a_failure_whose_case_file_is_gone_is_shown_missing(tmp_path):
    shard = tmp_path / "shard"
    shard.mkdir()
    (shard / "summary.json").write_text((PLANTED / "summary.json").read_text())     # no cases/
    rep = merge.merge([shard], tmp_path / "m")
    assert rep["failures"][0]["case"] is None
    assert "**case file missing**" in (tmp_path / "m" / "summary.md").read_text()


def test_largest_c1_differences_rank_by_ratio_to_the_tolerance(tmp_path):
    """Exact-oracle shards pass only at 0 (none listed); calibrated ones are ranked by diff / tol."""
    dirs = []
    for i, (diff, tol) in enumerate([(2e-5, 1e-4), (3e-5, 5e-5), (1e-6, None)]):
        rep = json.loads((CLEAN[0] / "summary.json").read_text())
        s = rep["per_model"]["smollm2"]
        s["max_c1_diff"] = diff
        if tol:
            s["c1_oracle"], s["calibration"] = "calibrated", {"tol": tol}
        d = tmp_path / f"s{i}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps(rep))
        dirs.append(d)
    rep = merge.merge(dirs, tmp_path / "m", top=2)
    assert [(r["shard"], r["ratio"]) for r in rep["largest_c1"]] == [("s1", pytest.approx(0.6)),
                                                                     ("s0", pytest.approx(0.2))]
    assert rep["per_model"]["smollm2"]["max_c1_diff"] == 3e-5
    assert rep["per_model"]["smollm2"]["max_c1_diff_shard"] == "s1"
    assert "| s1 | smollm2 | 1 | cpu | calibrated | 3e-05 | 5e-05 | 0.60 |" in (tmp_path / "m" / "summary.md").read_text()
    assert merge.merge(CLEAN, tmp_path / "e")["largest_c1"] == []


def test_a_directory_that_is_not_a_report_is_a_clear_error(tmp_path):
    empty = tmp_path / "not-a-report"
    empty.mkdir()
    p = _run(str(CLEAN[0]), str(empty), "--out", str(tmp_path / "m"))
    assert p.returncode == 2 and not (tmp_path / "m").exists()
    assert f"{empty} is not a fuzz report: it has no summary.json" in p.stderr, p.stderr
    p = _run(str(tmp_path / "nowhere"), "--out", str(tmp_path / "m"))
    assert p.returncode == 2 and "nowhere: no such directory" in p.stderr
    other = tmp_path / "calibration"
    other.mkdir()
    (other / "summary.json").write_text(json.dumps({"format": "prefix-trie-calibration/1"}))
    p = _run(str(other), "--out", str(tmp_path / "m"))
    assert p.returncode == 2 and "format 'prefix-trie-calibration/1', expected" in p.stderr
    (other / "summary.json").write_text("{ not json")
    p = _run(str(other), "--out", str(tmp_path / "m"))
    assert p.returncode == 2 and "summary.json: not JSON" in p.stderr
    rep = json.loads((CLEAN[0] / "summary.json").read_text())
    del rep["per_model"]["smollm2"]["max_c1_diff"]
    (other / "summary.json").write_text(json.dumps(rep))
    with pytest.raises(merge.MergeError, match=r"per_model\['smollm2'\] lacks max_c1_diff"):
        merge.load_shard(other)


def test_skip_invalid_lists_what_it_did_not_merge(tmp_path):
    empty = tmp_path / "fuzz-report-macos-14-s3-9"       # a shard killed before it wrote its report
    (empty / "cases").mkdir(parents=True)
    p = _run(str(CLEAN[0]), str(empty), "--out", str(tmp_path / "m"), "--skip-invalid")
    assert p.returncode == 0, p.stderr
    rep = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert [x["dir"] for x in rep["not_merged"]] == [str(empty)] and len(rep["shards"]) == 1
    assert "**Not merged**" in (tmp_path / "m" / "summary.md").read_text()
    p = _run(str(empty), "--out", str(tmp_path / "n"), "--skip-invalid")
    assert p.returncode == 2 and "no shard report to merge (1 invalid)" in p.stderr


def test_same_directory_names_stay_apart(tmp_path):
    a, b = tmp_path / "a" / "r", tmp_path / "b" / "r"
    for d in (a, b):
        d.mkdir(parents=True)
        (d / "summary.json").write_text((CLEAN[0] / "summary.json").read_text())
    assert [s["shard"] for s in merge.merge([a, b], tmp_path / "m")["shards"]] == ["r", "r~2"]


def test_the_fixtures_have_the_format_the_campaign_writes():
    from fuzz.campaign import ModelStats

    fields = {f.name for f in dataclasses.fields(ModelStats)}
    assert set(merge.SUMMED + merge.MAXED) <= fields
    assert f'"format": "{merge.FORMAT}"' in (ROOT / "fuzz" / "report.py").read_text()
    for d in [*CLEAN, PLANTED]:
        rep = merge.load_shard(d)
        for s in rep["per_model"].values():
            assert set(s) >= fields - {"kinds"} | {"requests_per_min", "c1_oracle", "series"}


def test_each_shard_row_names_the_blas_kernels_its_report_recorded(tmp_path):
    import shutil
    shard = tmp_path / "avx512"                     # a shard written since the report records the kernels
    shutil.copytree(CLEAN[0], shard)
    rep = json.loads((shard / "summary.json").read_text())
    rep["blas"] = {"openblas_core": "SkylakeX", "coretype_mismatch": None}
    (shard / "summary.json").write_text(json.dumps(rep))
    p = _run(str(shard), str(CLEAN[1]), "--out", str(tmp_path / "m"))
    assert p.returncode == 0, p.stdout + p.stderr
    merged = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert [s["cpu_blas"] for s in merged["shards"]] == ["SkylakeX", None]
    md = (tmp_path / "m" / "summary.md").read_text()
    assert "| avx512 | 1 | cpu | float32 | OpenBLAS SkylakeX |" in md and "| smollm2-seed2 | 2 | cpu | float32 | - |" in md
