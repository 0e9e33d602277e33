"""Quantised KV (mlx-lm's ``to_quantized``, --kv-bits): refused for now (see docs/caches.md)."""

from __future__ import annotations

from .base import CacheError


class QuantizedKVCache:
    @classmethod
    def from_kv(cls, kv, group_size: int = 64, bits: int = 4):
        raise CacheError(
            f"layer {kv.layer}: to_quantized (mlx-lm --kv-bits) is not supported by the snapshot KV cache: "
            "quantising would replace the live cache the prefix cache holds"
        )
