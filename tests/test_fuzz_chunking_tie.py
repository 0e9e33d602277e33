"""The fuzz oracle's chunking ties (fuzz/oracle.py, Runner._chunking_tie) cannot hide a wrong state.

A C1-logits mismatch is a tie only when mlx-lm's stock caches, cut where the request's forwards were
cut, agree with our logits and themselves differ from the one-forward cold run by more than tol.
On a model whose logits are continuous in the float noise of where a forward is cut (qwen3next), no
cut moves the cold run by tol, so a planted error stays a failure; on deepseek_v32's recorded case
(fuzz/corpus/found-deepseek-v32-topk-chunking-tie.json, replayed by test_fuzz_corpus) it is a tie.
"""
from __future__ import annotations

import numpy as np
import pytest

from fuzz.oracle import ColdOracle, Runner
from impl.models import load

SETTINGS = {"budget": 1 << 40, "chunk_size": 16, "capture_interval": 32, "near_end": 4}


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
        first = np.array(r.first_logits)
        assert np.abs(first - cold.logits).max() <= runner.tol          # the honest state passes C1
        planted = first.copy()
        planted[int(np.argmax(planted))] += error
        assert runner._chunking_tie(tokens, [], r, planted, cold) is None
    finally:
        runner.close()
