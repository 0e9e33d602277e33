"""Every rule of REFERENCE section 3 as a named predicate.

Each predicate takes a PrefixCache (the spec's, or impl's abstraction of
itself, which has the same shape) and returns the violations it finds, each
naming its rule id and the offending node. `check(pc)` runs them all.
Operation-level rules (G1 merge refusal, G2 merge result, S4 split halves,
E3 victim order) are predicates over an operation's inputs and outputs and
are asserted where the operation happens.
"""
from __future__ import annotations

from dataclasses import dataclass

from spec.trie import KV, state_content, walk


@dataclass(frozen=True)
class Violation:
    rule: str
    where: str
    message: str

    def __str__(self):
        return f"{self.rule} at {self.where}: {self.message}"


def where(n) -> str:
    return "root" if n.parent is None else f"node [{n.start}, {n.end})"


def phase(pc) -> str:
    r = pc.request
    if r is None:
        return "idle"
    if r.prefilled:
        return "prefilled"
    return "prefilling" if r.chunks else "begun"


# --------------------------------------------------------------- structure
def t1_offsets(pc):
    """T1: start(n) = end(parent(n)), edges non-empty, links agree."""
    out = []
    for n in walk(pc.root):
        for c in n.children:
            if c.parent is not n or c.start != n.end or not c.edge:
                out.append(Violation("T1", where(c), f"start {c.start}, parent end {n.end}, edge {len(c.edge)}"))
    return out


def t2_siblings(pc):
    """T2: siblings never share a first key."""
    out = []
    for n in walk(pc.root):
        firsts = [c.edge[0] for c in n.children if c.edge]
        if len(firsts) != len(set(firsts)):
            out.append(Violation("T2", where(n), "children share a first key"))
    return out


def t3_one_offset(pc):
    """T3: all layers rest at one offset; the active path is a root-to-node
    chain whose frontier ends at the live offset after begin and close."""
    out = []
    for i, layer in enumerate(pc.layers):
        if layer.stateful and len(pc.live[i]) != len(state_content(layer, tuple(range(pc.offset)))):
            out.append(Violation("T3", f"layer {i}", f"holds {len(pc.live[i])} positions at offset {pc.offset}"))
    if pc.path[0] is not pc.root or any(b.parent is not a for a, b in zip(pc.path, pc.path[1:])):
        out.append(Violation("T3", "active path", "not a root-to-node chain"))
    if phase(pc) in ("idle", "begun") and pc.frontier.end != pc.offset:
        out.append(Violation("T3", where(pc.frontier), f"frontier ends at {pc.frontier.end}, live offset {pc.offset}"))
    return out


# --------------------------------------------------------- snapshot coverage
def s1_kv_exact(pc):
    """S1: every KV snapshot spans exactly its node's edge and holds its keys."""
    out = []
    for n in walk(pc.root):
        keys = n.path_keys()
        for i, s in n.snaps.items():
            if s.kind == KV and ((s.start, s.end) != (n.start, n.end) or s.content != keys[n.start:n.end]):
                out.append(Violation("S1", where(n), f"layer {i} KV [{s.start}, {s.end}) content mismatch"
                                     if (s.start, s.end) == (n.start, n.end) else
                                     f"layer {i} KV [{s.start}, {s.end}) vs edge [{n.start}, {n.end})"))
    return out


def s2_whole_state_at_end(pc):
    """S2: a whole-state snapshot is the state at its node's end."""
    out = []
    for n in walk(pc.root):
        keys = n.path_keys()
        for i, s in n.snaps.items():
            if s.kind != KV and (s.end != n.end or s.content != state_content(pc.layers[i], keys)):
                out.append(Violation("S2", where(n), f"layer {i} state at {s.end} is not the state at {n.end}"))
    return out


def s3_frontier_complete(pc):
    """S3: after close the frontier holds every stateful layer."""
    f = pc.frontier
    if phase(pc) != "idle" or f is pc.root:
        return []
    missing = [i for i, layer in enumerate(pc.layers) if layer.stateful and i not in f.snaps]
    return [Violation("S3", where(f), f"frontier misses layers {missing}")] if missing else []


def s4_split(head, tail, layers) -> list:
    """S4 (operation-level): a split head gets KV halves only; whole-state
    snapshots stay on the tail."""
    out = []
    for i, s in head.snaps.items():
        if s.kind != KV or (s.start, s.end) != (head.start, head.end):
            out.append(Violation("S4", where(head), f"head got layer {i} {s.kind} [{s.start}, {s.end})"))
    for i, s in tail.snaps.items():
        if s.kind == KV and (s.start, s.end) != (tail.start, tail.end):
            out.append(Violation("S4", where(tail), f"tail layer {i} KV [{s.start}, {s.end})"))
    return out


