"""serve/decoding.py: the seeded sampler and stop strings, alone."""
from __future__ import annotations

import numpy as np
import pytest

from serve.decoding import StopMatcher, make_sampler


def test_temperature_zero_or_absent_is_greedy():
    assert make_sampler(None, 1) is None and make_sampler(0, 1) is None


def test_one_seed_one_sequence_and_temperature_shapes_the_choice():
    logits = np.log(np.array([[[0.1, 0.2, 0.3, 0.4]]]))

    def draw(seed, t=1.0, n=200):
        sample = make_sampler(t, seed)
        return [sample(logits) for _ in range(n)]

    assert draw(3) == draw(3) and draw(3) != draw(4)
    counts = np.bincount(draw(5, n=4000), minlength=4) / 4000
    assert np.allclose(counts, [0.1, 0.2, 0.3, 0.4], atol=0.03), counts
    assert set(draw(5, t=0.01, n=50)) == {3}                 # near zero: the argmax


@pytest.mark.parametrize("pieces,stops,shown,stopped", [
    (["Hello", " wor", "ld"], ["world"], "Hello ", True),
    (["Hel", "lo wo", "rk"], ["world"], "Hello work", False),     # held back, then released
    (["a<", "|end", "|>b"], ["<|end|>"], "a", True),
    (["abc"], [], "abc", False),
    (["xSTOPy"], ["STOP", "y"], "x", True),                     # the first one found ends it
])
def test_stop_strings(pieces, stops, shown, stopped):
    m = StopMatcher(stops)
    out = "".join(m.push(p) for p in pieces) + m.flush()
    assert out == shown == m.text and m.stopped is stopped


def test_text_that_may_start_a_stop_string_is_held_back():
    m = StopMatcher(["</s>"])
    assert m.push("ok </") == "ok " and m.pending == "</"
    assert m.push("p>") == "</p>"
