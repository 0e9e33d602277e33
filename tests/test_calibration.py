"""The C1 oracles separate noise from wrong states (fuzz/replay.py, fuzz/calibrate.py, fuzz/planted.py).

Exact oracle, wherever same-schedule replays are bit-identical here: every planted wrong state that
applies differs from the unplanted state built by the same forwards, including one_row, whose effect
is of the order of the chunking noise (below the calibrated tolerance on some models).
Calibrated oracle, on this device in float32 on every small model: every planted wrong state of the
original set (positions shifted by one, KV from another conversation, a stale sliding window, a
recurrent state from the wrong offset, a split non-causal media item) moves the first logits by at
least MARGIN (5) x the calibrated tolerance. In half precision on the hybrids (cheap here): every such
state is flagged by the logits, by the greedy tokens at a non-tie step, or by the float32 recheck.
"""
from __future__ import annotations

import pytest

from fuzz import calibrate
from fuzz.calibrate_report import MARGIN, float32_margins, plant_rows, run
from fuzz.replay import replay_is_exact
from impl.models import load

APPLIES = {"smollm2": {"shift", "other_conv", "media_split", "one_row"},
           "gemma3": {"shift", "other_conv", "stale_window", "media_split", "one_row"},
           "qwen3next": {"shift", "other_conv", "recurrent_off", "media_split", "one_row"},
           "mamba2": {"other_conv", "recurrent_off"}}
BELOW_NOISE = {"one_row"}        # planted to sit at the noise: only the exact oracle must flag it


@pytest.mark.parametrize("name", ["gemma3", "qwen3next", "mamba2", "smollm2"])
def test_every_planted_state_flagged_by_the_exact_oracle(name):
    lm = load(name, "float32")
    if not replay_is_exact(lm):
        pytest.skip(f"same-schedule replays of {name} are not bit-identical on this backend: C1 is calibrated here")
    rows = plant_rows(lm, calibrate.calibration(lm))
    assert {r["plant"] for r in rows} == APPLIES[name]
    missed = [(r["plant"], r["exact_diff"]) for r in rows if not r["by_exact"]]
    assert not missed, f"{name}: planted states equal to the same-schedule cold run: {missed}"


@pytest.mark.parametrize("name", ["gemma3", "qwen3next", "mamba2", "smollm2"])
def test_float32_planted_states_flagged_by_the_logits(name):
    lm = load(name, "float32")
    cal = calibrate.calibration(lm)
    rows = [r for r in plant_rows(lm, cal) if r["plant"] not in BELOW_NOISE]
    assert {r["plant"] for r in rows} == APPLIES[name] - BELOW_NOISE
    weak = [(r["plant"], r["max"], round(r["margin"], 1)) for r in rows if r["margin"] < MARGIN]
    if weak and calibrate.needs_recheck(lm):       # TF32: the float32 recheck on the CPU is the oracle
        f32, dev = float32_margins(name)
        weak = [w for w in weak if f32[w[0]] < MARGIN]
    assert not weak, f"{name} on {cal.device}: planted states within {MARGIN} x tol {cal.tol:.3g}: {weak}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_planted_states_flagged_by_some_oracle(dtype):
    res = run(["gemma3", "qwen3next"] if dtype == "bfloat16" else ["gemma3"], [dtype])
    for e in res:
        assert {r["plant"] for r in e["plants"]} == APPLIES[e["model"]]
        missed = [r["plant"] for r in e["plants"] if r["verdict"] == "NOT SEPARATED" and r["plant"] not in BELOW_NOISE]
        assert not missed, f"{e['model']} {dtype}: no oracle flags {missed}"
        for r in e["plants"]:
            if r["verdict"] == "float32 recheck":
                assert r["f32_margin"] >= MARGIN


def test_calibration_formula_and_cache():
    lm = load("mamba2", "float32")
    cal = calibrate.calibration(lm)
    assert calibrate.calibration(lm) is cal                      # once per (model, device, dtype)
    assert cal.device == calibrate.device_key() and cal.dtype == "float32"
    k = calibrate.K_TF32 if "+tf32" in cal.device else calibrate.K
    assert cal.k == k
    assert cal.tol == max(k * cal.noise, calibrate.FLOOR * calibrate.EPS["float32"] * cal.scale)
    assert cal.tie == max(calibrate.TIE_MIN, 2 * cal.tol)
    assert cal.noise == max(p[2] for p in cal.probes) and len(cal.probes) >= 30
    assert cal.confidence >= 0.95                                # max of N exceeds the 0.9-quantile
    if cal.device == "cpu":
        assert cal.tol < 1e-3                                    # float32 on the CPU: chunking noise < 1e-4


def test_the_oracle_flags_a_state_beyond_tolerance(monkeypatch):
    """The campaign's Runner fails a request whose logits differ from the cold run by more than the
    calibrated tolerance: a cold oracle answering for another prompt stands in for a wrong state."""
    monkeypatch.setenv("PREFIX_TRIE_C1", "calibrated")
    from fuzz.oracle import ColdOracle, Failure, Runner
    from fuzz.cases import resolve_settings

    lm = load("qwen3next", "float32")
    oracle = ColdOracle()
    toks = list(range(100, 140))
    wrong = oracle.get(lm, list(range(200, 240)), [], 2)
    oracle.cache[(lm.name, "float32", tuple(toks), ())] = wrong
    runner = Runner(lm, resolve_settings(lm), oracle)
    runner._quiet_checks = lambda rec: None     # MEM counts the whole test process's arrays; C1 only here
    try:
        with pytest.raises(Failure) as ei:
            runner.run({"op": "generate", "tokens": toks, "max_tokens": 2}, 0)
        assert ei.value.signature in ("C1-logits", "C1-tokens")
    finally:
        runner.close()
