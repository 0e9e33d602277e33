"""Python's full garbage collections moved out of requests, to the runner's idle moments.

A full collection (generation 2) visits every object the cyclic collector tracks, so its pause grows
with the trie: about seven tracked objects a node of a one-layer model (Node, its children and
snapshot lists, its KV snapshot and arrays, the eviction heap's entry), more with more layers: about
0.1 s at 10^4 nodes and 0.3 s at 10^5 on the 2-core CPU (docs/benchmarks.md, "Full collections").
Python starts one when its allocation counts run out, wherever that happens: inside a forward, a
page-in, a victim choice, so the pause lands in some request's TTFT. The engine's requests leave no
cyclic garbage (their objects are freed by reference counts: tests/serve/test_collector.py), so
nothing of ours needs those passes promptly.

Invariants, while installed (one process-wide policy: the runner's main thread installs it once):
- Python never starts a full collection by itself: generation 2's threshold is out of reach.
  Generations 0 and 1 run as before (young objects only: their pauses do not grow with the trie).
- ``idle()`` (the engine's queue has stayed empty for ``quiet_s``) runs one full collection when one
  is due: at least ``due`` collections of generation 1 since the last full one (Python's own
  threshold for considering one).
- ``after_call()`` (more work waiting) runs one only past ``backstop`` x ``due`` of them, so that
  garbage from elsewhere stays bounded under load that never idles; such a pass lands between two
  calls, never inside one.
- ``uninstall()`` gives back the thresholds found.
"""
from __future__ import annotations

import gc
import time

OUT_OF_REACH = 1 << 30          # generation 2's threshold while installed: never reached


class IdleCollector:
    def __init__(self, *, quiet_s: float = 0.05, backstop: int = 100):
        if quiet_s <= 0 or backstop < 1:
            raise ValueError(f"quiet_s must be > 0 and backstop >= 1, got {quiet_s!r} and {backstop!r}")
        self.quiet_s, self.backstop = quiet_s, backstop
        self.saved: tuple | None = None
        self.due = gc.get_threshold()[2]
        self.passes = {"idle": 0, "backstop": 0}   # full collections run, by cause
        self.pause_s = 0.0                         # their time, summed

    @property
    def installed(self) -> bool:
        return self.saved is not None

    def install(self) -> "IdleCollector":
        if self.saved is None:
            self.saved = gc.get_threshold()
            self.due = max(1, self.saved[2])
            gc.set_threshold(self.saved[0], self.saved[1], OUT_OF_REACH)
        return self

    def uninstall(self) -> None:
        if self.saved is not None:
            gc.set_threshold(*self.saved)
            self.saved = None

    def pending(self) -> int:
        """Collections of generation 1 since the last full one."""
        return gc.get_count()[2]

    def idle(self) -> bool:
        """Nothing waits: a full collection if one is due. Returns whether one ran."""
        return self._collect("idle", self.due)

    def after_call(self) -> bool:
        """A call is done and more may wait: a full collection only past the backstop."""
        return self._collect("backstop", self.due * self.backstop)

    def _collect(self, cause: str, limit: int) -> bool:
        if not self.installed or self.pending() < limit:
            return False
        t0 = time.perf_counter()
        gc.collect()
        self.pause_s += time.perf_counter() - t0
        self.passes[cause] += 1
        return True

    def stats(self) -> dict:
        return {"installed": self.installed, "thresholds": list(gc.get_threshold()), "pending": self.pending(),
                "due": self.due, "backstop": self.due * self.backstop, "passes": dict(self.passes),
                "pause_s": round(self.pause_s, 4)}
