"""Every rule of REFERENCE section 3 as one named predicate over views.

A predicate reads only the read-only view (spec.view) of the cache under
check, never the cache: no eviction order, protection or reachability is
asked of it; each is stated here from REFERENCE's words. So the same code
judges the spec, impl (through its view) and every target (targets/).

  state rules      f(view) -> [Violation]                 STATE
  operation rules  f(before, op, after) -> [Violation]    OPERATION

`check(x)` runs the state rules on a view (or on anything with `.view()`);
`check_step(before, op, after)` runs the operation rules. `PREDICATES` maps
every rule id to its one predicate. A violation names its rule and the node
by key path.
"""
from __future__ import annotations

from spec.rules_eviction import (bytes_of, c2_deepest_restore, e1_budget, e2_protected, e3_order,
                                 e4_evict_shape, e5_rewind)
from spec.rules_eviction import deepest_restore, e2_evictable, victims  # noqa: F401  (read by impl and targets)
from spec.media import resume_floor
from spec.trie import KV, state_content
from spec.view import Op, View
from spec.violation import Violation, as_view, inside


# --------------------------------------------------------------- structure
def t1_offsets(v: View):
    """T1: start(n) = end(parent(n)); edges non-empty; parent and child links agree."""
    out = []
    for n in v.walk():
        for c in v.children(n):
            if c.parent != n.keys or c.start != n.end or c.end <= c.start:
                out.append(Violation("T1", str(c), f"start {c.start}, parent end {n.end}, edge {c.end - c.start}"))
    return out


def t2_siblings(v: View):
    """T2: siblings never share a first key."""
    out = []
    for n in v.walk():
        firsts = [c.keys[n.end] for c in v.children(n)]
        if len(firsts) != len(set(firsts)):
            out.append(Violation("T2", str(n), "children share a first key"))
    return out


def t3_one_offset(v: View):
    """T3: all layers rest at one offset; the active path is a root-to-node
    chain whose frontier ends at the live offset after begin and close."""
    out = []
    for i, layer in enumerate(v.layers):
        live = v.live[i] if i < len(v.live) else None
        if layer.stateful and live is not None and len(live) != len(state_content(layer, tuple(range(v.offset)))):
            out.append(Violation("T3", f"layer {i}", f"holds {len(live)} positions at offset {v.offset}"))
    if any(o != v.offset for o in v.live_offsets):
        out.append(Violation("T3", "live caches", f"layers at offsets {sorted(set(v.live_offsets))}"))
    path = v.on_path()
    if not path or not path[0].is_root or any(b.parent != a.keys for a, b in zip(path, path[1:])):
        out.append(Violation("T3", "active path", "not a root-to-node chain"))
    elif v.phase in ("idle", "begun") and v.frontier.end != v.offset:
        out.append(Violation("T3", str(v.frontier), f"frontier ends at {v.frontier.end}, live offset {v.offset}"))
    return out


# --------------------------------------------------------- snapshot coverage
def s1_kv_exact(v: View):
    """S1: every KV snapshot spans exactly its node's edge (and holds its keys)."""
    out = []
    for n in v.walk():
        for i, s in n.snaps.items():
            if s.kind != KV:
                continue
            if (s.start, s.end) != (n.start, n.end):
                out.append(Violation("S1", str(n), f"layer {i} KV [{s.start}, {s.end}) vs edge [{n.start}, {n.end})"))
            elif s.content is not None and tuple(s.content) != n.edge:
                out.append(Violation("S1", str(n), f"layer {i} KV content is not the edge's keys"))
    return out


def s2_whole_state_at_end(v: View):
    """S2: a whole-state snapshot is the state at its node's end; and a begin
    that resumes below the match (M3-floored) schedules a capture at the
    match, so the next request diverging there restores exactly."""
    out = []
    for n in v.walk():
        for i, s in n.snaps.items():
            if s.kind == KV:
                continue
            if s.end != n.end or (s.content is not None and tuple(s.content) != state_content(v.layers[i], n.keys)):
                out.append(Violation("S2", str(n), f"layer {i} state at {s.end} is not the state at {n.end}"))
    r = v.request
    m = resume_floor(r.matched, list(r.spans)) if v.phase == "begun" else 0
    if r is not None and r.resume < m and m not in {c for c, _ in r.schedule}:
        out.append(Violation("S2", f"begin of {len(r.keys)} keys", f"resumed at {r.resume} below the match "
                             f"{r.matched} without scheduling a capture there"))
    return out


