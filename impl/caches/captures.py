"""Capture schedule: the offsets at which a layer cache pages out snapshots while writes cross them.

Invariants:
- Scheduled offsets are sorted, unique and not yet passed (each >= the cache offset when scheduled);
  anything else is a ``CacheError``. A new schedule may be made only after ``take()`` drained the
  previous one (its captures would leak, A2).
- ``take()`` returns one entry per scheduled offset, in order: the snapshot captured there, or None
  when the offset was not crossed or its range was zero-width. It clears the schedule.
- ``base`` is the running capture cursor: the previous scheduled offset that was reached (initially
  the offset at scheduling time). A KV capture at o is the range [base, o), so consecutive captures
  tile the prompt exactly like the trie edges they will be attached to (S1). Write boundaries between
  scheduled offsets never move it.
"""

from __future__ import annotations

from typing import Callable, Optional

from .base import CacheError, Snapshot


class CaptureSchedule:
    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.captured: list[Optional[Snapshot]] = []
        self.reached: list[bool] = []
        self.base = 0
        self.active = False

    def prepare(self, current: int, offsets) -> None:
        if self.active:
            raise CacheError("prepare_captures: previous schedule not taken (take_captures first)")
        offs = list(offsets)
        for i, o in enumerate(offs):
            if not isinstance(o, int) or isinstance(o, bool):
                raise CacheError(f"prepare_captures: offset {o!r} is not an int")
            if o < 0:
                raise CacheError(f"prepare_captures: negative offset {o}")
            if o < current:
                raise CacheError(f"prepare_captures: offset {o} already passed (offset {current})")
            if i and o <= offs[i - 1]:
                raise CacheError(f"prepare_captures: offsets must be sorted and unique, got {offs}")
        self.offsets = offs
        self.captured = [None] * len(offs)
        self.reached = [False] * len(offs)
        self.base = current
        self.active = True

    def take(self) -> list[Optional[Snapshot]]:
        out = self.captured
        self.offsets, self.captured, self.reached = [], [], []
        self.active = False
        return out

    def pending_in(self, lo: int, hi: int) -> list[int]:
        """Unreached scheduled offsets o with lo <= o <= hi, ascending."""
        return [o for o, r in zip(self.offsets, self.reached) if not r and lo <= o <= hi]

    def reach(self, o: int, capture: Callable[[int, int], Optional[Snapshot]]) -> None:
        """Mark scheduled offset o reached, storing capture(base, o), and advance base to o."""
        i = self.offsets.index(o)
        if self.reached[i]:
            return
        self.captured[i] = capture(self.base, o)
        self.reached[i] = True
        self.base = o

    def clear(self) -> None:
        """Drop the schedule, closing anything captured and not taken."""
        for s in self.captured:
            if s is not None and not s.closed:
                s.release()
        self.take()
