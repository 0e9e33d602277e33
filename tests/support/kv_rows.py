"""Synthetic KV rows for the KVCache tests (tests/impl/test_caches_kv*.py): row p of stream generation
gen holds a value that identifies (gen, p), so every comparison of snapshot rows is exact."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from impl.caches import KVCache, live_snapshots

H, DK, DV = 2, 3, 5


def rows(gen: int, start: int, end: int):
    """K/V rows for positions [start, end) of stream generation gen (values are exact in float32)."""
    pos = np.arange(start, end, dtype=np.float32)
    k = np.broadcast_to((gen * 1000 + pos)[None, None, :, None], (1, H, end - start, DK)).copy()
    v = np.broadcast_to((-gen * 1000 - pos)[None, None, :, None], (1, H, end - start, DV)).copy()
    k[:, 1] += 0.5  # heads differ, so a transposed copy would show
    return mx.array(k), mx.array(v)


def write(c: KVCache, gen: int, n: int):
    k, v = rows(gen, c.offset, c.offset + n)
    c.update_and_fetch(k, v)
    c.finish_forward(n)


def live_rows(c: KVCache):
    k, v = c.keys_and_values()
    return np.array(k), np.array(v)


def snap_rows(s):
    k, v = s._rows()
    return np.array(k), np.array(v)


def expect(gens, a, b):
    """Expected rows [a, b) given the generation that wrote each position."""
    ks, vs = [], []
    for p in range(a, b):
        k, v = rows(gens[p], p, p + 1)
        ks.append(np.array(k))
        vs.append(np.array(v))
    return np.concatenate(ks, axis=2), np.concatenate(vs, axis=2)


@pytest.fixture(autouse=True)
def no_leaks():
    base = live_snapshots()
    yield
    assert live_snapshots() == base, "A2: snapshots leaked"
