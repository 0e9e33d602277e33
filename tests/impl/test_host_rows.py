"""Rows copied on the host (impl/caches/host_rows.py): the same bits as MLX's copy, owned, and only
where they apply. What the host copies change in a page-in (no evaluation, the write still in place):
tests/impl/test_caches_kv_writes.py and test_engine_evaluations.py, parametrised by COPIES."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import impl.caches.host_rows as host_rows


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 40), heads=st.integers(1, 3), dim=st.integers(1, 9), data=st.data(),
       dtype=st.sampled_from(["float32", "float16"]))
def test_a_host_copy_is_mlxs_copy_bit_for_bit_and_owns_its_rows(rows, heads, dim, data, dtype):
    a = data.draw(st.integers(0, rows - 1))
    b = data.draw(st.integers(a + 1, rows))
    x = mx.random.normal((1, heads, rows, dim)).astype(getattr(mx, dtype))
    mx.eval(x)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(host_rows, "ENABLED", True)
        got = host_rows.copy_rows(x, a, b)
    want = mx.contiguous(x[:, :, a:b])
    assert got is not None and got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8))
    assert not np.shares_memory(np.asarray(got), np.asarray(x))   # a buffer of its own, not a view of x's
    kept = np.array(got)
    x[:, :, a:b] = 0                                   # an in-place write to the source (MLX donates it)
    mx.eval(x)
    np.testing.assert_array_equal(np.asarray(got), kept)


def test_host_copies_apply_only_where_numpy_has_the_dtype_and_they_are_enabled(monkeypatch):
    x = mx.ones((1, 2, 8, 4))
    bf = x.astype(mx.bfloat16)
    monkeypatch.setattr(host_rows, "ENABLED", True)
    assert host_rows.copy_rows(bf, 1, 3) is None      # numpy has no bfloat16: MLX's stream copies it
    assert host_rows.copy_rows(x, 1, 3) is not None
    monkeypatch.setattr(host_rows, "ENABLED", False)
    assert host_rows.copy_rows(x, 1, 3) is None
    monkeypatch.setattr(host_rows, "ENABLED", None)    # the default: where the default device is the CPU
    assert host_rows.enabled() == (mx.default_device() == mx.cpu)


def test_a_host_copy_of_a_pending_array_evaluates_it_first():
    """The contract's edge: a source with a write still pending is evaluated by numpy's read, so the
    copy holds the written rows, never stale ones."""
    x = mx.zeros((1, 1, 6, 2))
    mx.eval(x)
    y = x + 1                                          # pending
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(host_rows, "ENABLED", True)
        got = host_rows.copy_rows(y, 2, 5)
    np.testing.assert_array_equal(np.asarray(got), np.ones((1, 1, 3, 2), np.float32))


def test_a_pair_is_copied_on_the_host_only_when_both_can_be(monkeypatch):
    """KV copies come in pairs (keys, values): both on the host, or both with MLX's stream (then the
    caller evaluates them), never one of each."""
    from impl.caches.kv_snapshot import _copy_pair

    monkeypatch.setattr(host_rows, "ENABLED", True)
    k, v = mx.arange(16, dtype=mx.float32).reshape(1, 1, 8, 2), mx.ones((1, 1, 8, 2))
    for values, pending in ((v, False), (v.astype(mx.bfloat16), True)):
        ck, cv, got = _copy_pair(k, values, 2, 5)
        assert got is pending and cv.dtype == values.dtype
        np.testing.assert_array_equal(np.asarray(ck), np.asarray(k)[:, :, 2:5])
        np.testing.assert_array_equal(np.asarray(cv.astype(mx.float32)), np.ones((1, 1, 3, 2), np.float32))
