"""A KV snapshot: position range [start, end) of one full-attention layer (kv.py's cache issues them).

Lazy while it is a view of the issuing cache's live buffer (``_cache`` set, no arrays, size 0); owned
once the cache has copied its rows out (``_materialise``, which fires ``on_materialise(+size)`` once:
A1) or once a merge or split made new arrays. An owned snapshot restored into the live buffer goes
back to being a view of it (kv.py, ``_adopt``), so no row is held twice.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from . import host_rows
from .base import LayerCache, MergeError, Snapshot
from .evaluation import evaluate


def _copy_rows(x: mx.array, a: int, b: int) -> mx.array:
    """An owned copy of rows [a, b) along the sequence axis (never a view of x)."""
    return mx.contiguous(x[:, :, a:b])


def _copy_pair(keys: mx.array, values: mx.array, a: int, b: int) -> tuple:
    """(k, v, pending): owned copies of rows [a, b) of both, made on the host where host_rows.py
    applies to both (pending False: nothing to evaluate), else with MLX's stream (pending True)."""
    k = host_rows.copy_rows(keys, a, b)
    v = None if k is None else host_rows.copy_rows(values, a, b)
    if v is not None:
        return k, v, False
    return _copy_rows(keys, a, b), _copy_rows(values, a, b), True


class KVSnapshot(Snapshot):
    kind = "kv"

    def __init__(self, start, end, layer=None, cache=None, keys=None, values=None):
        super().__init__(start, end, layer)
        self._cache: Optional[LayerCache] = cache  # issuer while lazy; None once owned
        self.keys = keys
        self.values = values
        self._geom = None                         # (owned) _geometry, once computed
        self._ahead = None                        # (lazy) copies of the rows made ahead (kv_views.py, copy_ahead)

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

    def _materialise(self, now: bool = True) -> tuple:
        """Copy the range out of the issuer's buffer; the hook hears +size (it stays installed: a restore
        that makes this a view again reports -size through it, KVCache._adopt). ``now=False``: the caller
        evaluates the copies returned (one evaluation for several views) before the buffer is written;
        copies made ahead or on the host (host_rows.py) need none, and none are returned."""
        c, todo = self._cache, ()
        if c is None:
            return todo
        if self._ahead is not None:               # copied already, with the forward before this write
            (self.keys, self.values), self._ahead = self._ahead, None
        else:
            self.keys, self.values, pending = _copy_pair(*c._readable(self.start, self.end), self.start, self.end)
            if pending:
                todo = (self.keys, self.values)
                if now:
                    evaluate(*todo)
        self._geom = None
        c._views.discard(self)
        self._cache = None
        if self.on_materialise is not None:
            self.on_materialise(self.size)
        return todo

    def _release(self) -> None:
        if self._cache is not None:
            self._cache._views.discard(self)
            self._cache = None
        self.keys = self.values = self._ahead = None


def _geometry(k, v):
    if k is None:
        return None
    return (k.shape[0], k.shape[1], k.shape[3], v.shape[1], v.shape[3], k.dtype, v.dtype)


# --- G1: merge and split (kv.py's merge_snapshots and split check their inputs first) ------------

def merge_kv(a: KVSnapshot, b: KVSnapshot) -> KVSnapshot:
    """Adjacent ranges only (MergeError otherwise): two lazy views of one cache merge by arithmetic
    (still lazy); anything else becomes an owned concatenation. The inputs are released."""
    if a.end != b.start:
        raise MergeError(f"G1: cannot merge non-adjacent KV ranges [{a.start},{a.end}) and [{b.start},{b.end})")
    if a._cache is not None and a._cache is b._cache:
        merged = a._cache._view(a.start, b.end)
    else:
        ka, va = a._rows()
        kb, vb = b._rows()
        k = mx.concatenate([ka, kb], axis=2)
        v = mx.concatenate([va, vb], axis=2)
        if a._cache is not None or b._cache is not None:
            evaluate(k, v)  # rows read from a live buffer: copied before it is written again
        # two owned inputs: left to MLX's lazy evaluation (computed when first read, never when the
        # merged snapshot is released first; the inputs' arrays stay referenced until then)
        merged = KVSnapshot(a.start, b.end, a.layer, keys=k, values=v)
    a.release()
    b.release()
    return merged


def split_kv(snap: KVSnapshot, at: int) -> tuple[KVSnapshot, KVSnapshot]:
    """[start, at) and [at, end): views of the issuer for a lazy view, owned copies otherwise; the input
    is released."""
    if snap._cache is not None:
        c = snap._cache
        head, tail = c._view(snap.start, at), c._view(at, snap.end)
    else:
        i = at - snap.start
        n = snap.end - snap.start
        hk, hv = _copy_rows(snap.keys, 0, i), _copy_rows(snap.values, 0, i)
        tk, tv = _copy_rows(snap.keys, i, n), _copy_rows(snap.values, i, n)
        # owned input: evaluated lazily, as for a merge of owned snapshots
        head = KVSnapshot(snap.start, at, snap.layer, keys=hk, values=hv)
        tail = KVSnapshot(at, snap.end, snap.layer, keys=tk, values=tv)
    snap.release()
    return head, tail
