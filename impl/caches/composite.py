"""A layer whose cache is several caches (drop-in for mlx-lm's CacheList, as deepseek_v32,
longcat_flash, baichuan_m1 and falcon_h1 use it): the parts are our caches, one per mlx-lm part.

Two kinds, decided by the parts (REFERENCE section 1):
- ``KVListCache`` (every part sliceable, e.g. CacheList(KVCache, KVCache)): kind "kv". A snapshot
  is one ``PartsSnapshot`` over [start, end) holding one KV snapshot per part, all of the same range.
  Every rule of a KV snapshot holds part by part: S1 (each part spans exactly the node's edge),
  G1 (merge_snapshots of non-adjacent ranges raises before any part is touched), G2 (parts
  concatenate, lazy views by arithmetic), S4 (split gives both halves), restore to any target in
  (start, end]. The parts capture themselves while the forward writes them (each its own schedule).
- ``StateListCache`` (some part whole-state, e.g. CacheList(ArraysCache, KVCache)): kind
  "recurrent", a whole-state layer. A snapshot is the state of every part at one offset o
  (start == end == o, S2): whole-state parts give their state at o, sliceable parts a KV snapshot of
  [0, o) (a lazy view, owning nothing until the live buffer overwrites it). Captures happen only at
  forward boundaries (the driver cuts there, as for recurrent layers); it never rewinds through the
  snapshot protocol (P1: no split into its edges), merging keeps the newer state (G2) and a split
  leaves it on the tail (S4).
- A1: a PartsSnapshot's size is the sum of its parts'; a part materialising reports through the
  PartsSnapshot's hook. A2: a PartsSnapshot counts once in live_snapshots() (its parts are adopted,
  uncounted); releasing it releases each part once.
- The mlx-lm interface (``cache[i]``, ``caches``, ``state``, ``trim``, ``is_trimmable``, ``size``,
  ``empty``, ``nbytes``) is mlx-lm's CacheList's, so models and mlx-lm helpers see a CacheList.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
from mlx_lm.models import cache as mlx_cache

from .base import CacheError, LayerCache, MergeError, Snapshot, WholeStateCache
from .captures import CaptureSchedule


class PartsSnapshot(Snapshot):
    def __init__(self, kind: str, start: int, end: int, parts: list, layer=None):
        super().__init__(start, end, layer)
        self.kind = kind
        self.parts = parts
        for p in parts:
            if p is not None:
                p._become_part()           # A2: the composite is the one snapshot counted
                p.on_materialise = self._part_grew

    def _part_grew(self, delta: int) -> None:
        if self.on_materialise is not None:
            self.on_materialise(delta)

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts if p is not None)

    @property
    def lazy(self) -> bool:
        return any(p is not None and p.lazy for p in self.parts)

    def _release(self) -> None:
        for p in self.parts:
            if p is not None and not p.closed:
                p.release()
        self.parts = []


class _ListMixin:
    """mlx-lm's CacheList interface over ``self.caches`` (our caches); media spans (M1) set on the
    list reach every part."""

    @property
    def attention_spans(self):
        return self._spans

    @attention_spans.setter
    def attention_spans(self, v):
        self._spans = v
        for c in getattr(self, "caches", ()):
            c.attention_spans = v

    def __getitem__(self, idx):
        return self.caches[idx]

    @property
    def state(self):
        return [(c.state, type(c).__name__) for c in self.caches]

    @state.setter
    def state(self, v):
        self.caches = tuple(getattr(mlx_cache, name).from_state(s) for s, name in v)
        self.offset = max((c.offset for c in self.caches), default=0)

    def is_trimmable(self) -> bool:
        return all(c.is_trimmable() for c in self.caches)

    def trim(self, n: int) -> int:
        m = 0
        for c in self.caches:
            m = c.trim(n)
        self.offset = max((c.offset for c in self.caches), default=0)
        return m

    def size(self) -> int:
        return max(c.size() for c in self.caches)

    def empty(self) -> bool:
        return self.caches[0].empty()

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches)

    def free(self) -> None:
        for c in self.caches:
            c.free()
        self.offset = 0

    def before_write(self, n: int) -> None:
        """Each part's (a KV part's lazy views, in a KV or a whole-state list alike)."""
        for c in self.caches:
            c.before_write(n)

    def would_copy(self, n: int) -> bool:
        return any(c.would_copy(n) for c in self.caches)

    def copy_ahead(self, n: int) -> None:
        for c in self.caches:
            c.copy_ahead(n)

    def drop_ahead(self) -> None:
        for c in self.caches:
            c.drop_ahead()

    def _check_parts(self, snap) -> None:
        self._check_snapshot(snap)
        if len(snap.parts) != len(self.caches):
            raise CacheError(f"snapshot has {len(snap.parts)} parts, this cache {len(self.caches)}")

    @classmethod
    def from_state(cls, state):
        c = cls.__new__(cls)
        LayerCache.__init__(c)
        c._init_extra()
        c.state = state
        return c

    def _init_extra(self) -> None:
        pass


class KVListCache(_ListMixin, LayerCache, mlx_cache.CacheList):
    kind = "kv"

    def __init__(self, *caches, layer: Optional[int] = None):
        LayerCache.__init__(self, layer)
        if not caches or any(c.kind != "kv" for c in caches):
            raise CacheError("KVListCache: every part must be a KV cache")
        self.caches = tuple(caches)
        self.attention_spans = []

    def _whole(self, parts, start, end) -> Optional[PartsSnapshot]:
        """One PartsSnapshot, or None (every part released) unless every part has the range."""
        if any(p is None for p in parts):
            self._release_quietly(*parts)
            return None
        return PartsSnapshot("kv", start, end, list(parts), self.layer)

    def snapshot(self, start: int) -> Optional[PartsSnapshot]:
        return self._whole([c.snapshot(start) for c in self.caches], start, self.offset)

    def prepare_captures(self, offsets) -> None:
        for c in self.caches:
            c.prepare_captures(offsets)

    def take_captures(self) -> list:
        rows = [c.take_captures() for c in self.caches]
        out = []
        for parts in zip(*rows):
            first = next((p for p in parts if p is not None), None)
            out.append(None if first is None else self._whole(parts, first.start, first.end))
        return out

    def can_restore(self, snap, target: int) -> bool:
        if snap is None:
            return all(c.can_restore(None, target) for c in self.caches)
        self._check_parts(snap)
        return all(c.can_restore(p, target) for c, p in zip(self.caches, snap.parts))

    def restore(self, snap, target: int) -> bool:
        if not self.can_restore(snap, target):
            return False
        parts = [None] * len(self.caches) if snap is None else snap.parts
        for c, p in zip(self.caches, parts):
            if not c.restore(p, target):        # can_restore said yes for every part
                raise CacheError(f"layer {self.layer}: part {type(c).__name__} refused a restore to {target}")
        self.offset = target
        return True

    def merge_snapshots(self, a, b):
        for s in (a, b):
            if s is not None:
                self._check_parts(s)
        if a is None or b is None:
            self._release_quietly(a, b)
            return None
        if a.end != b.start:
            raise MergeError(f"G1: cannot merge non-adjacent KV ranges [{a.start},{a.end}) and [{b.start},{b.end})")
        pa, pb = a.parts, b.parts
        a.parts = b.parts = []          # the parts move into the merge; the shells are released
        parts = [c.merge_snapshots(x, y) for c, x, y in zip(self.caches, pa, pb)]
        start, end = a.start, b.end
        a.release()
        b.release()
        return PartsSnapshot("kv", start, end, parts, self.layer)

    def split(self, snap, at: int):
        if snap is None:
            return None, None
        self._check_parts(snap)
        if not isinstance(at, int) or not snap.start < at < snap.end:
            raise CacheError(f"split point {at!r} is not strictly inside [{snap.start},{snap.end})")
        parts, snap.parts = snap.parts, []
        halves = [c.split(p, at) for c, p in zip(self.caches, parts)]
        head = PartsSnapshot("kv", snap.start, at, [h for h, _ in halves], self.layer)
        tail = PartsSnapshot("kv", at, snap.end, [t for _, t in halves], self.layer)
        snap.release()
        return head, tail

    def finish_forward(self, n_tokens: int) -> None:
        for c in self.caches:
            c.finish_forward(n_tokens)
        self.offset += n_tokens

    def reserve(self, rows: int, certain: int = 0) -> None:
        for c in self.caches:
            c.reserve(rows, certain)

    def fit(self) -> int:
        """Each KV part's fit (kv.py): growth slack at rest bounded."""
        return sum(c.fit() for c in self.caches if hasattr(c, "fit"))

    def adopt(self, snap) -> bool:
        """Each KV part's adopt (kv.py): owned rows the live parts hold in place become views of them
        (each part's bytes leave through the PartsSnapshot's hook); True when every part did."""
        self._check_parts(snap)
        return all([c.adopt(p) for c, p in zip(self.caches, snap.parts)])


