"""The abstraction function: impl's prefix cache (on tracer caches) as a
spec PrefixCache, and a canonical plain form of either for comparison."""
from __future__ import annotations

from spec.cache import PrefixCache as SpecCache, Request as SpecRequest
from spec.view import snap_size
from spec.trie import Node as SpecNode, Snapshot, state_content


def abstract(pc, layers, tracer, chunk: int) -> SpecCache:
    tracer.fresh()
    sp = SpecCache(layers, budget=pc.budget, interval=pc.interval, near_end=pc.near_end, chunk=chunk)
    mapped = {}

    def build(n, parent):
        m = SpecNode(edge=tuple(n.edge), start=n.start, parent=parent, last_used=n.last_used, user=n.user)
        mapped[id(n)] = m
        keys = m.path_keys()
        for i, s in enumerate(n.snaps):
            if s is None:
                continue
            expected = state_content(layers[i], keys[:s.end])
            snap = Snapshot(layer=i, kind=s.kind, start=s.start, end=s.end, lazy=s.lazy,
                        content=() if s.closed else tracer.snap(i, s, expected), released=s.closed)
            snap.reported = s.size        # what impl reports (the view shows it); a closed snapshot still held
                                          # shows as held and released (A2)
            m.snaps[i] = snap
            sp.trie.created.append(snap)
        for c in n.children.values():
            m.children.append(build(c, m))
        return m

    sp.trie.root = build(pc.root, None)
    sp.trie.counter = pc.counter
    # a path node no longer in the trie (evicted from under the path) shows detached (T3, E2)
    sp.path = [mapped.get(id(n)) or SpecNode(edge=tuple(n.edge), start=n.start) for n in pc.path]
    sp.offset = pc.offset
    sp.seq = list(pc.seq)
    sp.clock = pc.clock
    sp.evictions = pc.evictions
    sp.live = [() if c is None else tracer.live(i, tuple(pc.seq)) for i, c in enumerate(tracer.caches)]
    r = pc.request
    if r is not None:
        sp.request = SpecRequest(keys=r.keys, spans=list(r.spans), matched=r.matched, resume=r.resume,
                                 schedule=list(r.schedule), base=r.resume, chunks=list(r.chunks), prefilled=r.prefilled)
    return sp


def snap_bytes(pc, i: int, s) -> int:
    """A snapshot's owned bytes: impl's reported size (kept on abstracted
    snapshots), else what the spec computes for layer i."""
    return snap_size(s, pc.layers[i])


def canon(pc) -> dict:
    """A plain, comparable form of a spec PrefixCache (or an abstraction)."""
    def node(n):
        snaps = tuple((i, s.kind, s.start, s.end, s.lazy, s.content, snap_bytes(pc, i, s))
                      for i, s in sorted(n.snaps.items()))
        return (n.start, tuple(n.edge), n.user, n.last_used, snaps,
                tuple(node(c) for c in sorted(n.children, key=lambda c: repr(c.edge[0]))))
    r = pc.request
    return {"offset": pc.offset, "seq": tuple(pc.seq), "counter": pc.trie.counter, "clock": pc.clock,
            "evictions": pc.evictions,
            "path": tuple(n.end for n in pc.path), "tree": node(pc.root), "live": tuple(pc.live),
            "request": None if r is None else (r.matched, r.resume, tuple(r.chunks), r.prefilled)}


def first_difference(a, b, path="tree"):
    """Where two canon trees (spec's `a`, impl's `b`) first differ, as a readable string."""
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and len(a) == 6 \
            and isinstance(a[0], int) and isinstance(b[0], int):
        here = f"{path}/[{a[0]},{a[0] + len(a[1])})"
        names = ("start", "edge", "user", "last_used", "snapshots", "children")
        for name, x, y in zip(names, a, b):
            if name == "children":
                if len(x) != len(y):
                    return f"{here} children: spec {[c[:2] for c in x]}, impl {[c[:2] for c in y]}"
                for cx, cy in zip(x, y):
                    if cx != cy:
                        return first_difference(cx, cy, here)
            elif x != y:
                return f"{here} {name}: spec {x!r}, impl {y!r}"
    return f"{path}: spec {a!r}, impl {b!r}"
