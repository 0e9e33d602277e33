"""The layer-cache snapshot protocol shared by every cache kind.

A layer cache holds one model layer's attention or recurrent state for the live token stream; a
snapshot is that state paged out of it. This module defines the errors, the snapshot base class, the
abstract layer cache and the process-wide live-snapshot counter. The concrete kinds live in kv.py
(sliceable), windowed.py, recurrent.py and chunked.py (whole-state), composite.py (mlx-lm's
CacheList: sliceable when every part is) and quantized.py (to_quantized; no snapshots); docs/caches.md maps each mlx-lm
cache class to ours.

Invariants kept here (REFERENCE.md rule ids):
- A2: every snapshot is created exactly once and released exactly once (``release()``, the spec's
  name). ``live_snapshots()`` counts the snapshots created and not yet released (``closed``);
  releasing twice raises ``CacheError("A2: ...")``.
- A1: ``Snapshot.size`` is the number of bytes the snapshot owns. A lazy KV view owns 0 until it
  materialises; then ``on_materialise(delta)`` fires exactly once with the bytes it now owns, so an
  owner's byte counter always equals the sum of ``size`` over what it holds.
- G1: merging is defined only for adjacent snapshots; non-adjacent KV merges raise ``MergeError``
  whose message starts with "G1:". Nothing is ever concatenated silently.
- Bad input (negative offsets, a snapshot of another kind or layer, a closed snapshot) raises
  ``CacheError``; an unreachable restore target returns False and leaves the cache unchanged.
- Ownership: a snapshot has one owner, the caller it was returned to (``snapshot``,
  ``take_captures``, ``merge_snapshots``, ``split``). ``merge_snapshots`` and ``split`` consume their
  inputs; ``restore`` and ``can_restore`` only read theirs; the owner ends a snapshot with
  ``release()``. Each method of ``LayerCache`` and ``Snapshot`` below states its part in one line.
- Names: no snapshot-protocol method shares a name with an mlx-lm cache protocol. ``merge_snapshots``
  is not mlx-lm's batching ``merge(caches)``, and a layer cache has no ``merge`` attribute at all
  (``hasattr(c, "merge")`` is False, even on the subclasses of mlx-lm's classes): mlx-lm's
  batchability test (server ``is_batchable``, generate ``_merge_caches``) comes out false, so
  mlx-lm serves such a model sequentially, and a forced batch stops at mlx-lm's own ValueError
  "... does not yet support batching with history". Batching is refused rather than implemented
  because one set of live caches serves one token stream (REFERENCE section 1, T3): a batch cache
  would hold several streams at different offsets, and lazy KV views and captures describe one.
- Every cache supports ``finish_forward(n)`` (called after each model forward of n tokens) and an
  ``attention_spans`` list of absolute [start, end) ranges of non-causal media items in the current
  forward (M1), which attention caches honour in ``make_mask``.
"""

from __future__ import annotations

import itertools
from typing import Callable, Optional

from .evaluation import evaluate

KINDS = ("kv", "windowed", "recurrent")

_live = 0
_cache_ids = itertools.count(1)


def live_snapshots() -> int:
    """Number of snapshots created and not yet closed, process-wide (A2 leak checks)."""
    return _live


class CacheError(ValueError):
    """Bad input to a layer cache; the message names the problem (and a rule id where one applies)."""


class MergeError(CacheError):
    """merge() of snapshots that are not adjacent (G1)."""


class Snapshot:
    """Paged-out state of one layer.

    kind: "kv" | "windowed" | "recurrent". KV: the position range [start, end). Whole-state:
    start == end == the offset the state describes. ``layer`` is the issuing cache's layer index
    (None when the cache was built outside the factory); restoring into a cache of another layer is
    refused.
    """

    kind: str = ""

    def __init__(self, start: int, end: int, layer: Optional[int] = None):
        global _live
        self.start = int(start)
        self.end = int(end)
        self.layer = layer
        self.on_materialise: Optional[Callable[[int], None]] = None
        self._closed = False
        _live += 1

    @property
    def size(self) -> int:
        """Bytes this snapshot owns now (A1); 0 for a lazy KV view until it materialises."""
        raise NotImplementedError

    @property
    def lazy(self) -> bool:
        """True while this is a view into its issuing cache's live buffer (KV only; owns no array)."""
        return False

    @property
    def closed(self) -> bool:
        return self._closed

    def release(self) -> None:
        """The owner's once-only release (A2): drops owned arrays, detaches a lazy view, counts down."""
        global _live
        if self._closed:
            raise CacheError(f"A2: {self!r} released twice")
        self._closed = True
        self.on_materialise = None
        self._release()
        if not getattr(self, "_part", False):
            _live -= 1

    def _become_part(self) -> None:
        """This snapshot becomes a part of a composite snapshot (composite.py): from now on the
        composite is what counts in ``live_snapshots()``, and releasing the composite releases it."""
        global _live
        if not getattr(self, "_part", False):
            self._part = True
            _live -= 1

    def _release(self) -> None:
        """Drop owned arrays / detach from the issuing cache (subclasses)."""

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("lazy" if self.lazy else f"{self.size}B")
        return f"<{type(self).__name__} {self.kind} [{self.start},{self.end}) layer={self.layer} {state}>"


