"""bench.trie_scale at a tiny size: the output's shape (never its timings), and the benchmark's
workload under check=True, where every victim the incremental eviction order chooses is compared
with the walk over the trie (impl.invariants.assert_victim) and every rule is checked."""
from __future__ import annotations

import json

import pytest

from bench import trie_scale

KEYS = {"size", "nodes_min", "nodes_max", "requests", "evictions_per_request", "budget_bytes", "requests_before",
        "full_gc_ms", "first_request_ms"} | {
    f"{clock}_us_{figure}" for clock in ("cpu", "wall") for figure in ("median", "mean", "p90")}


@pytest.mark.parametrize("walk", [False, True])
def test_output_shape(walk, tmp_path, capsys):
    out = tmp_path / "scale.json"
    result = trie_scale.main(["--sizes", "20,60", "--requests", "6", "--json", str(out)] + ["--walk"] * walk)
    assert json.loads(out.read_text()) == result
    assert result["victims"] == ("walk" if walk else "order") and result["floor"] == 2.0
    assert [r["size"] for r in result["rows"]] == [20, 60]
    for r in result["rows"]:
        assert set(r) == KEYS and r["requests"] == 6
        assert r["evictions_per_request"] > 0                  # the budget is tight: eviction runs
        assert 0 < r["nodes_min"] <= r["nodes_max"] and r["wall_us_median"] > 0
    assert result["ratio_last_to_first"] == pytest.approx(
        result["rows"][-1]["cpu_us_mean"] / result["rows"][0]["cpu_us_mean"])
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| nodes (target) |") and len(table) == 2 + 2 + 1


def test_victims_are_the_walks_under_check():
    rows = trie_scale.measure([15, 40], 10, walk=False, seed=3, check=True)
    assert all(r["evictions_per_request"] > 0 for r in rows)


@pytest.mark.parametrize("argv, message", [(["--sizes", "100,10"], "ascending"), (["--sizes", "0"], "ascending"),
                                           (["--requests", "0"], "at least 1"),
                                           (["--sizes", "100,x"], "ascending")])
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        trie_scale.main(argv + ["--json", ""])
    assert message in capsys.readouterr().err
