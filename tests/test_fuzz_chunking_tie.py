"""The chunking ties of the fuzz oracle and the model machine (fuzz/oracle.py, chunking_tie) cannot
hide a wrong state.

A C1-logits mismatch is a tie only when the cold path (mlx-lm's stock caches; for media, a fresh
Engine's own forwards), cut where the request's forwards were cut, agrees with our logits and itself
differs from the one-forward cold run by more than tol. Where no cut moves the cold run by tol, a
planted error stays a failure; on deepseek_v32's recorded case
(fuzz/corpus/found-deepseek-v32-topk-chunking-tie.json, replayed by test_fuzz_corpus) it is a tie, and
so is the media prompt on which the model machine's nightly run once failed C1 (below). These run
the calibrated oracle (PREFIX_TRIE_C1=calibrated): it is the oracle wherever same-schedule replays are
not bit-identical, and this CPU's replays are.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import impl.media
from fuzz.calibrate import tolerance
from fuzz.cold import chunking_tie
from fuzz.oracle import ColdOracle, Runner
from impl.engine import Engine
from impl.models import load

SETTINGS = {"budget": 1 << 40, "chunk_size": 16, "capture_interval": 32, "near_end": 4}


@pytest.fixture(autouse=True)
def calibrated_oracle(monkeypatch):
    monkeypatch.setenv("PREFIX_TRIE_C1", "calibrated")


@pytest.mark.parametrize("error", [0.25, 1e-3])
def test_a_planted_logit_error_on_a_continuous_model_is_no_tie(error):
    lm = load("qwen3next")
    runner = Runner(lm, SETTINGS, ColdOracle())
    try:
        tokens = list(range(300, 363))
        r = runner.engine.generate(tokens[:30], 1, stop_at_eos=False)
        r = runner.engine.generate(tokens, 1, stop_at_eos=False)
        assert r.stats.resumed > 0 and r.stats.chunks
        cold = runner.oracle.get(lm, tokens, [], 1)
        first = np.array(r.first_logits.astype(mx.float32))
        assert np.abs(first - cold.logits).max() <= runner.tol          # the honest state passes C1
        planted = first.copy()
        planted[int(np.argmax(planted))] += error
        assert chunking_tie(lm, tokens, [], r, planted, runner.tol) is None
    finally:
        runner.close()


def _media_case(lm):
    """The model machine's nightly failure (2026-12-05), replayed: after these requests, a prompt with a
    2-position non-causal media item resumes at 1 and prefills in cuts [1, 2, 4, 7]; its first logits
    differ from a fresh one-forward prefill by 7.2e-5 against a tol of 6.7e-5, and equal a fresh
    chunk-1 prefill's exactly. qwen3next routes each token to the top experts, so float noise from
    where a forward is cut can move its logits past the tolerance calibrated on text probes."""
    e = Engine(lm, check_rules=True, chunk_size=8, capture_interval=16, near_end=4)

    def req(tokens, n, media=(), cancel_after=None):
        calls = [0]

        def cancel():
            calls[0] += 1
            return cancel_after is not None and calls[0] > cancel_after
        return e.generate(list(tokens), max_tokens=n, media=list(media), cancel=cancel, stop_at_eos=False)

    conv = [1000] * 4
    conv += req(conv, 3).tokens
    req(conv[:-2], 1)
    req(conv + [1000, 1000, 1011, 1000, 1000, 1000, 1000, 1000], 2, cancel_after=0)
    req(conv[:-2], 1)
    req(conv[:24], 2)
    media = [impl.media.MediaItem(2, 2, b"\xe8\x1d", (2,), False)]
    tokens = conv[:2] + [999, 999, 1009, 1006, 1008, 1007]
    return tokens, media, req(tokens, 2, media=media)


def test_a_media_prompt_without_one_cold_answer_is_a_tie_and_a_planted_error_is_not():
    lm = load("qwen3next")
    tokens, media, r = _media_case(lm)
    tol = tolerance(lm)
    cold = Engine(lm, chunk_size=4096, capture_interval=0, near_end=0).generate(
        list(tokens), max_tokens=1, media=media, stop_at_eos=False)
    first = np.array(r.first_logits.astype(mx.float32))
    diff = float(np.abs(first - np.array(cold.first_logits.astype(mx.float32))).max())
    if diff <= tol:
        pytest.skip(f"this platform's cold path agrees with itself here ({diff:.3g} <= tol {tol:.3g})")
    tie = chunking_tie(lm, tokens, media, r, first, tol)
    assert tie is not None and tie["ours_vs_cut"] <= tol < tie["one_forward_vs_cut"], tie
    planted = first.copy()
    planted[int(np.argmax(planted))] += 1e-3
    assert chunking_tie(lm, tokens, media, r, planted, tol) is None
