"""Whole-state caches (windowed, recurrent) on synthetic arrays, masks, spans and the factory.

- WindowedCache is step-for-step mlx-lm's RotatingKVCache(keep=0): buffers and masks are compared
  exactly against the stock class over random write sequences.
- Restore/merge/split rules of S2/S4/P1 and the capture-at-boundary rule, each with its error.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import KVCache as StockKV
from mlx_lm.models.cache import RotatingKVCache

from impl.caches import (
    CacheError,
    KVCache,
    MergeError,
    RecurrentCache,
    WindowedCache,
    live_snapshots,
)
from impl.caches.masks import span_mask

H, D = 2, 4


def kv_rows(start, n, gen=1):
    pos = mx.arange(start, start + n, dtype=mx.float32) + gen * 1000
    k = mx.broadcast_to(pos[None, None, :, None], (1, H, n, D)) + mx.array([0.0, 0.5])[None, :, None, None]
    return k, -k


@pytest.fixture(autouse=True)
def no_leaks():
    base = live_snapshots()
    yield
    assert live_snapshots() == base, "A2: snapshots leaked"


def _eq(a, b):
    if isinstance(a, str) or a is None:
        return a == b
    return isinstance(b, mx.array) and a.shape == b.shape and bool(mx.all(a == b).item())


@settings(max_examples=max(20, settings.default.max_examples // 2))
@given(
    window=st.integers(2, 9),
    writes=st.lists(st.integers(1, 12), min_size=1, max_size=12),
    mask_window=st.sampled_from([None, "same", "smaller"]),
)
def test_windowed_is_stock_rotating_cache(window, writes, mask_window):
    ours, stock = WindowedCache(window, layer=0), RotatingKVCache(max_size=window, keep=0)
    ws = {None: None, "same": window, "smaller": max(1, window - 1)}[mask_window]
    for n in writes:
        for ra in (False, True):
            assert _eq(ours.make_mask(n, window_size=ws, return_array=ra), stock.make_mask(n, window_size=ws, return_array=ra))
        k, v = kv_rows(ours.offset, n)
        ko, vo = ours.update_and_fetch(k, v)
        ks, vs = stock.update_and_fetch(k, v)
        ours.finish_forward(n)
        assert ours.offset == stock.offset
        assert _eq(ko, ks) and _eq(vo, vs)


def test_windowed_restore_rules():
    W = 6
    c = WindowedCache(W, layer=1)
    c.update_and_fetch(*kv_rows(0, 4))
    c.finish_forward(4)
    s4 = c.snapshot(0)
    assert (s4.kind, s4.start, s4.end) == ("windowed", 4, 4) and s4.size == 4 * 2 * H * D * 4
    # unwrapped: live rewind works
    assert c.can_restore(None, 2) and c.restore(None, 2) and c.offset == 2
    c.update_and_fetch(*kv_rows(2, 7))  # wraps (offset 9 > W)
    c.finish_forward(7)
    s9 = c.snapshot(3)
    assert s9.size == W * 2 * H * D * 4  # holds only the window
    assert not c.restore(None, 5)  # wrapped: cannot rewind live
    assert c.restore(None, 9)  # t == offset is a no-op
    # restore an unwrapped snapshot and rewind inside it
    assert c.restore(s4, 3) and c.offset == 3
    k, _ = c.keys_and_values()
    np.testing.assert_array_equal(np.array(k), np.array(kv_rows(0, 3)[0]))
    # a wrapped snapshot restores only at its end
    assert not c.restore(s9, 8)
    assert c.restore(s9, 9) and c.offset == 9
    # merge keeps the newer state, split leaves it on the tail
    with pytest.raises(MergeError, match="^G1:"):
        c.merge_snapshots(s9, s4)
    h, t = c.split(s4, 2)
    assert h is None and t is s4
    with pytest.raises(CacheError):
        c.split(s4, 4)
    m = c.merge_snapshots(s4, s9)
    assert m is s9 and s4.closed
    assert c.merge_snapshots(s9, None) is None and s9.closed
    assert c.restore(None, 0) and c.offset == 0 and c.keys is None


def test_windowed_captures_only_at_write_boundaries():
    c = WindowedCache(4, layer=0)
    c.prepare_captures([0, 3, 5])
    assert c.captures_inside(6) == [3, 5]
    with pytest.raises(CacheError, match="3"):
        c.update_and_fetch(*kv_rows(0, 6))
    assert c.offset == 0  # refused before any change
    c.update_and_fetch(*kv_rows(0, 3))
    c.finish_forward(3)
    c.update_and_fetch(*kv_rows(3, 2))
    c.finish_forward(2)
    caps = c.take_captures()
    assert caps[0] is None and caps[1].end == 3 and caps[2].end == 5
    # the capture at 3 restores exactly what a cache that stopped at 3 holds
    d = WindowedCache(4, layer=0)
    assert d.restore(caps[1], 3)
    np.testing.assert_array_equal(np.array(d.keys_and_values()[0]), np.array(kv_rows(0, 3)[0]))
    for s in caps[1:]:
        s.release()


def test_recurrent_rules():
    c = RecurrentCache(2, layer=2)
    assert c.snapshot(0) is None  # nothing to page out yet
    c.prepare_captures([0, 2, 5])
    c[0] = mx.ones((1, 3, 4))
    c[1] = mx.zeros((1, 2, 4, 4))
    c.advance(2)
    c.finish_forward(2)
    assert c.offset == 2
    with pytest.raises(CacheError, match="5"):
        c.finish_forward(4)  # a forward that jumped over the scheduled 5
    caps = c.take_captures()
    assert caps[0] is None and caps[1].end == 2 and caps[1].size == (12 + 32) * 4
    s = caps[1]
    assert not c.restore(None, 3) and c.restore(None, c.offset)
    with pytest.raises(CacheError, match="T3"):
        c.advance(3)
        c.finish_forward(1)
    assert not c.restore(s, 1)
    assert c.restore(s, 2) and c.offset == 2
    np.testing.assert_array_equal(np.array(c[0]), np.ones((1, 3, 4)))
    c[0] = c[0] * 2  # the live slot moves on; the snapshot must not
    np.testing.assert_array_equal(np.array(s.arrays[0]), np.ones((1, 3, 4)))
    other = RecurrentCache(3, layer=2)
    with pytest.raises(CacheError):
        other.restore(s, 2)
    with pytest.raises(CacheError, match="layer"):
        RecurrentCache(2, layer=7).restore(s, 2)
    with pytest.raises(CacheError, match="kind"):
        WindowedCache(4, layer=2).restore(s, 2)
    assert c.split(s, 1) == (None, s)
    c.free()
    assert c.offset == 0 and c.empty()
    s.release()
    assert c.restore(None, 0)


def test_span_masks():
    # KV: positions 3..6 form one non-causal item inside a 8-token forward starting at 2
    c = KVCache(layer=0)
    c.update_and_fetch(*kv_rows(0, 2))
    c.finish_forward(2)
    assert c.make_mask(8) == "causal"
    c.attention_spans = [(3, 7)]
    m = np.array(c.make_mask(8))
    assert m.shape == (8, 10)
    for qi, q in enumerate(range(2, 10)):
        for k in range(10):
            assert m[qi, k] == (k <= q or (3 <= q < 7 and 3 <= k < 7))
    assert c.make_mask(1) is None  # single-token forwards ignore spans
    c.attention_spans = [(20, 30)]  # not in this forward: stock mask
    assert c.make_mask(8) == "causal"
    # windowed: keys start at offset - min(W-1, offset)
    w = WindowedCache(4, layer=0)
    w.update_and_fetch(*kv_rows(0, 6))
    w.finish_forward(6)
    w.attention_spans = [(7, 10)]
    m = np.array(w.make_mask(5, window_size=4))
    ref = np.array(span_mask(6, 5, 3, 8, [(7, 10)], 4))
    np.testing.assert_array_equal(m, ref)
    # query 7 (row 1) sees key 9 (col 6): same item, later position
    assert m[1, 6] and not m[0, 6]


def test_factory_refuses_unknown_kinds():
    from impl.caches import make_layer_caches

    class M:
        layers = [0, 1]

        def make_cache(self):
            from mlx_lm.models.cache import QuantizedKVCache

            return [StockKV(), QuantizedKVCache()]

    with pytest.raises(CacheError, match="layer 1: unsupported mlx-lm cache kind QuantizedKVCache"):
        make_layer_caches(M())

    class R:
        layers = [0]

        def make_cache(self):
            return [RotatingKVCache(max_size=8, keep=4)]

    (w,) = make_layer_caches(R())          # keep > 0 (mlx-lm's --max-kv-size) is supported
    assert type(w).__name__ == "WindowedCache" and (w.max_size, w.keep) == (8, 4)
