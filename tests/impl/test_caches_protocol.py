"""The snapshot protocol's names next to mlx-lm's cache protocols (impl/caches/base.py, "Names").

- No layer cache has a ``merge`` attribute, so mlx-lm's batchability test is false and a forced batch
  stops at mlx-lm's own ValueError; snapshots merge through ``merge_snapshots``.
- A snapshot is ended by ``release()`` exactly once (A2); a second release raises.
"""
import mlx.core as mx
import pytest
from mlx_lm.generate import _merge_caches

from impl.caches import (ChunkedCache, CacheError, KVCache, KVListCache, RecurrentCache, StateListCache,
                         WindowedCache, live_snapshots)


def _caches():
    return [KVCache(layer=0), WindowedCache(4, layer=1), RecurrentCache(2, layer=2), ChunkedCache(8, layer=3),
            KVListCache(KVCache(layer=4), KVCache(layer=4), layer=4),
            StateListCache(RecurrentCache(2, layer=5), KVCache(layer=5), layer=5)]


@pytest.mark.parametrize("cache", _caches(), ids=lambda c: type(c).__name__)
def test_no_cache_passes_mlx_lm_batchability_test(cache):
    assert not hasattr(cache, "merge")
    assert callable(cache.merge_snapshots)
    with pytest.raises(ValueError, match="does not yet support batching"):
        _merge_caches([[cache], [cache]])


def test_release_is_once_only():
    c = KVCache(layer=0)
    c.update_and_fetch(mx.zeros((1, 1, 3, 2)), mx.zeros((1, 1, 3, 2)))
    c.finish_forward(3)
    base = live_snapshots()
    s = c.snapshot(0)
    assert live_snapshots() == base + 1
    s.release()
    assert s.closed and live_snapshots() == base
    with pytest.raises(CacheError, match="A2"):
        s.release()
    assert not hasattr(s, "close")


def test_to_quantized_is_mlx_lm_s_and_refused_with_snapshots_outstanding():
    from mlx_lm.models.cache import KVCache as StockKV
    from mlx_lm.models.cache import QuantizedKVCache

    x = mx.random.normal((1, 2, 5, 64), key=mx.random.key(3))
    ours, stock = KVCache(layer=0), StockKV()
    ours.update_and_fetch(x, x)
    stock.update_and_fetch(x, x)
    s = ours.snapshot(0)
    with pytest.raises(CacheError, match="no snapshots"):
        ours.to_quantized(group_size=32, bits=8)
    s.release()
    q, r = ours.to_quantized(group_size=32, bits=8), stock.to_quantized(group_size=32, bits=8)
    assert type(q) is QuantizedKVCache and q.offset == r.offset == 5
    assert all(mx.array_equal(a, b).item() for a, b in zip(q.keys, r.keys))