def s3_frontier_complete(v: View):
    """S3: after close the frontier holds every stateful layer."""
    f = v.frontier
    if v.phase != "idle" or f.is_root:
        return []
    missing = [i for i, layer in enumerate(v.layers) if layer.stateful and i not in f.snaps]
    return [Violation("S3", str(f), f"frontier misses layers {missing}")] if missing else []


def s4_split(before: View, op: Op, after: View):
    """S4: a node split out of an existing edge gets KV-only halves: the head
    holds the first part of each KV snapshot the edge had, the tail the rest,
    and the whole-state snapshots stay on the tail, unchanged (they describe
    its end)."""
    out = []
    for b in before.walk():
        tail = after.nodes.get(b.keys)
        if b.is_root or tail is None or tail.start <= b.start:
            continue                                           # not split
        head = after.nodes.get(b.keys[:tail.start])
        for i, s in b.snaps.items():
            if s.kind != KV and (i not in tail.snaps or tail.snaps[i].end != s.end
                                 or tail.snaps[i].content != s.content):
                out.append(Violation("S4", str(tail), f"layer {i} whole-state left the tail of a split"))
            if s.kind != KV or head is None or head.start != b.start:
                continue
            for part, got, want in ((head, head.snaps.get(i), tuple(s.content or ())[:head.end - b.start]),
                                    (tail, tail.snaps.get(i), tuple(s.content or ())[head.end - b.start:])):
                if got is None or got.kind != KV or (s.content is not None and got.content is not None
                                                     and tuple(got.content) != want):
                    out.append(Violation("S4", str(part), f"layer {i} {'head' if part is head else 'tail'} is "
                                         f"not its half of the split KV snapshot"))
    return out


# ------------------------------------------------------------------- media
def m1_chunks(v: View):
    """M1: no prefill chunk ends strictly inside a non-causal item."""
    r = v.request
    return [] if r is None else [Violation("M1", f"chunk [{p}, {q})", "ends inside a non-causal item")
                                 for p, q in r.chunks if inside(q, r.spans)]


def m2_captures(v: View):
    """M2: no capture is scheduled strictly inside a non-causal item, and no
    node (so no snapshot) ends strictly inside one of the open request's items."""
    r = v.request
    if r is None:
        return []
    out = [Violation("M2", f"capture {c}", "scheduled inside a non-causal item") for c, _ in r.schedule
           if inside(c, r.spans)]
    out += [Violation("M2", str(n), "a snapshot ends inside a non-causal item") for n in v.walk()
            if n.snaps and n.keys == r.keys[:n.end] and inside(n.end, r.spans)]
    return out


def m3_resume(v: View):
    """M3: the resume offset is never strictly inside a non-causal item."""
    r = v.request
    return [Violation("M3", f"resume {r.resume}", "inside a non-causal item")] \
        if r is not None and inside(r.resume, r.spans) else []


# ------------------------------------------------- resume inside an edge
def p1_split_at_live(before: View, op: Op, after: View):
    """P1: a begin that resumes strictly inside a cached edge splits that node
    at the live offset: the head [start, live) is the frontier, was touched
    last, holds KV-only snapshots, and the tail is its child."""
    if op.name != "begin" or after.request is None:
        return []
    r = after.request
    f = after.frontier
    out = []
    if f.end != r.resume:
        out.append(Violation("P1", str(f), f"frontier ends at {f.end}, resume {r.resume}"))
    if not f.is_root and any(n.last_used > f.last_used for n in after.walk()):
        out.append(Violation("P1", str(f), "the frontier was not the node touched last"))
    cut = [b for b in before.walk() if not b.is_root and b.start < r.resume < b.end
           and b.keys[:r.resume] == r.keys[:r.resume]]
    for b in cut:
        tail = after.nodes.get(b.keys)
        if tail is None:
            continue                                            # evicted in the same begin
        if tail.parent != f.keys:
            out.append(Violation("P1", str(tail), f"tail of the edge resumed at {r.resume} is not the head's child"))
        if any(s.kind != KV for s in f.snaps.values()):
            out.append(Violation("P1", str(f), "the split head holds whole-state snapshots"))
    return out


