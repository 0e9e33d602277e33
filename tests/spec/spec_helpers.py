"""Helpers for the spec's own tests (issue 2): the driver convention, a
readable dump of the trie. (A uniquely named module, not conftest.py: the
suite has several conftest.py files and `from conftest import` would pick
whichever was imported first.) (The optional `crosshair` Hypothesis profile is
registered in the root conftest.py.)

Driver convention (docs/spec.md): after begin(tokens), prefill(), then
step(tokens[-1]) and step(g) for every produced token g except the last,
then close(). `check(pc) == []` is asserted after every operation.
"""
from __future__ import annotations

from spec.cache import PrefixCache
from spec.rules import check
from spec.trie import Layer

HYBRID = (Layer("kv", 2), Layer("windowed", 3, window=6), Layer(None), Layer("recurrent", 10))
PURE_KV = (Layer("kv", 2), Layer("kv", 1))
KV_REC = (Layer("kv", 2), Layer("recurrent", 10))
KV_WIN = (Layer("kv", 2), Layer("windowed", 3, window=6))


def ok(pc) -> None:
    """Every static rule holds."""
    violations = check(pc)
    assert violations == [], "\n".join(map(str, violations))


def rules(pc) -> set:
    return {v.rule for v in check(pc)}


def begin(pc, tokens, media=()):
    r = pc.begin(list(tokens), media)
    ok(pc)
    return r


def finish(pc, tokens, gen):
    """prefill, decode per the driver convention, close; check after each."""
    pc.prefill()
    ok(pc)
    pc.step(tokens[-1])
    for g in gen[:-1]:
        pc.step(g)
        ok(pc)
    pc.close()
    ok(pc)


def run(pc, tokens, gen, media=()):
    """One whole request; returns (matched, resume)."""
    r = begin(pc, tokens, media)
    finish(pc, tokens, gen)
    return r


SNAP_NAMES = {"kv": "kv", "windowed": "win", "recurrent": "rec"}


def tree(pc) -> list:
    """The trie as lines, depth-first, children in order:
    `<indent>[start,end) k1 k2 ... | 0:kv~ 1:win 3:rec | user *`
    (~ a lazy KV view, `user` the user flag, `*` the frontier). S1/S2 pin
    each snapshot's range, so the layer list is the whole snapshot state."""
    out = []

    def rec(n, depth):
        if n.parent is not None:
            snaps = " ".join(f"{i}:{SNAP_NAMES[s.kind]}{'~' if s.lazy else ''}" for i, s in sorted(n.snaps.items()))
            keys = " ".join(str(k) for k in n.edge)
            line = "  " * (depth - 1) + f"[{n.start},{n.end}) {keys} | {snaps}"
            if n.user:
                line += " | user"
            if n is pc.frontier:
                line += " *"
            out.append(line)
        for c in n.children:
            rec(c, depth + 1)

    rec(pc.root, 0)
    return out


def show(pc) -> str:
    return "\n".join(tree(pc)) + f"\ncounter={pc.store.counter} offset={pc.offset}"
