"""Sliding-window attention cache with whole-state snapshots (drop-in for mlx-lm's
RotatingKVCache(max_size=W, keep=k): keep=0 as gemma3_text uses it, keep=4 as mlx-lm's
--max-kv-size builds it).

The live buffer follows mlx-lm's algorithm step for step (a multi-token write linearises the window
and concatenates, keeping the first k and the last W-1-k old rows; a single-token write rotates in
place inside slots [k, W)), and ``make_mask`` returns exactly what mlx-lm's cache returns, so logits match stock mlx-lm.

Invariants (REFERENCE.md rule ids):
- S2: a windowed snapshot is the state at one offset o (start == end == o): min(o, W) rows in
  temporal order, the first k positions and the newest after them (the rows every later write
  keeps). It is an owned copy; restoring it reproduces every later forward of a
  cache that reached o by any route.
- Captures fire only at write boundaries (a scheduled offset strictly inside one write is a
  CacheError naming the offset: the driver must cut the forward there). A capture at the offset
  current when scheduled is taken at once (None while the cache is empty).
- P1: a live rewind (restore(None, t), t < offset) is possible only while the window has not wrapped
  (offset <= W); a restored snapshot can be rewound to t <= its end only when its end <= W.
- Whole-state merge keeps the newer (later) state and closes the older (G2); split leaves the state
  on the tail (S4). Owned size = rows held (<= W) x bytes per row of K and V.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
from mlx_lm.models import cache as mlx_cache
from mlx_lm.models.base import create_causal_mask

from .base import CacheError, RowsSnapshot, WholeStateCache
from .captures import CaptureSchedule
from .masks import span_mask, spans_touching


class WindowSnapshot(RowsSnapshot):
    kind = "windowed"


class WindowedCache(WholeStateCache, mlx_cache.RotatingKVCache):
    """An mlx-lm RotatingKVCache for every type check."""

    kind = "windowed"
    step = 256

    def __init__(self, max_size: int, layer: Optional[int] = None, keep: int = 0):
        super().__init__(layer)
        if max_size < 1:
            raise CacheError(f"window must be >= 1, got {max_size}")
        if not 0 <= keep < max_size:
            raise CacheError(f"keep must be in [0, {max_size}), got {keep}")
        self.max_size = int(max_size)
        self.keep = int(keep)
        self.keys: Optional[mx.array] = None
        self.values: Optional[mx.array] = None
        self._idx = 0
        self._sched = CaptureSchedule()
        self._since_boundary = 0
        self._unevaluated: list[WindowSnapshot] = []

    @property
    def window(self) -> int:
        return self.max_size

    # --- buffer algorithm (mlx-lm RotatingKVCache) ------------------------------------------------
    def _temporal_order(self, v: mx.array) -> mx.array:
        if self._idx == v.shape[2]:
            return v
        if self._idx < self.offset:
            k = self.keep
            parts = [v[..., :k, :]] if k else []
            return mx.concatenate(parts + [v[..., self._idx :, :], v[..., k : self._idx, :]], axis=2)
        return v[..., : self._idx, :]

    def _trim(self, trim: int, v: mx.array) -> mx.array:
        """Drop `trim` rows after the first `keep` (mlx-lm's RotatingKVCache._trim)."""
        if trim <= 0:
            return v
        if self.keep == 0:
            return v[..., trim:, :]
        return mx.concatenate([v[..., : self.keep, :], v[..., trim + self.keep :, :]], axis=2)

    def _update_concat(self, keys, values):
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = self._temporal_order(self.keys)
            self.values = self._temporal_order(self.values)
            self._idx = self.keys.shape[2]
            trim = self._idx - self.max_size + 1
            self.keys = self._trim(trim, self.keys)
            self.values = self._trim(trim, self.values)
            self.keys = mx.concatenate([self.keys, keys], axis=2)
            self.values = mx.concatenate([self.values, values], axis=2)
        self.offset += keys.shape[2]
        self._idx = self.keys.shape[2]
        return self.keys, self.values

    def _update_in_place(self, keys, values):
        B, H, S, Dk = keys.shape
        prev = self.offset
        if self.keys is None or (prev >= self.keys.shape[2] and self.keys.shape[2] < self.max_size):
            new_size = min(self.step, self.max_size - prev)
            new_k = mx.zeros((B, H, new_size, Dk), keys.dtype)
            new_v = mx.zeros((B, values.shape[1], new_size, values.shape[3]), values.dtype)
            if self.keys is not None:
                self.keys = mx.concatenate([self.keys, new_k], axis=2)
                self.values = mx.concatenate([self.values, new_v], axis=2)
            else:
                self.keys, self.values = new_k, new_v
            self._idx = prev
        trim = self.keys.shape[2] - self.max_size
        if trim > 0:
            self.keys = self._trim(trim, self.keys)
            self.values = self._trim(trim, self.values)
            self._idx = self.max_size
        if self._idx == self.max_size:
            self._idx = self.keep
        self.keys[..., self._idx : self._idx + S, :] = keys
        self.values[..., self._idx : self._idx + S, :] = values
        self.offset += S
        self._idx += S
        return self.keys_and_values()

    # --- mlx-lm cache interface --------------------------------------------------------------
    def update_and_fetch(self, keys: mx.array, values: mx.array):
        n = keys.shape[2]
        prev = self.offset
        if self._sched.active:
            inside = [o for o in self._sched.pending_in(prev + 1, prev + n - 1)]
            if inside:
                raise CacheError(
                    f"capture offset {inside[0]} is strictly inside a write [{prev},{prev + n}) of the "
                    f"windowed layer {self.layer}: cut the forward there"
                )
            if self._sched.pending_in(prev, prev):
                self._sched.reach(prev, self._capture)
        out = self._update_in_place(keys, values) if n == 1 else self._update_concat(keys, values)
        self._since_boundary += n
        if self._sched.active and self._sched.pending_in(self.offset, self.offset):
            self._sched.reach(self.offset, self._capture)
        return out

    def keys_and_values(self):
        if self.offset < self.keys.shape[2]:
            return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]
        return self.keys, self.values

    def make_mask(self, N: int, window_size: Optional[int] = None, return_array: bool = False):
        if N > 1:
            window_size = window_size or self.max_size
            kept = min(self.max_size - 1, self.offset)
            spans = spans_touching(self.attention_spans, self.offset, N)
            if spans:
                return span_mask(self.offset, N, self.offset - kept, kept + N, spans, window_size)
            if kept + N > window_size or return_array:
                return create_causal_mask(N, kept, window_size=window_size)
            return "causal"
        if window_size is None:
            return None
        if self.offset >= window_size and self.max_size > window_size:
            idx = self._idx
            if idx >= self.max_size:
                idx = 0
            mask_size = self.offset + 1 if self.offset < self.max_size else self.max_size
            mask = mx.arange(mask_size) >= (mask_size - window_size)
            return mx.roll(mask, shift=idx + 1)
        return None

    @property
    def state(self):
        return self.keys, self.values, self.offset, self.keep, self.max_size, self._idx

    @state.setter
    def state(self, v):
        self.keys, self.values, self.offset, self.keep, self.max_size, self._idx = v

    def size(self) -> int:
        return min(self.offset, self.max_size)

    def empty(self) -> bool:
        return self.keys is None

    def is_trimmable(self) -> bool:
        return self.offset < self.max_size

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        if n and n == self.offset and self.is_trimmable() and not self._sched.active:
            self.offset = self._idx = 0     # as mlx-lm: the buffer stays (empty() False, nbytes kept)
            self._since_boundary = 0
            return n
        return n if self.restore(None, self.offset - n) else 0

    @classmethod
    def from_state(cls, state):
        c = cls(state[4], keep=state[3])
        c.state = state
        return c

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    # --- snapshot protocol -------------------------------------------------------------------
    def _window_rows(self):
        """min(offset, W) rows in temporal order: the first `keep` and the newest after them (views
        of the buffer, or a concatenation when keep > 0 and rows are dropped between)."""
        k, v = self._temporal_order(self.keys), self._temporal_order(self.values)
        rows = min(self.offset, self.max_size)
        if k.shape[2] > rows and self.keep:
            return self._trim(k.shape[2] - rows, k), self._trim(v.shape[2] - rows, v)
        return k[..., k.shape[2] - rows :, :], v[..., v.shape[2] - rows :, :]

    def _capture(self, _base: int, o: int) -> Optional[WindowSnapshot]:
        if self.keys is None or self.offset == 0:
            return None
        k, v = self._window_rows()
        s = WindowSnapshot(o, mx.contiguous(k), mx.contiguous(v), self.layer)
        self._unevaluated.append(s)
        return s

    def can_restore(self, snap: Optional[WindowSnapshot], target: int) -> bool:
        self._check_target(target)
        if snap is None:
            return target == 0 or target == self.offset or (target < self.offset <= self.max_size)
        self._check_snapshot(snap)
        if snap.keys is not None and self.keys is not None:
            if snap.keys.shape[:2] + snap.keys.shape[3:] != self.keys.shape[:2] + self.keys.shape[3:]:
                raise CacheError("snapshot rows do not fit this cache's rows (another layer's?)")
        return target == snap.end or (snap.end <= self.max_size and target <= snap.end)

    def restore(self, snap: Optional[WindowSnapshot], target: int) -> bool:
        if self._sched.active:
            raise CacheError("restore while captures are scheduled (take_captures first)")
        self._eval_captures()                # a pending page-out: in this page-in's evaluation, before the next
                                             # forward writes the buffer it reads in place
        if not self.can_restore(snap, target):
            return False
        self._since_boundary = 0
        if snap is None:
            if target == 0:
                self.keys = self.values = None
                self.offset = self._idx = 0
            elif target != self.offset:    # rewind inside an unwrapped window (rows are in order)
                self.offset = self._idx = target
            return True
        if target == 0:
            self.keys = self.values = None
            self.offset = self._idx = 0
            return True
        rows = snap.keys.shape[2]
        keep = rows - (snap.end - target)  # rewinding inside an unwrapped window drops the newest rows
        # fresh array objects: in-place writes to the live buffer must never touch the snapshot
        self.keys = mx.contiguous(snap.keys[..., :keep, :])
        self.values = mx.contiguous(snap.values[..., :keep, :])
        self.offset = target
        self._idx = keep
        return True

    def free(self) -> None:
        self._sched.clear()
        self._unevaluated = []
        self.keys = self.values = None
        self.offset = self._idx = 0
        self._since_boundary = 0

    def finish_forward(self, n_tokens: int) -> None:
        self._absorbed(n_tokens)
        self._eval_captures()
