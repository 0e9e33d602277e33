"""A KV snapshot: position range [start, end) of one full-attention layer (kv.py's cache issues them).

Lazy while it is a view of the issuing cache's live buffer (``_cache`` set, no arrays, size 0); owned
once the cache has copied its rows out (``_materialise``, which fires ``on_materialise(+size)`` once:
A1) or once a merge or split made new arrays. An owned snapshot restored into the live buffer goes
back to being a view of it (kv.py, ``_adopt``), so no row is held twice.

Copies batched across layers: a view materialised inside a ``deferred_eval`` block takes a lazy
slice of its rows and joins a queue; when the block ends (or when anything reads its arrays first),
``copy_queued`` copies every queued view with one MLX concatenation per range and geometry (all
layers' views of one node's range, K and V together when their shapes agree), and each snapshot's
arrays are slices of it along the batch axis (row-contiguous, no copy). Its size, hooks and rows are
those of a copy of its own: only the number of MLX operations changes (one per range, not two per
layer). The arrays of one node's layers share one buffer, freed when the last of them lets go.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from .base import LayerCache, MergeError, Snapshot
from .evaluation import before_end, evaluate


def _copy_rows(x: mx.array, a: int, b: int) -> mx.array:
    """An owned copy of rows [a, b) along the sequence axis (never a view of x)."""
    return mx.contiguous(x[:, :, a:b])


_queued: list = []      # owned snapshots whose copies wait for copy_queued (the open block's end)


class KVSnapshot(Snapshot):
    kind = "kv"

    def __init__(self, start, end, layer=None, cache=None, keys=None, values=None):
        super().__init__(start, end, layer)
        self._cache: Optional[LayerCache] = cache  # issuer while lazy; None once owned
        self._slices = None                       # (K, V) rows to copy while queued (copy_queued)
        self._keys = keys
        self._values = values
        self._geom = None                         # (owned) _geometry, once computed

    @property
    def keys(self) -> Optional[mx.array]:
        if self._slices is not None:
            copy_queued()
        return self._keys

    @keys.setter
    def keys(self, k) -> None:
        self._slices, self._keys = None, k

    @property
    def values(self) -> Optional[mx.array]:
        if self._slices is not None:
            copy_queued()
        return self._values

    @values.setter
    def values(self, v) -> None:
        self._slices, self._values = None, v

    @property
    def lazy(self) -> bool:
        return self._cache is not None

    @property
    def size(self) -> int:
        k, v = self._slices or (self._keys, self._values)
        if k is None:
            return 0
        return k.nbytes + v.nbytes

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
            self._geom = _geometry(*(self._slices or (self.keys, self.values)))
        return self._geom

    def _materialise(self, now: bool = True) -> None:
        """Copy the range out of the issuer's buffer; the hook hears +size (it stays installed: a restore
        that makes this a view again reports -size through it, KVCache._adopt). The rows are sliced now
        (before any write replaces them) and queued; ``now``: copied and evaluated at once (at the open
        block's end inside one); ``now=False``: the caller calls ``copy_queued`` (one operation and one
        evaluation for several views) before the buffer is written."""
        c = self._cache
        if c is None:
            return
        keys, values = c._readable(self.start, self.end)
        self._slices = (keys[:, :, self.start : self.end], values[:, :, self.start : self.end])
        self._issuer = c.cache_id
        self._geom = None
        _queued.append(self)
        if now:
            before_end(copy_queued)
        c._views.discard(self)
        self._cache = None
        if self.on_materialise is not None:
            self.on_materialise(self.size)

    def _release(self) -> None:
        if self._cache is not None:
            self._cache._views.discard(self)
            self._cache = None
        self.keys = self.values = None


def copy_queued() -> None:
    """Copy every queued view's rows: one concatenation along the batch axis per (range, geometry),
    with at most one view of each issuing cache (so a group is one node's layers, released together;
    a group of one: its own copy), each snapshot's arrays slices of it; the concatenations are
    evaluated with the open block (at once outside one). Released snapshots have left the queue."""
    global _queued
    queued, _queued = _queued, []
    groups: dict = {}
    for s in queued:
        if s._slices is not None:
            k, v = s._slices
            key = (s.start, s.end, _geometry(k, v))
            while s._issuer in groups.setdefault(key, {}):     # one view a layer: a group is one node's
                key += (None,)
            groups[key][s._issuer] = s
    out = []
    for group in (list(g.values()) for g in groups.values()):
        rows = [x for s in group for x in s._slices]
        if len(group) == 1:
            copies = [mx.contiguous(x) for x in rows]
            out += copies
        else:
            k, v = group[0]._slices
            same = k.shape[1:] == v.shape[1:] and k.dtype == v.dtype
            joined = [mx.concatenate(rows, axis=0)] if same else [
                mx.concatenate(rows[0::2], axis=0), mx.concatenate(rows[1::2], axis=0)]
            out += joined
            copies, at = [], [0] * len(joined)
            for x in rows:
                j = 0 if same else len(copies) % 2
                copies.append(joined[j][at[j] : at[j] + x.shape[0]])
                at[j] += x.shape[0]
        for s, kc, vc in zip(group, copies[0::2], copies[1::2]):
            s._slices, s._keys, s._values = None, kc, vc
    if out:
        evaluate(*out)


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
