"""One MLX evaluation for a whole page-in instead of one per layer and view (bookkeeping cost).

Inside ``deferred_eval()``, the KV cache's copies (materialised views, restored rows, fitted buffers)
are collected by ``evaluate`` and evaluated together when the block ends; outside it, ``evaluate``
evaluates at once. Deferral changes no result: every array is the same graph either way, and MLX keeps
an array's inputs alive until it is evaluated, so a copy read from a buffer that a later write replaces
still sees the old rows (the write then may not update the buffer in place: a copy of one buffer
instead of one evaluation per layer).
"""
from __future__ import annotations

import contextlib

import mlx.core as mx

_pending: list | None = None


def evaluate(*arrays) -> None:
    if _pending is not None:
        _pending.extend(arrays)
    else:
        mx.eval(*arrays)


@contextlib.contextmanager
def deferred_eval():
    global _pending
    if _pending is not None:                  # nested: the outer block evaluates
        yield
        return
    _pending = []
    try:
        yield
    finally:
        arrays, _pending = _pending, None
        if arrays:
            mx.eval(*arrays)
