"""A KV snapshot: position range [start, end) of one full-attention layer (kv.py's cache issues them).

Lazy while it is a view of the issuing cache's live buffer (``_cache`` set, no arrays, size 0); owned
once the cache has copied its rows out (``materialise``, which fires ``on_materialise(+size)`` once:
A1) or once a merge or split made new arrays. An owned snapshot restored into the live buffer goes
back to being a view of it (kv.py, ``_adopt``), so no row is held twice.

Copy-out: inside ``with copy_out():`` the views that layers materialise are copied when the block
ends, and the views of one range [start, end) in several layers (one trie node's layers: they are
paged out together) are copied as one array per K and V, each view's arrays a part of it. A page-in
so allocates two arrays per node, not two per node and layer (MLX pays per array allocated; on the
GPU that, not the bytes, was the page-in's cost: docs/benchmarks.md). A node's KV snapshots are
released, merged, split and restored together (impl/trie.py), so the shared array is freed when the
node's last one lets go of it. Between the registration and the block's end a view is detached from
its cache and owns nothing (size 0, its hook not yet fired): only before_write may run in the block.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from .base import LayerCache, MergeError, Snapshot
from .evaluation import evaluate


def _copy_rows(x: mx.array, a: int, b: int) -> mx.array:
    """An owned copy of rows [a, b) along the sequence axis (never a view of x)."""
    return mx.contiguous(x[:, :, a:b])


class KVSnapshot(Snapshot):
    kind = "kv"

    def __init__(self, start, end, layer=None, cache=None, keys=None, values=None):
        super().__init__(start, end, layer)
        self._cache: Optional[LayerCache] = cache  # issuer while lazy; None once owned
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

    def _materialise(self) -> None:
        """Copy this view's rows out now (or at the end of the open copy_out block)."""
        if self._cache is not None:
            materialise([self])

    def _release(self) -> None:
        if self._cache is not None:
            self._cache._views.discard(self)
            self._cache = None
        self.keys = self.values = None


def _geometry(k, v):
    if k is None:
        return None
    return (k.shape[0], k.shape[1], k.shape[3], v.shape[1], v.shape[3], k.dtype, v.dtype)


# --- copy-out --------------------------------------------------------------------------------

_gathering: list | None = None      # (view, keys, values, geometry) the open copy_out block copies


class copy_out:
    """``with copy_out():`` the views materialised in the block are copied together when it ends (a
    nested block leaves them to the outer one)."""

    __slots__ = ("outer",)

    def __enter__(self) -> "copy_out":
        global _gathering
        self.outer = _gathering is not None
        if not self.outer:
            _gathering = []
        return self

    def __exit__(self, *exc) -> bool:
        global _gathering
        if not self.outer:
            gathered, _gathering = _gathering, None
            _copy(gathered)
        return False


def materialise(views) -> None:
    """Copy lazy views out of their issuers' buffers (each read as the buffer was before a page-in's
    writes, kv.py ``_readable``) and detach them from the issuers; the copies are evaluated with the
    open deferred_eval block (at once outside one), each view's hook hears +size (A1)."""
    gathered = []
    for s in views:
        c = s._cache
        gathered.append((s, *c._readable(s.start, s.end), c._geometry()))
        c._views.discard(s)
        s._cache = None
    if _gathering is not None:
        _gathering.extend(gathered)
    else:
        _copy(gathered)


def _copy(gathered: list) -> None:
    """Copy (view, keys, values, geometry) rows out: one K and one V array per range and geometry."""
    groups: dict = {}
    for g in gathered:
        groups.setdefault((g[0].start, g[0].end, g[3]), []).append(g)
    out = []
    for (a, b, _), group in groups.items():
        if len(group) == 1:
            _, k, v, _ = group[0]
            ks, vs = [_copy_rows(k, a, b)], [_copy_rows(v, a, b)]
            out += ks + vs
        else:                               # one array per K and V, split back along the batch axis
            jk = mx.concatenate([g[1][:, :, a:b] for g in group], axis=0)
            jv = mx.concatenate([g[2][:, :, a:b] for g in group], axis=0)
            ks, vs = mx.split(jk, len(group), axis=0), mx.split(jv, len(group), axis=0)
            out += [jk, jv]
        for g, k, v in zip(group, ks, vs):
            s = g[0]
            if s.closed:                    # (released in the block: nothing to own)
                continue
            s.keys, s.values, s._geom = k, v, None
            if s.on_materialise is not None:
                s.on_materialise(s.size)
    if out:
        evaluate(*out)


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
