"""Helpers for the spec's own tests: the driver convention, a
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
from spec.media import keys_of, noncausal_spans
from spec.rules import check, check_step
from spec.trie import Layer
from spec.view import Op

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


def observe(pc, name, *args, media=()):
    """Run operation `name` on the spec cache; return (before, Op, after): the
    views around it and the Op the operation rules judge (begin's args are
    the prompt's keys and non-causal spans; victims as the spec evicted them)."""
    before, evicted = pc.view(), len(pc.victims)
    out = pc.begin(list(args[0]), media) if name == "begin" else getattr(pc, name)(*args)
    op_args = (keys_of(list(args[0]), media), tuple(noncausal_spans(media))) if name == "begin" else args
    op = Op(name, op_args, out if name == "begin" else None, tuple(pc.victims[evicted:]))
    return before, op, pc.view(), out


def do(pc, name, *args, media=()):
    """Run an operation; every state and operation rule holds after it."""
    before, op, after, out = observe(pc, name, *args, media=media)
    violations = check(after) + check_step(before, op, after)
    assert violations == [], f"after {name}: " + "\n".join(map(str, violations))
    return out


def op_rules(pc, name, *args, media=()) -> set:
    """Run an operation unchecked; the ids of the state and operation rules it breaks."""
    before, op, after, _ = observe(pc, name, *args, media=media)
    return {v.rule for v in check(after) + check_step(before, op, after)}


def begin(pc, tokens, media=()):
    return do(pc, "begin", tokens, media=media)


def finish(pc, tokens, gen):
    """prefill, decode per the driver convention, close; check after each."""
    do(pc, "prefill")
    do(pc, "step", tokens[-1])
    for g in gen[:-1]:
        do(pc, "step", g)
    do(pc, "close")


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
    return "\n".join(tree(pc)) + f"\ncounter={pc.trie.counter} offset={pc.offset}"