class RowsSnapshot(Snapshot):
    """A whole-state snapshot that is a layer's K/V rows at one offset (windowed, chunked): owned
    copies, never views of the live buffer."""

    def __init__(self, offset, keys, values, layer=None):
        super().__init__(offset, offset, layer)
        self.keys, self.values = keys, values

    @property
    def size(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    def payload(self):
        return self.keys, self.values

    def _release(self) -> None:
        self.keys = self.values = None


class _NoBatching:
    """``merge`` read on a layer cache or its class raises AttributeError (so ``hasattr`` is False):
    mlx-lm's batching protocol is refused, see the module docstring."""

    def __get__(self, obj, owner):
        raise AttributeError(
            f"{owner.__name__} does not support mlx-lm's batching (merge(caches)): one live cache set "
            "serves one token stream; snapshots merge with merge_snapshots(a, b)"
        )


class LayerCache:
    """One layer's live cache plus the snapshot protocol (see REFERENCE.md section 1).

    Subclasses implement the mlx-lm cache interface their layers call and the methods below.
    """

    kind: str = ""

    def __init__(self, layer: Optional[int] = None):
        self.layer = layer
        self.cache_id = next(_cache_ids)
        self.offset = 0
        self.attention_spans: list[tuple[int, int]] = []

    # mlx-lm's models test caches for truthiness (`if cache:`); a cache object is always truthy.
    def __bool__(self) -> bool:
        return True

    merge = _NoBatching()

    # --- snapshot protocol -------------------------------------------------------------------
    def snapshot(self, start: int) -> Optional[Snapshot]:
        """A new snapshot of the live state [start, offset), owned by the caller; None if nothing to hold."""
        raise NotImplementedError

    def prepare_captures(self, offsets) -> None:
        """Schedule captures at offsets not yet passed; the cache holds them until take_captures."""
        raise NotImplementedError

    def take_captures(self) -> list:
        """Hand each scheduled capture (None where not reached) to the caller, who owns it now."""
        raise NotImplementedError

    def captures_inside(self, n: int) -> list[int]:
        """Scheduled offsets strictly inside the next write of n tokens that this cache cannot
        capture there (whole-state kinds); the forward driver must cut the forward at them."""
        return []

    def can_restore(self, snap: Optional[Snapshot], target: int) -> bool:
        """Whether restore(snap, target) would succeed (False: target unreachable); changes nothing."""
        raise NotImplementedError

    def restore(self, snap: Optional[Snapshot], target: int) -> bool:
        """Live state := the state at target (snap None: rewind); False: unchanged; caller keeps snap."""
        raise NotImplementedError

    def restore_run(self, snaps, target: int) -> bool:
        """restore(s, min(s.end, target)) for each of adjacent snapshots in turn (a path's ranges); a kind
        may write them at once. False at the first refusal (earlier ones stay); caller keeps snaps."""
        for s in snaps:
            if not self.restore(s, min(s.end, target)):
                return False
        return True

    def merge_snapshots(self, a: Optional[Snapshot], b: Optional[Snapshot]) -> Optional[Snapshot]:
        """Consumes a and b (each is closed or becomes the result); the caller owns the result."""
        raise NotImplementedError

    def split(self, snap: Optional[Snapshot], at: int):
        """Consumes snap (closed, or kept as the tail); returns (head, tail), both the caller's."""
        raise NotImplementedError

    def free(self) -> None:
        """Drops the live state and closes captures not taken; snapshots handed out stay valid."""
        raise NotImplementedError

    def finish_forward(self, n_tokens: int) -> None:
        """After each forward of n tokens: T3 CacheError on another count; whole-state kinds capture here."""
        raise NotImplementedError

    def before_write(self, n: int) -> None:
        """The next forward writes n rows at the offset: copy out now every lazy snapshot that write would
        overwrite (as the write itself would), so a driver can batch all layers' copies into one MLX
        evaluation; kinds without lazy snapshots have nothing to do. Changes no state a reader sees."""

    def would_copy(self, n: int) -> bool:
        """True when ``before_write(n)`` has a lazy snapshot to copy out (so a driver enters its batched
        evaluation only then: once per decode step otherwise). Changes no state."""
        return False

    def copy_ahead(self, n: int) -> None:
        """Inside the evaluation of a forward that just wrote: start the copies ``before_write(n)`` will
        need at the next write, so that write evaluates none (kinds without lazy snapshots: nothing).
        Changes no state a reader sees; copies not taken over go at that write or ``drop_ahead``."""

    def drop_ahead(self) -> None:
        """Let the copies made ahead go, unused (a request ending before the write they awaited)."""

    def reserve(self, rows: int, certain: int = 0) -> None:
        """A hint for the open request: it writes up to `rows` rows in all, `certain` of them unless
        cancelled; a growing buffer may grow to `certain` at once and size its last growth to `rows`
        (kinds of bounded size ignore it). Changes no state a reader sees."""

    # --- shared argument checks --------------------------------------------------------------
    def _absorbed(self, n_tokens: int) -> None:
        """T3: the forward that just finished wrote exactly n_tokens rows into this layer; resets the
        count (``_since_boundary``, kept by the write path) for the next forward."""
        if self._since_boundary != n_tokens:
            raise CacheError(
                f"T3: layer {self.layer} absorbed {self._since_boundary} tokens in this forward, "
                f"the driver says {n_tokens}"
            )
        self._since_boundary = 0

    def _check_target(self, target) -> None:
        if not isinstance(target, int) or isinstance(target, bool):
            raise CacheError(f"target offset must be an int, got {target!r}")
        if target < 0:
            raise CacheError(f"negative target offset {target}")

    def _check_snapshot(self, snap: Snapshot) -> None:
        if not isinstance(snap, Snapshot):
            raise CacheError(f"not a snapshot: {snap!r}")
        if snap.closed:
            raise CacheError(f"A2: {snap!r} is closed")
        if snap.kind != self.kind:
            raise CacheError(f"wrong kind: a {snap.kind} snapshot given to a {self.kind} cache")
        if snap.layer is not None and self.layer is not None and snap.layer != self.layer:
            raise CacheError(
                f"snapshot of layer {snap.layer} given to the cache of layer {self.layer}"
            )

    @staticmethod
    def _release_quietly(*snaps) -> None:
        for s in snaps:
            if s is not None and not s.closed:
                s.release()


class WholeStateCache(LayerCache):
    """What the two whole-state kinds (windowed, recurrent) share: a snapshot is the state at one
    offset, taken only at a write boundary (subclasses provide `_capture(base, offset)`, which adds
    the new snapshot to `_unevaluated`, and a `_sched` CaptureSchedule); merging keeps the newer state
    (G2) and splitting leaves it on the tail (S4)."""

    def _eval_captures(self) -> None:
        """Evaluate the captures taken since the last call (batched inside a deferred_eval block)."""
        live = [s.payload() for s in self._unevaluated if not s.closed]
        if live:
            evaluate(live)
        self._unevaluated = []

    def snapshot(self, start: int) -> Optional[Snapshot]:
        self._check_target(start)
        if start > self.offset:
            raise CacheError(f"snapshot start {start} is past the cache offset {self.offset}")
        return self._capture(start, self.offset)     # evaluated with the next forward (recurrent), or at the
                                                     # next restore when the buffer is written in place

    def prepare_captures(self, offsets) -> None:
        self._sched.prepare(self.offset, offsets)
        if self.offset in self._sched.offsets:
            self._sched.reach(self.offset, self._capture)
            self._eval_captures()

    def take_captures(self) -> list:
        self._eval_captures()
        return self._sched.take()

    def captures_inside(self, n: int) -> list[int]:
        if not self._sched.active or n < 2:
            return []
        return self._sched.pending_in(self.offset + 1, self.offset + n - 1)


    def merge_snapshots(self, a: Optional[Snapshot], b: Optional[Snapshot]) -> Optional[Snapshot]:
        for s in (a, b):
            if s is not None:
                self._check_snapshot(s)
        if a is not None and b is not None and a.end > b.end:
            raise MergeError(f"G1: merge order: the older state (offset {a.end}) is after the newer ({b.end})")
        self._release_quietly(a)
        return b

    def split(self, snap: Optional[Snapshot], at: int):
        if snap is None:
            return None, None
        self._check_snapshot(snap)
        if not isinstance(at, int) or not 0 < at < snap.end:
            raise CacheError(f"split point {at!r} is not strictly inside (0, {snap.end})")
        return None, snap
