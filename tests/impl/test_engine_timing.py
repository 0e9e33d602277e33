"""What a Result's times count (impl/engine.py): the first token's time split into the forwards before it,
the bookkeeping before it and the rest, which bench.scale's limit report reads (bench/limit.py, gap_parts)."""
from __future__ import annotations

import gc
import time

import pytest

import impl.engine as engine_module
from impl.engine import Engine


@pytest.fixture(scope="module")
def hybrid(models):
    return models["qwen3next"]


def slowed(monkeypatch, e: Engine, forward_s: float, begin_s: float) -> list:
    """Every model forward takes `forward_s` longer and every begin `begin_s` longer; returns the count
    of forwards made."""
    n, forward, begin = [0], engine_module.forward, e.pc.begin

    def slow_forward(*a, **k):
        n[0] += 1
        time.sleep(forward_s)
        return forward(*a, **k)

    def slow_begin(*a, **k):
        time.sleep(begin_s)
        return begin(*a, **k)

    monkeypatch.setattr(engine_module, "forward", slow_forward)
    monkeypatch.setattr(e.pc, "begin", slow_begin)
    return n


def test_the_first_tokens_time_splits_into_its_forwards_its_bookkeeping_and_the_rest(hybrid, monkeypatch):
    """With one token to produce, every forward comes before it: ttft_forward_s is forward_s, and only
    close's bookkeeping follows it. A forward made slower shows in ttft_forward_s, a begin made slower in
    ttft_bookkeeping_s, each alone; what is left of ttft_s is small and not negative."""
    e = Engine(hybrid, chunk_size=16, capture_interval=1 << 20, near_end=0)
    e.generate(list(range(1, 30)), max_tokens=1, stop_at_eos=False)       # compiled, warm
    n = slowed(monkeypatch, e, forward_s=0.08, begin_s=0.2)
    gc.disable()                         # (a collection's pause would land in the rest)
    try:
        r = e.generate(list(range(1, 70)), max_tokens=1, stop_at_eos=False)
    finally:
        gc.enable()
    assert n[0] >= 3, n                                                    # chunks and the seed
    assert r.ttft_forward_s == r.forward_s >= 0.08 * n[0]
    assert 0.2 <= r.ttft_bookkeeping_s < r.bookkeeping_s                  # close comes after the token
    other = r.ttft_s - r.ttft_forward_s - r.ttft_bookkeeping_s
    assert 0 <= other < 0.06, (r.ttft_s, r.ttft_forward_s, r.ttft_bookkeeping_s)   # no slowed part in it
    assert r.ttft_forward_s <= r.ttft_s - 0.2      # the slow begin lies outside the forwards (whatever they take)


def test_decode_steps_after_the_first_token_are_not_in_its_split(hybrid, monkeypatch):
    """With more tokens, the decode steps' forwards follow the first token: ttft_forward_s falls short of
    forward_s by at least their added time."""
    e = Engine(hybrid, chunk_size=16, capture_interval=1 << 20, near_end=0)
    e.generate(list(range(1, 30)), max_tokens=1, stop_at_eos=False)
    n = slowed(monkeypatch, e, forward_s=0.05, begin_s=0.0)
    r = e.generate(list(range(1, 70)), max_tokens=5, stop_at_eos=False)
    assert r.forward_s - r.ttft_forward_s >= 4 * 0.05                       # the 4 steps after the first
    assert r.ttft_forward_s >= 0.05 * (n[0] - 4)
