"""A KV snapshot: position range [start, end) of one full-attention layer (kv.py's cache issues them).

Lazy while it is a view of the issuing cache's live buffer (``_cache`` set, no arrays, size 0); owned
once the cache has copied its rows out (``_materialise``, which fires ``on_materialise(+size)`` once:
A1) or once a merge or split made new arrays. An owned snapshot restored into the live buffer goes
back to being a view of it (kv.py, ``_adopt``), so no row is held twice.
"""

from __future__ import annotations

from typing import Optional, TYPE_CHECKING

import mlx.core as mx

from .base import Snapshot
from .evaluation import evaluate

if TYPE_CHECKING:
    from .kv import SnapshotKVCache


def _copy_rows(x: mx.array, a: int, b: int) -> mx.array:
    """An owned copy of rows [a, b) along the sequence axis (never a view of x)."""
    return mx.contiguous(x[:, :, a:b])


class KVSnapshot(Snapshot):
    kind = "kv"

    def __init__(self, start, end, layer=None, cache=None, keys=None, values=None):
        super().__init__(start, end, layer)
        self._cache: Optional["SnapshotKVCache"] = cache  # issuer while lazy; None once owned
        self.keys = keys
        self.values = values
        self._geom = None                         # (owned) _geometry, once computed

    @property
    def lazy(self) -> bool:
        return self._cache is not None

    @property
    def size(self) -> int:
        if self.keys is None:
            return 0
        return self.keys.nbytes + self.values.nbytes

    def _rows(self) -> tuple[mx.array, mx.array]:
        """This snapshot's rows: its own arrays, or (lazy) slices of the issuer's buffer."""
        if self._cache is not None:
            c = self._cache
            return c.keys[:, :, self.start : self.end], c.values[:, :, self.start : self.end]
        return self.keys, self.values

    def _geometry(self):
        if self._cache is not None:
            return self._cache._geometry()
        if self._geom is None:                    # an owned snapshot's arrays never change shape
            self._geom = _geometry(self.keys, self.values)
        return self._geom

    def _materialise(self, now: bool = True) -> None:
        """Copy the range out of the issuer's buffer; the hook hears +size (it stays installed: a restore
        that makes this a view again reports -size through it, KVCache._adopt). ``now=False``: the caller
        evaluates the copies (one evaluation for several views) before the buffer is written."""
        c = self._cache
        if c is None:
            return
        keys, values = c._readable(self.start, self.end)
        self.keys = _copy_rows(keys, self.start, self.end)
        self._geom = None
        self.values = _copy_rows(values, self.start, self.end)
        if now:
            evaluate(self.keys, self.values)
        c._views.discard(self)
        self._cache = None
        if self.on_materialise is not None:
            self.on_materialise(self.size)

    def _release(self) -> None:
        if self._cache is not None:
            self._cache._views.discard(self)
            self._cache = None
        self.keys = self.values = None


def _geometry(k, v):
    if k is None:
        return None
    return (k.shape[0], k.shape[1], k.shape[3], v.shape[1], v.shape[3], k.dtype, v.dtype)
