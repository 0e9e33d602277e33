"""The outstanding lazy views of one live KV buffer (kv.py's cache keeps them through this mixin).

Invariants (REFERENCE.md rule ids):
- A lazy view holds no array, only (cache, start, end). Before any write overwrites slots [p, q) (a
  prefill or decode after a rewind, a restore writing rows) or the buffer is freed, the cache copies
  out ("materialises") every view overlapping those slots and fires its ``on_materialise`` hook
  exactly once (A1). The overlap test is skipped in O(1) when the write starts at or above every
  view's end, which is the case for every ordinary append, so outstanding views cost nothing per
  decode step and never keep the buffer from being updated in place.
- ``before_write(n)`` copies out what the next write of n rows overwrites ahead of the model's
  forward (all layers in one evaluation: factory.py; none where the rows are copied on the host,
  host_rows.py); ``would_copy(n)`` says exactly whether it has anything to copy.
- Copies made ahead (``copy_ahead``, with the evaluation of the forward before the write) leave a view
  lazy (size 0, no hook) until that write takes them over; ``drop_ahead`` (or any other write) lets
  copies not taken over go.
- During a page-in, a view outside the rows the restores wrote copies from the buffer as it was before
  them (``_readable``), so the page-in's evaluation never evaluates a write.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from .evaluation import after_block, evaluate
from .kv_snapshot import KVSnapshot, _copy_rows


class LiveViews:
    """Views bookkeeping for a cache with ``keys``, ``values``, ``offset`` and ``layer`` (kv.py). Sets
    ``_views``, ``_views_max_end``, ``_clear``, ``_ahead`` and ``_unwritten`` in ``_init_views``."""

    def _init_views(self) -> None:
        self._views: set[KVSnapshot] = set()
        self._views_max_end = 0  # upper bound of the ends of outstanding views
        self._clear = (0, 0)     # slots [lo, hi) that no outstanding view overlaps (the last write's, copied out)
        self._ahead: list[KVSnapshot] = []   # views holding copies made ahead of the write they await
        self._unwritten = None   # (keys, values, lo, hi): the buffer before a page-in wrote rows [lo, hi)

    @property
    def outstanding_views(self) -> int:
        return len(self._views)

    def before_write(self, n: int) -> None:
        self._before_overwrite(self.offset, self.offset + n)

    def would_copy(self, n: int) -> bool:
        return bool(self._overlapping(self.offset, self.offset + n))

    def _overlapping(self, p: int, q: int) -> list:
        """The outstanding views overlapping slots [p, q): none past every view's end (an append, the
        common case) or inside the slots the last copy-out cleared (the restored rows' writes after a
        page-in's one pass), both in O(1)."""
        if not self._views or p >= self._views_max_end or (self._clear[0] <= p and q <= self._clear[1]):
            return []
        return [s for s in self._views if s.start < q and s.end > p]

    def _before_overwrite(self, p: int, q: int) -> None:
        """Materialise every outstanding view overlapping slots [p, q); copies made ahead for another
        write are dropped (the write they were made for has come)."""
        views = self._overlapping(p, q)
        if views:
            self._materialise_views(views)
            self._views_max_end = max((s.end for s in self._views), default=0)
            self._clear = (p, q)
        if self._ahead:
            self.drop_ahead()

    def copy_ahead(self, n: int) -> None:
        """Copy out now, from the buffer this forward just wrote, the rows of every view the next write
        of n rows at the offset will overwrite, with this forward's evaluation; that write's
        before_write takes the copies over and evaluates nothing. Until then the views stay lazy (size
        0, no hook): a cancel in between leaves them as they were, and the copies go (drop_ahead)."""
        for s in self._overlapping(self.offset, self.offset + n):
            if s._ahead is None:
                s._ahead = (_copy_rows(self.keys, s.start, s.end), _copy_rows(self.values, s.start, s.end))
                evaluate(*s._ahead)
                self._ahead.append(s)

    def drop_ahead(self) -> None:
        """Let every copy made ahead and not taken over go (its views stay lazy)."""
        for s in self._ahead:
            s._ahead = None
        self._ahead.clear()

    def _track(self, s: KVSnapshot) -> None:
        """A new outstanding view: cleared slots keep only their part past it (writes move forward)."""
        self._views.add(s)
        self._views_max_end = max(self._views_max_end, s.end)
        lo, hi = self._clear
        if s.start < hi and s.end > lo:
            self._clear = (min(max(lo, s.end), hi), hi)

    def _materialise_all(self) -> None:
        self._materialise_views(list(self._views))
        self._views_max_end = 0

    @staticmethod
    def _materialise_views(views) -> None:
        """Copy several views out with one evaluation (before any write to the buffer they read); views
        copied ahead or on the host (host_rows.py) need none."""
        pending = [a for s in views for a in s._materialise(now=False)]
        if pending:
            evaluate(*pending)

    def _readable(self, start: int, end: int) -> tuple[mx.array, mx.array]:
        """The buffer a view of rows [start, end) copies from: as it was before the open page-in's
        restores wrote into it, when the view lies outside the rows written (they are the same there,
        and that buffer is evaluated), so the copy does not evaluate the pending write; else the
        buffer itself. (A write evaluated with copies that still read the old buffer makes MLX copy
        the whole buffer; left to the forward, it is done in place: tests/impl/test_caches_kv_writes.py.)"""
        u = self._unwritten
        if u is not None and (end <= u[2] or start >= u[3]):
            return u[0], u[1]
        return self.keys, self.values

    def _view(self, start: int, end: int) -> Optional[KVSnapshot]:
        if self.keys is None or end <= start:
            return None
        s = KVSnapshot(start, end, self.layer, cache=self)
        self._track(s)
        return s

    def _note_unwritten(self, lo: int, hi: int) -> None:
        """Keep a handle on the buffer before a restore's first write (``astype`` to its own dtype
        returns the same array: the write updates self.keys, not it) and the rows written since,
        until the open deferred_eval block has evaluated its copies (at once outside a block)."""
        u = self._unwritten
        if u is not None:
            self._unwritten = (u[0], u[1], min(lo, u[2]), max(hi, u[3]))
        elif self.keys is not None:
            self._unwritten = (self.keys.astype(self.keys.dtype), self.values.astype(self.values.dtype), lo, hi)
            after_block(self._forget_unwritten)      # held until the open evaluation block ends

    def _forget_unwritten(self) -> None:
        self._unwritten = None
