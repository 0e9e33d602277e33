"""What the policy mutants (tests/power/mutants.py) are made of: the layer mixes they run on, the
Mutant record, and the patch helpers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from spec.trie import Layer

KV_L, WIN, REC, NONE = Layer("kv", 16), Layer("windowed", 16, window=5), Layer("recurrent", 12), Layer(None)
MIXES = {"kv": (KV_L,), "kv_rec": (NONE, KV_L, REC), "kv_win": (KV_L, WIN), "hybrid": (KV_L, WIN, NONE, REC)}


@dataclass(frozen=True)
class Mutant:
    what: str
    spec: Callable
    impl: Callable | str          # a patch, or why impl has no such mutant
    mixes: tuple = tuple(MIXES)


def wrap(mp, cls, name, make):
    mp.setattr(cls, name, make(getattr(cls, name)))


def after_split(mp, cls, then):
    """`cls.split` (spec or impl trie) followed by then(trie, node, head)."""
    def split(orig):
        def sp(trie, node, at):
            head = orig(trie, node, at)
            then(trie, node, head)
            return head
        return sp
    wrap(mp, cls, "split", split)
