"""Sliceable full-attention KV cache with lazy range snapshots (drop-in for mlx-lm's KVCache).

The live cache is one growing buffer per K and V, shaped [B, heads, capacity, head_dim]; rows
[0, offset) are the stream's positions. Writes go in place (mlx-lm's slice assignment), and MLX
updates the buffer without copying as long as nothing else references it.

Invariants (REFERENCE.md rule ids):
- S1: a KV snapshot is exactly the position range [start, end) it names; captures scheduled at
  offsets o1 < o2 < ... yield [base, o1), [o1, o2), ... even when several fall inside one write.
- Lazy views: a snapshot taken from the live cache holds no array, only (cache, start, end); the
  cache copies each out before a write overwrites its rows (kv_views.py keeps them).
- An intact lazy view of this cache restores with no copy at all (the rows are still in place).
- G1: merge accepts only adjacent ranges (a.end == b.start) and raises MergeError otherwise; two lazy
  views of one cache merge by arithmetic (still lazy); anything else becomes an owned concatenation.
  merge and split never fire their inputs' hooks: the inputs are closed and the result reports its
  own size.
- Owned size = rows x (bytes per row of K + bytes per row of V); a lazy view owns 0.
- Growth: the first growth of a request covers its prompt's rows at once (``reserve``), so its later
  chunks write in place; past them the buffer grows in ``step`` rows as mlx-lm's does, and the growth
  reaching the request's reserved rows stops there; at rest (``fit``) it holds the rows in use plus
  at most 1/``rest_slack`` of them as slack (dropping fewer rows is not worth a copy of all of them).
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
from mlx_lm.models import cache as mlx_cache
from mlx_lm.models.cache import create_attention_mask

from .base import CacheError, LayerCache
from .captures import CaptureSchedule
from .evaluation import evaluate
from .kv_snapshot import KVSnapshot, _copy_pair, _geometry, merge_kv, split_kv
from .kv_views import LiveViews
from .masks import span_mask, spans_touching


class SnapshotKVCache(LiveViews, LayerCache, mlx_cache.KVCache):
    """(impl.caches.KVCache) An mlx-lm KVCache for every type check; its class name is distinct so
    that mlx-lm's load_prompt_cache rebuilds this class, not mlx-lm's (persist.py)."""

    kind = "kv"
    step = 256
    rest_slack = 16     # at rest a buffer keeps at most need // rest_slack rows beyond those in use (fit)

    def __init__(self, layer: Optional[int] = None):
        super().__init__(layer)
        self.keys: Optional[mx.array] = None
        self.values: Optional[mx.array] = None
        self._init_views()       # the outstanding lazy views (kv_views.py)
        self._geom = None        # _geometry of the buffer: kept while it only grows or shrinks (reset by state, free)
        self._sched = CaptureSchedule()
        self._since_boundary = 0
        self._reserved = 0          # the open request's announced rows (reserve); 0: none
        self._certain = 0           # of those, the rows its prompt writes unless cancelled (reserve)

    # --- mlx-lm cache interface --------------------------------------------------------------
    def update_and_fetch(self, keys: mx.array, values: mx.array):
        prev = self.offset
        self._write(keys, values)
        self._unwritten = None      # (a forward inside the block: its evaluation writes the rows in place)
        self._since_boundary += keys.shape[2]
        if self._sched.active:
            for o in self._sched.pending_in(prev, self.offset):
                self._sched.reach(o, self._view)
        return self.keys_and_values()

    def keys_and_values(self):
        if self.offset < self.keys.shape[2]:
            return self.keys[:, :, : self.offset], self.values[:, :, : self.offset]
        return self.keys, self.values

    def make_mask(self, N: int, return_array: bool = False, window_size: Optional[int] = None):
        spans = spans_touching(self.attention_spans, self.offset, N) if N > 1 else []
        if not spans:
            return create_attention_mask(N, offset=self.offset, return_array=return_array, window_size=window_size)
        return span_mask(self.offset, N, 0, self.offset + N, spans, window_size)

    @property
    def state(self):
        return self.keys, self.values, self.offset

    @state.setter
    def state(self, v):
        self._materialise_all()
        self.keys, self.values, self.offset = v
        self._geom = None

    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        return self.keys is None

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        if not self.restore(None, self.offset - n):
            return 0
        return n

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return self.keys.nbytes + self.values.nbytes

    # --- raw write path (shared by update_and_fetch and restore) ---------------------------
    def _write(self, keys: mx.array, values: mx.array) -> None:
        prev = self.offset
        n = keys.shape[2]
        self._before_overwrite(prev, prev + n)
        if self.keys is None or prev + n > self.keys.shape[2]:
            B, H, _, Dk = keys.shape
            Dv = values.shape[3]
            grow = (self.step + n - 1) // self.step * self.step
            if self._reserved >= prev + n:      # within the request's rows (reserve): to its prompt's end
                grow = min(max(grow, self._certain - prev), self._reserved - prev)   # at once; the last exact
            new_k = mx.zeros((B, H, grow, Dk), keys.dtype)
            new_v = mx.zeros((B, values.shape[1], grow, Dv), values.dtype)
            if self.keys is not None:
                if prev % self.step != 0:
                    self.keys = self.keys[:, :, :prev]
                    self.values = self.values[:, :, :prev]
                self.keys = mx.concatenate([self.keys, new_k], axis=2)
                self.values = mx.concatenate([self.values, new_v], axis=2)
            else:
                self.keys, self.values = new_k, new_v
        self.offset = prev + n
        self.keys[:, :, prev : self.offset] = keys
        self.values[:, :, prev : self.offset] = values

    def _geometry(self):
        """The rows' geometry (batch, heads, dims, dtypes): growth and fit keep it, state and free reset it."""
        if self._geom is None and self.keys is not None:
            self._geom = _geometry(self.keys, self.values)
        return self._geom

    # --- snapshot protocol -------------------------------------------------------------------
    def snapshot(self, start: int) -> Optional[KVSnapshot]:
        self._check_target(start)
        if start > self.offset:
            raise CacheError(f"snapshot start {start} is past the cache offset {self.offset}")
        return self._view(start, self.offset)

    def prepare_captures(self, offsets) -> None:
        self._sched.prepare(self.offset, offsets)
        if self.offset in self._sched.offsets:
            self._sched.reach(self.offset, self._view)  # zero-width: None

    def take_captures(self) -> list:
        return self._sched.take()

    def can_restore(self, snap: Optional[KVSnapshot], target: int) -> bool:
        self._check_target(target)
        if snap is None:
            return target <= self.offset
        self._check_snapshot(snap)
        mine = self._geometry()
        theirs = snap._geometry()
        if mine is not None and theirs is not None and mine != theirs:
            raise CacheError(f"snapshot rows {theirs} do not fit this cache's rows {mine} (another layer's?)")
        return snap.start <= self.offset and snap.start < target <= snap.end

    def restore(self, snap: Optional[KVSnapshot], target: int) -> bool:
        if self._sched.active:
            raise CacheError("restore while captures are scheduled (take_captures first)")
        if not self.can_restore(snap, target):
            return False
        self._since_boundary = 0
        if snap is None:
            self.offset = target
            return True
        if snap._cache is self:
            # Intact lazy view of our own slots: the rows [start, target) are already in place.
            self.offset = target
            return True
        k, v = snap._rows()
        owned = snap._cache is None
        n = target - snap.start
        if not owned and n < k.shape[2]:     # a view of another cache: only the rows it restores
            k, v = k[:, :, :n], v[:, :, :n]
        self._write_in(snap.start, k, v, target, [snap] if owned else [])   # owned: all its rows
        return True

    def _write_in(self, start: int, k: mx.array, v: mx.array, target: int, adopted: list) -> None:
        """Write rows k, v at start (evaluated with the next forward: no sync here), rest at target, and
        make each owned snapshot of those rows a view of them (_adopt)."""
        self.offset = start
        self._note_unwritten(start, start + k.shape[2])
        self._write(k, v)
        self.offset = target
        for s in adopted:
            self._adopt(s)

    def restore_run(self, snaps, target: int) -> bool:
        """As restore(s, min(s.end, target)) for each adjacent snapshot in turn, but owned snapshots (a
        page-in of another path) are joined and written at once, then adopted: two MLX writes per layer,
        not two per node. Anything else (a view, one snapshot, captures scheduled) goes the general way."""
        if len(snaps) < 2 or self._sched.active or any(s is None or s._cache is not None for s in snaps):
            return super().restore_run(snaps, target)
        first, last = snaps[0], snaps[-1]
        if not (self.can_restore(first, min(first.end, target)) and last.start < target <= last.end):
            return False
        for a, b in zip(snaps, snaps[1:]):
            self._check_snapshot(b)
            if a.end != b.start or b._geometry() != first._geometry():
                raise CacheError(f"restore_run: [{a.start},{a.end}) and [{b.start},{b.end}) are not one run of rows")
        self._since_boundary = 0
        k = mx.concatenate([s.keys for s in snaps], axis=2)
        v = mx.concatenate([s.values for s in snaps], axis=2)
        self._write_in(first.start, k, v, target, snaps)
        return True

    def adopt(self, snap: KVSnapshot) -> bool:
        """An owned snapshot of rows the live buffer holds in place (the caller knows: it lies on the
        active path, below the offset) becomes a view of them; False (unchanged) if lazy or past it."""
        self._check_snapshot(snap)
        if snap._cache is not None or snap.end > self.offset or self.keys is None:
            return False
        self._adopt(snap)
        return True

    def _adopt(self, s: KVSnapshot) -> None:
        """An owned snapshot whose rows [start, end) were just written in place becomes a lazy view of
        them again: its arrays are dropped and its owner hears -size through the hook, so no row is
        held twice (the live buffer and a paged-out copy). Rows past the offset stay until a write
        overwrites them, which materialises the view first, as for any view."""
        size = s.size
        s.keys = s.values = None
        s._cache = self
        self._track(s)
        if s.on_materialise is not None and size:
            s.on_materialise(-size)

    def fit(self) -> int:
        """Release the buffer's growth slack at rest: keep the rows still needed (the live offset and
        every outstanding view's end) and, when the slack beyond them is at most need // rest_slack
        rows, keep that too (dropping it copies every needed row, and a next turn that appends would
        grow by another copy); past that, copy exactly the needed rows, so held bytes at rest stay
        within 1 + 1/rest_slack of rows x row bytes. Returns the bytes released. Ends the reservation.
        A request that wrote all the rows it reserved left no slack: nothing to copy."""
        self._reserved = self._certain = 0
        if self.keys is None:
            return 0
        need = max([self.offset] + [s.end for s in self._views])
        before = self.nbytes
        if self.keys.shape[2] - need <= need // self.rest_slack:
            return 0
        if need == 0:
            self.keys = self.values = self._geom = None
        else:
            self.keys, self.values, pending = _copy_pair(self.keys, self.values, 0, need)
            if pending:
                evaluate(self.keys, self.values)
        self._views_max_end = max((s.end for s in self._views), default=0)
        return before - self.nbytes

    def reserve(self, rows: int, certain: int = 0) -> None:
        """The open request writes up to `rows` rows, `certain` of them unless cancelled (its prompt's):
        the first write that must grow the buffer grows it to `certain` rows at once, so the prefill's
        later chunks write in place instead of each copying every row held into a larger buffer (as
        mlx-lm's 256-row steps do); past them growth goes in ``step`` rows, and the growth that reaches
        `rows` stops there, so a request that writes all it announced ends with no slack for ``fit``
        to copy away (a cancelled one leaves slack, which ``fit`` bounds at rest)."""
        self._reserved = rows
        self._certain = min(certain, rows)

    def merge_snapshots(self, a: Optional[KVSnapshot], b: Optional[KVSnapshot]) -> Optional[KVSnapshot]:
        for s in (a, b):
            if s is not None:
                self._check_snapshot(s)
        if a is None or b is None:
            self._release_quietly(a, b)
            return None
        return merge_kv(a, b)

    def split(self, snap: Optional[KVSnapshot], at: int):
        if snap is None:
            return None, None
        self._check_snapshot(snap)
        if not isinstance(at, int) or not snap.start < at < snap.end:
            raise CacheError(f"split point {at!r} is not strictly inside [{snap.start},{snap.end})")
        return split_kv(snap, at)

    def free(self) -> None:
        self._materialise_all()
        self.drop_ahead()
        self._sched.clear()
        self.keys = self.values = None
        self._geom = None
        self.offset = 0
        self._since_boundary = 0
        self._reserved = self._certain = 0

    def finish_forward(self, n_tokens: int) -> None:
        self._absorbed(n_tokens)

    @classmethod
    def from_state(cls, state):
        c = cls()
        c.state = state
        return c

    def to_quantized(self, group_size: int = 64, bits: int = 4):
        """mlx-lm's QuantizedKVCache of these rows (it leaves the snapshot protocol; quantized.py)."""
        from .quantized import to_quantized

        return to_quantized(self, group_size=group_size, bits=bits)


KVCache = SnapshotKVCache