# ------------------------------------------------------------------- media
def m_media(pc):
    """M1: no chunk ends strictly inside a non-causal item; M2: no capture is
    scheduled strictly inside one; M3: the resume is not strictly inside one."""
    r, out = pc.request, []
    if r is None:
        return out
    inside = lambda x: any(a < x < e for a, e in r.spans)
    out += [Violation("M1", f"chunk [{p}, {q})", "ends inside a non-causal item") for p, q in r.chunks if inside(q)]
    out += [Violation("M2", f"capture {c}", "scheduled inside a non-causal item") for c, _ in r.schedule if inside(c)]
    if inside(r.resume):
        out.append(Violation("M3", f"resume {r.resume}", "inside a non-causal item"))
    return out


# ------------------------------------------------- resume inside an edge
def p1_split_at_live(pc):
    """P1: right after begin the frontier ends at the resume offset and was
    the node last touched."""
    if phase(pc) != "begun":
        return []
    f = pc.frontier
    bad = f.end != pc.request.resume or (f is not pc.root and f.last_used != pc.clock)
    return [Violation("P1", where(f), f"frontier end {f.end}, resume {pc.request.resume}")] if bad else []


def p2_compacted(pc):
    """P2: at rest, no active-path node but root and frontier is a non-user
    node with exactly one child (compaction merged it; eviction compacts
    after removing a leaf, so it holds after eviction too)."""
    if phase(pc) != "idle":
        return []
    return [Violation("P2", where(n), "non-user single-child node left on the active path")
            for n in pc.path[1:-1] if not n.user and len(n.children) == 1]


# ----------------------------------------------------------------- merging
def g1_adjacent(a, b) -> bool:
    """G1: two KV snapshots merge only if the first ends where the second begins."""
    return a.end == b.start


def g2_merged(merged, node_edge, child_edge, child_user, last_used) -> list:
    """G2 (operation-level): edges concatenate, the child's user flag and
    the newer last-used time survive."""
    ok = merged.edge == node_edge + child_edge and merged.user == child_user and merged.last_used == last_used
    return [] if ok else [Violation("G2", where(merged), "merge result differs")]


# ---------------------------------------------------------------- eviction
def e2_evictable(pc, n) -> bool:
    """E2, stated here rather than taken from the cache under check: only the
    root, the frontier and branch points (two or more children) are protected."""
    return n is not pc.root and n is not pc.frontier and len(n.children) < 2


def e1_budget(pc):
    """E1 (with E2's protection): at rest, paged-out bytes are within budget
    unless every remaining node is protected."""
    if phase(pc) not in ("idle", "begun") or pc.store.counter <= pc.budget:
        return []
    if any(e2_evictable(pc, n) for n in walk(pc.root)):
        return [Violation("E1", "trie", f"{pc.store.counter} bytes over budget {pc.budget} with evictable nodes")]
    return []


def e3_victim(pc, victim) -> list:
    """E3 (operation-level): the victim is the least recently used evictable
    node, deeper then larger first."""
    best = min((n for n in walk(pc.root) if e2_evictable(pc, n)), key=pc.evict_order)
    return [] if best is victim else [Violation("E3", where(victim), f"expected {where(best)}")]


# ------------------------------------------------------------- accounting
def a1_counter(pc):
    """A1: the byte counter equals the owned bytes of the snapshots in the trie."""
    total = sum(s.nbytes(pc.layers[i]) for n in walk(pc.root) for i, s in n.snaps.items())
    return [] if total == pc.store.counter else [Violation("A1", "trie", f"counter {pc.store.counter} != {total}")]


def a2_ownership(pc):
    """A2: every snapshot is held by exactly one node (or the open request)
    or was released exactly once."""
    holders = {}
    for n in walk(pc.root):
        for s in n.snaps.values():
            holders[id(s)] = holders.get(id(s), 0) + 1
    if pc.request is not None:
        for c in pc.request.pending:
            for s in c.snaps.values():
                holders[id(s)] = holders.get(id(s), 0) + 1
    out = []
    for s in pc.store.created:
        count = holders.get(id(s), 0)
        if (s.released and count) or (not s.released and count != 1):
            out.append(Violation("A2", f"layer {s.layer} [{s.start}, {s.end})",
                                 f"held {count} times, released={s.released}"))
    return out


# --------------------------------------------------------------- oracle
def c1_cold_equivalence(pc):
    """C1: each layer's live content equals a cold prefill of the live keys."""
    return [Violation("C1", f"layer {i}", f"live state differs from a cold prefill of {pc.offset} keys")
            for i, layer in enumerate(pc.layers) if layer.stateful and pc.live[i] != pc.cold(i)]


STATIC = (t1_offsets, t2_siblings, t3_one_offset, s1_kv_exact, s2_whole_state_at_end, s3_frontier_complete,
          m_media, p1_split_at_live, p2_compacted, e1_budget, a1_counter, a2_ownership, c1_cold_equivalence)


def check(pc) -> list:
    """Every violation of every static rule."""
    return [v for rule in STATIC for v in rule(pc)]