class StateListCache(_ListMixin, WholeStateCache, mlx_cache.CacheList):
    kind = "recurrent"

    def __init__(self, *caches, layer: Optional[int] = None):
        LayerCache.__init__(self, layer)
        self.caches = tuple(caches)
        self.attention_spans = []
        self._init_extra()

    def _init_extra(self) -> None:
        self._sched = CaptureSchedule()
        self._unevaluated: list = []

    def _capture(self, _base: int, o: int) -> Optional[PartsSnapshot]:
        if all(c.empty() for c in self.caches):
            return None
        parts = [c.snapshot(0) if c.kind == "kv" else c.snapshot(c.offset) for c in self.caches]
        return PartsSnapshot("recurrent", o, o, parts, self.layer)

    def _eval_captures(self) -> None:
        pass       # every whole-state part evaluates its own capture in snapshot()

    def can_restore(self, snap, target: int) -> bool:
        self._check_target(target)
        if snap is None:
            return target == 0 or target == self.offset
        self._check_parts(snap)
        return target == snap.end and all(c.can_restore(p, target) for c, p in zip(self.caches, snap.parts))

    def restore(self, snap, target: int) -> bool:
        if self._sched.active:
            raise CacheError("restore while captures are scheduled (take_captures first)")
        if not self.can_restore(snap, target):
            return False
        if snap is None:
            if target == 0:
                for c in self.caches:
                    c.restore(None, 0)
                self.offset = 0
            return True
        for c, p in zip(self.caches, snap.parts):
            if not c.restore(p, target):        # can_restore said yes for every part
                raise CacheError(f"layer {self.layer}: part {type(c).__name__} refused a restore to {target}")
        self.offset = target
        return True

    def finish_forward(self, n_tokens: int) -> None:
        for c in self.caches:
            c.finish_forward(n_tokens)
        start = self.offset
        self.offset = start + n_tokens
        if self._sched.active:
            inside = self._sched.pending_in(start + 1, start + n_tokens - 1)
            if inside:
                raise CacheError(
                    f"capture offset {inside[0]} was strictly inside a forward [{start},{start + n_tokens}) "
                    f"of the layer {self.layer}: cut the forward there"
                )
            if self._sched.pending_in(self.offset, self.offset):
                self._sched.reach(self.offset, self._capture)

    def free(self) -> None:
        self._sched.clear()
        _ListMixin.free(self)


def make_list_cache(parts, layer: Optional[int] = None) -> LayerCache:
    if all(p.kind == "kv" for p in parts):
        return KVListCache(*parts, layer=layer)
    return StateListCache(*parts, layer=layer)