def p2_compaction(before: View, op: Op, after: View):
    """P2: compaction merges a non-user single-child node into its child only
    when no restore point is lost. After an operation, at rest, no active-path
    node but root and frontier is a non-user single-child node without
    whole-state (it should have been merged); and no whole-state checkpoint or
    user node of `before` is gone from `after` unless its node was evicted
    (E4), where the target reports its victims."""
    out = []
    if after.phase == "idle":
        out += [Violation("P2", str(n), "non-user single-child node without whole-state left on the active path")
                for n in after.on_path()[1:-1]
                if not n.user and len(n.children) == 1 and all(s.kind == KV for s in n.snaps.values())]
    if op.evicted is not None:
        kept = {(n.keys, i) for n in after.walk() for i, s in n.snaps.items() if s.kind != KV}
        out += [Violation("P2", str(n), f"layer {i}'s whole-state checkpoint at {n.end} discarded without "
                                        "an eviction")
                for n in before.walk() for i, s in n.snaps.items()
                if s.kind != KV and (n.keys, i) not in kept and n.keys not in op.evicted]
        out += [Violation("P2", str(n), "a user node was merged away without an eviction")
                for n in before.walk() if n.user and n.keys not in after.nodes and n.keys not in op.evicted]
    return out


# ----------------------------------------------------------------- merging
def merged_parts(before: View, after: View):
    """(m, parts) for each node of `after` whose start moved earlier: it absorbed
    the chain of `before` nodes `parts` covering [m.start, m.end)."""
    for m in after.walk():
        old = before.nodes.get(m.keys)
        if m.is_root or old is None or m.start >= old.start:
            continue
        parts = [before.nodes[m.keys[:e]] for e in range(m.start + 1, m.end + 1) if m.keys[:e] in before.nodes]
        if parts and parts[0].start == m.start:
            yield m, parts


def g1_adjacent(before: View, op: Op, after: View):
    """G1: two KV snapshots merge only if the first ends where the second
    begins: a merged node's KV snapshot exists only where its parts' snapshots
    were adjacent, and then holds exactly their concatenation."""
    out = []
    for m, parts in merged_parts(before, after):
        for i, s in m.snaps.items():
            if s.kind != KV or not all(i in p.snaps for p in parts):
                continue
            ss = [p.snaps[i] for p in parts]
            if any(a.end != b.start for a, b in zip(ss, ss[1:])):
                out.append(Violation("G1", str(m), f"layer {i} merged non-adjacent KV "
                                     + " + ".join(f"[{a.start}, {a.end})" for a in ss)))
            elif all(a.content is not None for a in ss) and s.content is not None and \
                    tuple(s.content) != tuple(k for a in ss for k in a.content):
                out.append(Violation("G1", str(m), f"layer {i} merged KV is not the concatenation of its parts"))
    return out


UNWRITTEN = ("close", "set_budget")     # operations that write no live row: a lazy view stays lazy


