"""impl's prefix cache as the read-only view the rules read (spec.view).

The only impl module that builds spec objects (besides the scheduler's
reference rules): the rules are written once, in spec/rules.py, and impl is
judged by them through this view. impl's snapshots hold MLX arrays, not key
contents, so the view shows ranges, sizes and laziness but no contents
(content None); the stateful tests' abstraction decodes contents from tracer
caches, and the fuzz oracle compares logits against a cold prefill (C1).

A snapshot a node holds after it was closed shows as held and released (A2).
"""
from __future__ import annotations

from spec.trie import Layer
from spec.view import RequestView, View, freeze


def layers_of(caches) -> tuple:
    """One spec Layer per layer cache: its kind and (windowed) window; costs are
    not needed, impl reports each snapshot's size itself."""
    return tuple(Layer(None) if c is None else Layer(c.kind, window=getattr(c, "max_size", 0) or 0)
                 for c in caches)


def view(pc) -> View:
    r = pc.request
    req = None if r is None else RequestView(tuple(r.keys), tuple(map(tuple, r.spans)), r.matched, r.resume,
                                             tuple(r.schedule), tuple(r.chunks), r.prefilled)
    held = [s for n in pc.trie.nodes() for s in n.snaps if s is not None]
    return freeze(pc.root, pc.path, layers=layers_of(pc.caches), offset=pc.offset, seq=pc.seq,
                  live=[None] * len(pc.caches), counter=pc.counter, budget=pc.budget, clock=pc.clock,
                  request=req, released=[id(s) for s in held if s.closed],
                  live_offsets=[c.offset for c in pc.caches if c is not None],
                  snaps_of=lambda n: [(i, s) for i, s in enumerate(n.snaps) if s is not None])
