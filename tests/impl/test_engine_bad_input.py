"""Bad input is refused before anything changes.

Each row of the table is one malformed request (or budget); it must raise impl.media.BadRequest with a
message naming the problem, and leave the Engine exactly as it was: dump_json() (ages aside), the
paged-out byte counter, the active path, the snapshots held (same objects, same lazy/owned state), and
the live caches (offsets, buffer objects and their contents). The Engine is warmed first with two
requests so that the trie has branches, lazy KV views and whole-state snapshots to disturb; after the
table, a normal request still passes C1. Validation does not depend on the model; the table runs on
qwen3next (recurrent + KV) and gemma3 (windowed + KV), whose tries hold every snapshot kind
(SmolLM2's would only add more lazy KV views, at ~30x the warm-up cost).
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from impl.engine import Engine, EngineThreadError
from impl.media import BadRequest, MediaItem
from test_engine_support import assert_c1, assert_same_state, engine_state, judged

CTX = 8192          # every model's context length (asserted below)


def _text(n, seed=0):
    return np.random.default_rng(seed).integers(1, 1000, n).tolist()


P = _text(20)
IMG = dict(data=b"img", dims=(2, 2))
CASES = [
    # (id, kwargs for generate (or a callable taking the engine), words the message must contain)
    ("empty prompt", dict(prompt=[]), ["empty prompt"]),
    ("bare string", dict(prompt="hello"), ["bare string"]),
    ("at context length", dict(prompt=[5] * CTX), ["context length", str(CTX)]),
    ("over context length", dict(prompt=[5] * (CTX + 7)), ["context length"]),
    ("negative id", dict(prompt=P[:5] + [-1] + P[5:]), ["-1", "position 5", "vocabulary"]),
    ("id = vocab", dict(prompt=P + [49152]), ["49152", "vocabulary"]),
    ("id > vocab", dict(prompt=[10 ** 9] + P), ["1000000000", "vocabulary"]),
    ("float id", dict(prompt=P[:3] + [3.0]), ["3.0", "vocabulary"]),
    ("str id", dict(prompt=P[:3] + ["7"]), ["'7'", "vocabulary"]),
    ("None id", dict(prompt=[None] + P), ["None", "vocabulary"]),
    ("bool id", dict(prompt=P + [True]), ["True", "vocabulary"]),
    ("numpy id = vocab", dict(prompt=[np.int64(t) for t in P] + [np.int64(49152)]), ["49152", "vocabulary"]),
    ("media overlap", dict(prompt=P, media=[MediaItem(2, 5, **IMG), MediaItem(6, 3, b"other")]), ["overlap"]),
    ("media length 0", dict(prompt=P, media=[MediaItem(3, 0, **IMG)]), ["length 0"]),
    ("media length < 0", dict(prompt=P, media=[MediaItem(3, -2, **IMG)]), ["length -2"]),
    ("media past prompt", dict(prompt=P, media=[MediaItem(15, 9, **IMG, causal=True)]), ["runs past", "20 tokens"]),
    ("media negative pos", dict(prompt=P, media=[MediaItem(-1, 3, **IMG)]), ["runs past"]),
    ("non-causal covers last", dict(prompt=P, media=[MediaItem(15, 5, **IMG)]), ["last position"]),
    ("max_tokens < 0", dict(prompt=P, max_tokens=-1), ["max_tokens", "-1"]),
    ("max_tokens float", dict(prompt=P, max_tokens=2.5), ["max_tokens"]),
    ("unknown role", dict(prompt=[{"role": "user", "content": "hi"}, {"role": "wizard", "content": "x"}]),
     ["unknown role", "wizard", "message 1"]),
    ("missing content", dict(prompt=[{"role": "user"}]), ["no text content"]),
    ("budget < 0", lambda e: e.set_budget(-1), ["budget", "-1"]),
    ("sampler not callable", dict(prompt=P, sampler="greedy"), ["sampler must be callable"]),
    ("cancel not callable", dict(prompt=P, cancel=True), ["cancel must be callable"]),
    ("media not a Media", dict(prompt=P, media=[(2, 3)]), ["not a Media"]),
    ("media float pos", dict(prompt=P, media=[MediaItem(1.5, 3, **IMG)]), ["position"]),
]


TABLE = [pytest.param(c, id=c[0]) for c in CASES]


@pytest.fixture(scope="module", params=["qwen3next", "gemma3"])
def warm(request):
    from impl.models import load

    lm = load(request.param)
    assert lm.context_length == CTX and lm.vocab_size == 49152
    e = judged(Engine(lm, chunk_size=8, capture_interval=8, check_rules=True))
    e.generate(_text(30, 1), 3, stop_at_eos=False)
    e.generate(_text(12, 1) + _text(10, 2), 2, stop_at_eos=False, media=[MediaItem(14, 4, b"pic", (1, 2))])
    return lm, e


@pytest.mark.parametrize("case", TABLE)
def test_bad_input_is_refused_and_changes_nothing(case, warm):
    _, call, words = case
    lm, e = warm
    before = engine_state(e)
    try:
        with pytest.raises(BadRequest) as info:
            if callable(call):
                call(e)
            else:
                e.generate(**{"max_tokens": 2, **call})
    finally:
        assert_same_state(before, engine_state(e))
    msg = str(info.value)
    for w in words:
        assert w in msg, f"message {msg!r} does not name {w!r}"


@pytest.mark.parametrize("call", ["generate", "set_budget"])
def test_a_call_from_another_thread_is_refused_and_changes_nothing(call, warm):
    """The engine's cached state lives on its first request's thread (mlx >= 0.32: one stream per
    thread); a request or an evicting budget from another thread is refused before it touches it."""
    lm, e = warm
    before = engine_state(e)
    raised = []

    def other():
        try:
            e.generate(P, 2) if call == "generate" else e.set_budget(0)
        except Exception as x:
            raised.append(x)

    t = threading.Thread(target=other, name="not-the-engines")
    t.start()
    t.join(120)
    assert_same_state(before, engine_state(e))
    assert len(raised) == 1 and isinstance(raised[0], EngineThreadError), raised
    assert "not-the-engines" in str(raised[0]) and "from one thread" in str(raised[0])


def test_engine_constructor_refuses_bad_budget_and_chunk(models):
    lm = models["mamba2"]
    with pytest.raises(BadRequest, match="budget -5 < 0"):
        Engine(lm, budget_bytes=-5)
    with pytest.raises(BadRequest, match="chunk size 0"):
        Engine(lm, chunk_size=0)


def test_numpy_token_ids_are_served_as_ints(warm):
    """Token ids may be numpy integers (a tokenizer's output): served exactly as the same plain ints."""
    _, e = warm
    prompt = _text(30, 1) + _text(5, 4)
    a = e.generate([np.int32(t) for t in prompt], 3, stop_at_eos=False)
    b = e.generate(prompt, 3, stop_at_eos=False)
    assert a.tokens == b.tokens and b.stats.resumed >= 30, (a.tokens, b.tokens, b.stats)


def test_still_serves_after_the_table(warm):
    lm, e = warm
    for _, call, _ in CASES:                       # the whole table once more, back to back
        with pytest.raises((BadRequest, AttributeError, TypeError)):
            call(e) if callable(call) else e.generate(**{"max_tokens": 2, **call})
    prompt = _text(30, 1) + _text(4, 3)
    r = e.generate(prompt, 3, stop_at_eos=False)
    assert r.stats.resumed >= 24, r.stats            # the warm-up's path is still there
    assert_c1(lm, prompt, [], r, what="after the bad-input table")
