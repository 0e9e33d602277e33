"""Quantised KV (mlx-lm's ``to_quantized``, --kv-bits): no snapshots (docs/caches.md).

A quantised KV cache would be sliceable in REFERENCE's terms (rows of packed K/V with their scales
and biases), but nothing here snapshots it yet, so:

- ``make_layer_caches`` refuses a model whose stock cache is already a QuantizedKVCache (factory.py,
  "unsupported mlx-lm cache kind QuantizedKVCache", naming the model and the layer).
- ``KVCache.to_quantized`` (what mlx-lm's generate calls for --kv-bits once the offset passes
  quantized_kv_start) hands back mlx-lm's own QuantizedKVCache holding the same rows, exactly what
  mlx-lm's KVCache.to_quantized returns, so mlx-lm's drivers run as with mlx-lm's caches. The result
  is a plain mlx-lm cache that leaves the snapshot protocol: the conversion is refused with a
  CacheError while any snapshot of the cache is outstanding (a lazy view into its rows) or captures
  are scheduled, since those would silently describe rows the quantised cache no longer holds.
"""

from __future__ import annotations

from mlx_lm.models import cache as mlx_cache

from .base import CacheError


def to_quantized(kv, group_size: int = 64, bits: int = 4):
    if kv._views or kv._sched.active:
        raise CacheError(
            f"layer {kv.layer}: to_quantized (mlx-lm --kv-bits) with {len(kv._views)} snapshot(s) of this "
            "cache outstanding: quantised KV has no snapshots (docs/caches.md)"
        )
    return mlx_cache.KVCache.to_quantized(kv, group_size=group_size, bits=bits)
