"""Rows copied out of a KV buffer on the calling thread, where MLX computes on the CPU.

MLX's CPU backend runs every operation on its stream's own thread, so a copy made with MLX costs an
operation handed to that thread and an evaluation to wait for it: on the 2-core machine about 10 us an
operation and 60-90 us an evaluation, whatever it copies (docs/caches.md). Where the default device is
the CPU, ``copy_rows`` instead reads the evaluated buffer through numpy and copies the rows into a new
MLX array at once: only the bytes, no operation left to evaluate. On a GPU (and for a dtype numpy
lacks: bfloat16) it returns None and the caller copies with MLX's stream as before.

Contract: x is an evaluated array (numpy's view of an array evaluates it first, which is correct but
costs the hand-off this saves, and evaluates any write pending on it). The copy is owned (a new buffer,
never a view of x), equal to ``mx.contiguous(x[:, :, a:b])`` bit for bit, and nothing keeps x's buffer
referenced afterwards, so the next write updates it in place.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

ENABLED: bool | None = None     # None: where MLX's default device is the CPU; True / False: always / never
_NUMPY_DTYPES = frozenset({mx.float32, mx.float16, mx.float64})


def enabled() -> bool:
    return mx.default_device() == mx.cpu if ENABLED is None else ENABLED


def copy_rows(x: mx.array, a: int, b: int) -> mx.array | None:
    """An owned copy of rows [a, b) along the sequence axis, made now; None where it does not apply."""
    if x.dtype not in _NUMPY_DTYPES or not enabled():
        return None
    return mx.array(np.ascontiguousarray(np.asarray(x)[:, :, a:b]))
