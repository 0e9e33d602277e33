"""Full collections in the benchmarks. bench.gc_pauses at a tiny size: with the runner's collector
installed no full collection runs inside a request, at idle (gaps) or past the backstop (no gaps); the
rows' shape. Python's thresholds are lowered and the process's older objects frozen meanwhile, so that
full collections come within a few hundred requests. bench.scale: none inside a timed request."""
from __future__ import annotations

import gc

import pytest

from bench import gc_pauses


@pytest.fixture
def frequent_full_collections():
    saved = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50, 2, 2)
    try:
        yield
    finally:
        gc.set_threshold(*saved)
        gc.unfreeze()


@pytest.mark.parametrize("policy", ["idle", "busy"])
def test_with_the_collector_full_passes_run_between_requests_only(frequent_full_collections, policy):
    r = gc_pauses.measure(40, 300, policy, backstop=1)
    assert r["passes_between"] > 0, r
    assert r["passes_inside"] == 0 and r["longest_inside_ms"] == 0, r
    assert gc.get_threshold() == (50, 2, 2), "the collector was left installed"


def test_rows_and_table(frequent_full_collections, tmp_path):
    out = tmp_path / "g.json"
    result = gc_pauses.main(["--sizes", "30", "--requests", "50", "--json", str(out)])
    assert [r["policy"] for r in result["rows"]] == list(gc_pauses.POLICIES)
    for r in result["rows"]:
        assert r["requests"] == 50 and r["median_ms"] <= r["p99_ms"] <= r["p999_ms"] <= r["max_ms"]
        assert r["nodes"] > 0
    assert out.exists()


@pytest.mark.parametrize("argv, needle", [(["--sizes", "x"], "--sizes"), (["--requests", "0"], "--requests"),
                                          (["--policies", "python,never"], "--policies")])
def test_bad_arguments_name_what_is_wrong(argv, needle, capsys):
    with pytest.raises(SystemExit):
        gc_pauses.main(argv + ["--json", ""])
    assert needle in capsys.readouterr().err


def test_scale_runs_full_collections_between_requests_only(tmp_path):
    """bench.scale times requests as a runner serves them (serve/collector.py): with Python's thresholds
    lowered so that full collections come every few requests, none starts inside ours' Engine.generate
    or the limit's timed forwards, and some run between requests; the thresholds are restored."""
    import gc
    import json
    import sys

    from bench import scale

    inside = []

    def note(phase, info):
        if phase != "start" or info["generation"] != 2:
            return
        f = sys._getframe()
        while f is not None:
            if (f.f_code.co_name, f.f_code.co_filename.rsplit("/", 1)[-1]) in {("generate", "engine.py"),
                                                                                 ("time", "limit.py")}:
                inside.append(f.f_code.co_name)
            f = f.f_back

    saved = gc.get_threshold()
    gc.set_threshold(50, 2, 2)
    gc.callbacks.append(note)
    try:
        assert scale.main(["--smoke", "--arch", "llama", "--runner", "ours", "--runner", "limit",
                           "--conversations", "2", "--turns", "2", "--report", str(tmp_path)]) == 0
        assert gc.get_threshold() == (50, 2, 2), "bench.scale left the collector installed"
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*saved)
    rep = json.loads((tmp_path / "scale-llama-smoke-smoke-ours-limit.json").read_text())
    assert inside == [], f"full collections started inside timed requests: {inside}"
    assert rep["gc"]["passes"]["idle"] > 0 and not rep["gc"]["installed"], rep["gc"]