def g2_merged(before: View, op: Op, after: View):
    """G2: merging a node with its single child concatenates the edges and
    each KV pair (two lazy views stay lazy: no copy), keeps the child's newer
    whole-state, and the newer last-used time."""
    out = []
    for m, parts in merged_parts(before, after):
        child = parts[-1]
        live = m.end <= after.offset and tuple(after.seq[:m.end]) == m.keys   # the live rows hold the range
        for i, s in m.snaps.items():
            if s.kind == KV and s.lazy and not live and not all(i in p.snaps and p.snaps[i].lazy for p in parts):
                out.append(Violation("G2", str(m), f"layer {i} merged KV is lazy though a part owned its rows "
                                                   "the live buffer does not hold"))
            if s.kind == KV and not s.lazy and op.name in UNWRITTEN and all(i in p.snaps and p.snaps[i].lazy
                                                                             for p in parts):
                out.append(Violation("G2", str(m), f"layer {i}: two lazy views merged into a copy "
                                                   f"({s.nbytes} bytes owned) though no write ran"))
        for i, s in child.snaps.items():
            if s.kind != KV and (i not in m.snaps or m.snaps[i].end != s.end or m.snaps[i].content != s.content):
                out.append(Violation("G2", str(m), f"layer {i} did not keep the child's whole-state"))
        if m.last_used < max(p.last_used for p in parts):
            out.append(Violation("G2", str(m), f"last-used {m.last_used} older than its parts'"))
    return out


# ------------------------------------------------------------- accounting
def a1_counter(v: View):
    """A1: the byte counter equals the owned bytes of the snapshots in the trie."""
    total = sum(bytes_of(n) for n in v.walk())
    return [] if total == v.counter else [Violation("A1", "trie", f"counter {v.counter} != owned bytes {total}")]


def a2_ownership(v: View):
    """A2: every snapshot is held by exactly one node (or the open request's
    pending captures) or released exactly once; nothing created is lost."""
    held = [(n, s.ident) for n in v.walk() for s in n.snaps.values() if s.ident is not None]
    held += [(None, i) for i in (v.request.pending if v.request else ())]
    out, seen = [], {}
    for n, ident in held:
        seen[ident] = seen.get(ident, 0) + 1
    released = {}
    for ident in v.released:
        released[ident] = released.get(ident, 0) + 1
    for n, ident in held:
        if seen[ident] > 1 or ident in released:
            out.append(Violation("A2", str(n) if n else "pending capture",
                                 f"snapshot held {seen[ident]} times, released {released.get(ident, 0)} times"))
    out += [Violation("A2", "store", f"a snapshot released {k} times") for k in released.values() if k > 1]
    if v.created is not None:
        lost = [i for i in v.created if i not in seen and i not in released]
        if lost:
            out.append(Violation("A2", "store", f"{len(lost)} snapshots neither held nor released (leaked)"))
    return out


# --------------------------------------------------------------- oracle
def c1_cold_equivalence(v):
    """C1: each layer's live content equals a cold prefill of the live keys."""
    v = as_view(v)
    return [Violation("C1", f"layer {i}", f"live state differs from a cold prefill of {v.offset} keys")
            for i, layer in enumerate(v.layers)
            if layer.stateful and v.live[i] is not None and tuple(v.live[i]) != v.cold(i)]


STATE = {"T1": t1_offsets, "T2": t2_siblings, "T3": t3_one_offset, "S1": s1_kv_exact,
         "S2": s2_whole_state_at_end, "S3": s3_frontier_complete, "M1": m1_chunks, "M2": m2_captures,
         "M3": m3_resume, "E1": e1_budget, "A1": a1_counter, "A2": a2_ownership,
         "C1": c1_cold_equivalence}
OPERATION = {"S4": s4_split, "P1": p1_split_at_live, "P2": p2_compaction, "G1": g1_adjacent, "G2": g2_merged,
             "E2": e2_protected,
             "E3": e3_order, "E4": e4_evict_shape, "E5": e5_rewind, "C2": c2_deepest_restore}
PREDICATES = {**STATE, **OPERATION}


def check(x, rules=None) -> list:
    """Every violation of every state rule (of `rules`, default all) on a view,
    or on anything with `.view()`."""
    v = as_view(x)
    return [viol for rid, f in STATE.items() if rules is None or rid in rules for viol in f(v)]


def check_step(before: View, op: Op, after: View, rules=None) -> list:
    """Every violation of every operation rule (of `rules`) by `op`, which
    took the cache from view `before` to view `after`."""
    return [viol for rid, f in OPERATION.items() if rules is None or rid in rules for viol in f(before, op, after)]
