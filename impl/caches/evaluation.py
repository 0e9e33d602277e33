"""One MLX evaluation for a whole page-in instead of one per layer and view (bookkeeping cost).

Inside ``deferred_eval()``, the caches' copies (materialised views, fitted buffers, pending
captures) are collected by ``evaluate`` and evaluated together, in one ``mx.eval``, when the block
ends; outside it, ``evaluate`` evaluates at once. Deferral changes no result: every array is the
same graph either way, and MLX keeps an array's inputs alive until it is evaluated, so a copy read
from a buffer that a later write replaces still sees the old rows.

Writes into a live buffer (a restore's rows) are never evaluated here: the next forward evaluates
them with its own writes. So a block's copies out of a buffer are done, and have let go of it, by
the time the write runs, and MLX updates the buffer in place. (Evaluated together with the copies,
the write would find the buffer still read by them, and MLX copies a whole buffer for such a write:
on SmolLM2's 30 layers, a 320-row buffer with 80 rows copied out and 80 written in, 1.8 ms instead
of 0.9 on the CPU; docs/caches.md.) Every evaluation is a synchronisation with the MLX stream that
costs tens of microseconds after a forward, whatever it computes, so a page-in has at most one, and
so has a forward: the Engine runs each in a block, and the captures its caches take in
``finish_forward`` (and a recurrent page-out left pending since the last close) are evaluated with it.
Where the default device is the CPU, KV rows are copied on the host instead (host_rows.py): those
copies leave nothing to evaluate, and a page-in that only copies KV rows makes no evaluation at all.
"""
from __future__ import annotations

import mlx.core as mx

_pending: list | None = None     # arrays the open block evaluates at its end
_after: list = []                # what the open block calls once it has evaluated them


def evaluate(*arrays) -> None:
    if _pending is not None:
        _pending.extend(arrays)
    else:
        mx.eval(*arrays)


def after_block(fn) -> None:
    """Call fn once the open block has evaluated its arrays (at once outside a block): a cache drops
    there what only the block's copies may read (kv.py, ``_unwritten``)."""
    if _pending is not None:
        _after.append(fn)
    else:
        fn()


class deferred_eval:
    """``with deferred_eval():`` collects the copies made in the block and evaluates them at its end
    (also when the block raises); a nested block leaves them to the outer one. A class, not a
    ``contextlib.contextmanager`` generator: right after a forward on the CPU the generator cost
    12-24 us against about 4 us for this (docs/caches.md)."""

    __slots__ = ("outer",)

    def __enter__(self) -> "deferred_eval":
        global _pending
        self.outer = _pending is not None
        if not self.outer:
            _pending = []
        return self

    def __exit__(self, *exc) -> bool:
        global _pending
        if not self.outer:
            arrays, _pending = _pending, None
            if arrays:
                mx.eval(*arrays)
            if _after:
                calls, _after[:] = list(_after), []
                for fn in calls:
                    fn()
        return False
