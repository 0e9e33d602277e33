"""Chunked-attention KV cache with whole-state snapshots (drop-in for mlx-lm's
ChunkedKVCache(chunk_size), as llama4 uses it on its chunked-attention layers).

The live buffer follows mlx-lm's algorithm step for step: the model calls ``maybe_trim_front()``
before a write, which drops the rows before ``start_position`` so that at most ``chunk_size`` rows
stay; ``update_and_fetch`` appends in place; ``keys_and_values`` returns rows
[start_position, offset). Like mlx-lm's, it has no ``make_mask`` (llama4 builds its own chunk
mask). Logits therefore match stock mlx-lm bit for bit.

Invariants (REFERENCE.md rule ids), as a whole-state layer of kind "recurrent":
- S2: a snapshot is the state at one offset o (start == end == o): the rows held at o (an owned
  copy) and their start position. Restoring it reproduces every later forward of a cache that
  reached o by any route, because the rows before start_position are never read again.
- The snapshot protocol never rewinds it (restore(None, t) only for t == offset or t == 0, and a
  snapshot only to its own offset), so no edge is ever split into it (P1). mlx-lm's own ``trim``
  keeps mlx-lm's meaning (a live rewind inside the rows held) for mlx-lm callers.
- Captures fire at forward boundaries only; merging keeps the newer state, a split leaves it on the
  tail (G2, S4, from WholeStateCache). Owned size = nbytes of the rows copied.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
from mlx_lm.models import cache as mlx_cache

from .base import CacheError, RowsSnapshot, WholeStateCache
from .captures import CaptureSchedule


class ChunkSnapshot(RowsSnapshot):
    kind = "recurrent"

    def __init__(self, offset, keys, values, start_position, layer=None):
        super().__init__(offset, keys, values, layer)
        self.start_position = start_position


class ChunkedCache(WholeStateCache, mlx_cache.ChunkedKVCache):
    kind = "recurrent"
    step = 256

    def __init__(self, chunk_size: int, layer: Optional[int] = None):
        super().__init__(layer)
        self.chunk_size = int(chunk_size)
        self.keys = self.values = None
        self.start_position = 0
        self._sched = CaptureSchedule()
        self._since_boundary = 0
        self._unevaluated: list[ChunkSnapshot] = []

    # --- mlx-lm cache interface (ChunkedKVCache's algorithm) --------------------------------
    def update_and_fetch(self, keys, values):
        out = mlx_cache.ChunkedKVCache.update_and_fetch(self, keys, values)
        self._since_boundary += keys.shape[2]
        return out

    @classmethod
    def from_state(cls, state):
        c = cls(state[3])
        c.state = state
        return c

    # --- snapshot protocol -------------------------------------------------------------------
    def _capture(self, _base: int, o: int) -> Optional[ChunkSnapshot]:
        if self.keys is None or self.offset == 0:
            return None
        k, v = self.keys_and_values()
        s = ChunkSnapshot(o, mx.contiguous(k), mx.contiguous(v), self.start_position, self.layer)
        self._unevaluated.append(s)
        return s

    def can_restore(self, snap, target: int) -> bool:
        self._check_target(target)
        if snap is None:
            return target == 0 or target == self.offset
        self._check_snapshot(snap)
        if not isinstance(snap, ChunkSnapshot):
            raise CacheError(f"not a chunked-attention snapshot: {snap!r}")
        return target == snap.end

    def restore(self, snap, target: int) -> bool:
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
                self.offset = self.start_position = 0
            return True
        self.keys, self.values = mx.contiguous(snap.keys), mx.contiguous(snap.values)
        self.offset, self.start_position = snap.end, snap.start_position
        return True

    def free(self) -> None:
        self._sched.clear()
        self._unevaluated = []
        self.keys = self.values = None
        self.offset = self.start_position = 0
        self._since_boundary = 0

    def finish_forward(self, n_tokens: int) -> None:
        if self._since_boundary == 0:      # a forward that did not reach this layer's attention
            raise CacheError(f"T3: chunked layer {self.layer} saw no write in a forward of {n_tokens}")
        self._absorbed(n_tokens)
        if self._sched.active:
            inside = self._sched.pending_in(self.offset - n_tokens + 1, self.offset - 1)
            if inside:
                raise CacheError(
                    f"capture offset {inside[0]} was strictly inside a forward of the chunked layer "
                    f"{self.layer}: cut the forward there"
                )
            if self._sched.pending_in(self.offset, self.offset):
                self._sched.reach(self.offset, self._capture)
        self._eval_captures()
