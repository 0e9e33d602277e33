"""The engines alive in this process, for the oracles that count what they hold (A2, MEM).

A2: every snapshot alive process-wide (impl.caches.base.live_snapshots) is held by a trie node of a
registered engine; `teardown` closes what an engine's trie holds and frees its live caches, and
returns the snapshots still alive that no live engine holds (0 unless something leaked).
"""
from __future__ import annotations

from impl.caches.base import live_snapshots
from impl.trie import walk


ALIVE: list = []
_BASE = {"snapshots": 0}


def held_snapshots(pc) -> int:
    return sum(1 for n in walk(pc.root) for s in n.snaps if s is not None)


def register(engine) -> None:
    if not ALIVE:
        _BASE["snapshots"] = live_snapshots()
    ALIVE.append(engine)


def teardown(engine) -> int:
    """Close every snapshot the engine's trie holds and free its live caches; returns the number
    of snapshots still alive that no live engine holds (A2: 0). A non-zero count is absorbed into
    the baseline so that other engines' checks stay meaningful; the caller reports it."""
    pc = engine.pc
    for n in list(walk(pc.root)):
        for i, s in enumerate(n.snaps):
            if s is not None:
                pc.trie.disown(n, i).release()
    for c in engine.caches:
        if c is not None:
            c.free()
    if engine in ALIVE:
        ALIVE.remove(engine)
    leaked = live_snapshots() - _BASE["snapshots"] - sum(held_snapshots(e.pc) for e in ALIVE)
    _BASE["snapshots"] += leaked
    return leaked


def loaded_weight_bytes() -> int:
    from impl.models import _loaded
    return sum(lm.weight_bytes for lm in _loaded.values())


def engines_bytes() -> int:
    return sum(sum(c.nbytes for c in e.caches if c is not None) + e.pc.counter for e in ALIVE)
