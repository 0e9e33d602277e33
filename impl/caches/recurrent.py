"""Recurrent (SSM / gated-delta / conv) layer cache with whole-state snapshots (drop-in for
mlx-lm's ArraysCache(size), as qwen3_next and mamba2 use it).

The layer reads and replaces its state slots (``cache[i]``, ``cache[i] = x``) and calls
``advance(n)``; it never reports a token count the cache could trust, so the forward driver calls
``finish_forward(n)`` after each model forward of n tokens: that is where the offset moves and
where captures fire.

Invariants (REFERENCE.md rule ids):
- S2: a recurrent snapshot is the full state at one offset o (start == end == o), owned (compact
  copies of the slots, evaluated when the forward finishes).
- The state cannot rewind: restore(None, t) works only for t == offset (or t == 0: reset to empty);
  restore(s, t) only for t == s.end (P1: never split into a recurrent layer's edge).
- Captures fire only at forward boundaries; a scheduled offset strictly inside a forward is a
  CacheError naming it (the driver must cut the forward there).
- Whole-state merge keeps the newer state and closes the older (G2); split leaves the state on the
  tail (S4). Owned size = total nbytes of the state arrays.
- ``attention_spans`` is accepted and ignored: a recurrent layer has no attention mask.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
from mlx_lm.models import cache as mlx_cache

from .base import CacheError, Snapshot, WholeStateCache
from .captures import CaptureSchedule


class StateSnapshot(Snapshot):
    kind = "recurrent"

    def __init__(self, offset, arrays, layer=None):
        super().__init__(offset, offset, layer)
        self.arrays: Optional[list] = arrays
        self._nbytes = sum(a.nbytes for a in arrays or () if a is not None)   # arrays never change

    @property
    def size(self) -> int:
        return 0 if self.arrays is None else self._nbytes

    def payload(self):
        return self.arrays

    def _release(self) -> None:
        self.arrays = None


class RecurrentCache(WholeStateCache, mlx_cache.ArraysCache):
    """An mlx-lm ArraysCache for every type check (mamba writes its state only into one)."""

    kind = "recurrent"

    def __init__(self, size: int, layer: Optional[int] = None, left_padding=None):
        super().__init__(layer)
        self.cache: list = [None] * size
        self.left_padding = mx.array(left_padding) if left_padding else None   # as ArraysCache
        self.lengths = None
        self._advanced = 0
        self._sched = CaptureSchedule()
        self._unevaluated: list[StateSnapshot] = []

    # --- mlx-lm cache interface (ArraysCache) ------------------------------------------------
    def __getitem__(self, idx):
        return self.cache[idx]

    def __setitem__(self, idx, value):
        self.cache[idx] = value

    @property
    def state(self):
        """mlx-lm's (cache, left_padding, lengths) plus the offset, which an ArraysCache does not
        keep but T3 needs after save_prompt_cache / load_prompt_cache; a 3-tuple sets offset 0."""
        return self.cache, self.left_padding, self.lengths, self.offset

    @state.setter
    def state(self, v):
        self.cache, self.left_padding, self.lengths = v[:3]
        self.offset = int(v[3]) if len(v) > 3 else 0

    @property
    def batch_size(self) -> int:
        for c in self.cache:
            if c is not None:
                return c.shape[0]
        return 1

    def advance(self, N: int) -> None:
        self._advanced += N
        if self.lengths is not None:
            self.lengths -= N
        if self.left_padding is not None:
            self.left_padding -= N

    def make_mask(self, N: int):
        pos = mx.arange(N)
        mask = None
        if self.left_padding is not None:
            mask = pos >= self.left_padding[:, None]
        if self.lengths is not None:
            in_length = pos < self.lengths[:, None]
            mask = in_length if mask is None else (mask & in_length)
        return mask

    def empty(self) -> bool:
        return self.cache[0] is None

    def is_trimmable(self) -> bool:
        return False

    def size(self) -> int:
        return 0

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.cache if c is not None)

    # --- snapshot protocol -------------------------------------------------------------------
    def _capture(self, _base: int, o: int) -> Optional[StateSnapshot]:
        if all(c is None for c in self.cache):
            return None
        arrays = [None if c is None else mx.contiguous(c) for c in self.cache]
        s = StateSnapshot(o, arrays, self.layer)
        self._unevaluated.append(s)
        return s

    def can_restore(self, snap: Optional[StateSnapshot], target: int) -> bool:
        self._check_target(target)
        if snap is None:
            return target == 0 or target == self.offset
        self._check_snapshot(snap)
        if len(snap.arrays) != len(self.cache):
            raise CacheError(f"snapshot has {len(snap.arrays)} state slots, this cache {len(self.cache)}")
        for a, c in zip(snap.arrays, self.cache):
            if a is not None and c is not None and (a.shape != c.shape or a.dtype != c.dtype):
                raise CacheError("snapshot state does not fit this cache's state (another layer's?)")
        return target == snap.end

    def restore(self, snap: Optional[StateSnapshot], target: int) -> bool:
        if self._sched.active:
            raise CacheError("restore while captures are scheduled (take_captures first)")
        # (a page-out left pending by snapshot() stays pending: the next forward evaluates it, and the
        # live slots are replaced, never written in place)
        if not self.can_restore(snap, target):
            return False
        self._advanced = 0
        if snap is None:
            if target == 0:
                self.cache = [None] * len(self.cache)
                self.offset = 0
            return True
        # fresh array objects, so nothing done to the live slots can reach the snapshot
        self.cache = [None if a is None else mx.contiguous(a) for a in snap.arrays]
        self.offset = snap.end
        return True

    def free(self) -> None:
        self._sched.clear()
        self._unevaluated = []
        self.cache = [None] * len(self.cache)
        self.offset = 0
        self._advanced = 0

    def finish_forward(self, n_tokens: int) -> None:
        if self._advanced not in (0, n_tokens):
            raise CacheError(
                f"T3: recurrent layer {self.layer} advanced {self._advanced} tokens, the driver says {n_tokens}"
            )
        self._advanced = 0
        start = self.offset
        if self._sched.active:
            inside = self._sched.pending_in(start + 1, start + n_tokens - 1)
            if inside:
                self.offset = start + n_tokens
                raise CacheError(
                    f"capture offset {inside[0]} was strictly inside a forward [{start},{start + n_tokens}) "
                    f"of the recurrent layer {self.layer}: cut the forward there"
                )
        self.offset = start + n_tokens
        if self._sched.active and self._sched.pending_in(self.offset, self.offset):
            self._sched.reach(self.offset, self._capture)
        self._eval_captures()

    @classmethod
    def from_state(cls, state):
        c = cls(len(state[0]))
        c.state = state
        return c
