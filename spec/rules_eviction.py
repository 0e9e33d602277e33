"""Eviction and restore rules (REFERENCE section 3: E1-E5, C2) as predicates
over views; spec.rules registers them with the others. Like every rule, they
read only the views before and after an operation, never the cache's policy."""
from __future__ import annotations

from spec.media import resume_floor
from spec.trie import KV, WINDOWED, common_prefix
from spec.view import NodeView, Op, View
from spec.violation import Violation, inside


# ---------------------------------------------------------------- eviction
def e2_evictable(v: View, n: NodeView) -> bool:
    """E2: only the root, the frontier and branch points (two or more
    children) are protected; every other node can be evicted."""
    return not n.is_root and n.keys != v.frontier.keys and len(n.children) < 2


def e1_budget(v: View):
    """E1 (with E2's protection): at rest, paged-out bytes are within budget
    unless every remaining node is protected."""
    if v.phase not in ("idle", "begun") or v.counter <= v.budget:
        return []
    if any(e2_evictable(v, n) for n in v.walk()):
        return [Violation("E1", "trie", f"{v.counter} bytes over budget {v.budget} with evictable nodes")]
    return []


def victims(before: View, op: Op, after: View) -> list:
    """The nodes an operation evicted: as the target reports them, else the
    leaves of `before` that are gone from `after`."""
    if op.evicted is not None:
        return [before.nodes[k] for k in op.evicted if k in before.nodes]
    return [b for b in before.walk() if not b.is_root and not b.children and b.keys not in after.nodes
            and not any(k[:b.end] == b.keys for k in after.nodes)]


def e2_protected(before: View, op: Op, after: View):
    """E2: eviction never takes a protected node: a budget change keeps the
    frontier, and no branch point goes while two of its children remain."""
    out = []
    if op.name == "set_budget" and before.path[-1] not in after.nodes:
        out.append(Violation("E2", str(before.frontier), "the frontier was evicted"))
    for b in before.walk():
        if not b.is_root and b.keys not in after.nodes and sum(k in after.nodes for k in b.children) >= 2:
            out.append(Violation("E2", str(b), "a branch point was evicted while two of its children remain"))
    return out


def bytes_of(n: NodeView) -> int:
    return sum(s.nbytes for s in n.snaps.values())


def frontiers(before: View, op: Op, after: View) -> set:
    """Every node that may have been the frontier (so protected, E2) when the
    operation evicted: the frontiers before and after it, and, where the path
    grows during it (attach, close), every path node past the old frontier.
    The rest of the active path is evictable like any node."""
    f0 = before.path[-1]
    if op.name in ("begin", "set_budget"):               # evicts once, with the path it leaves
        return {f0, after.path[-1]}
    return {f0} | {k for k in after.path if len(k) > len(f0)}


def e3_order(before: View, op: Op, after: View):
    """E3: least recently used first; ties deeper first, then larger first. No
    node the operation evicted was ahead, in that order, of a node that was
    evictable before and after it and survived unchanged, on the active path
    or not (protecting the whole path was the seed's bug)."""
    gone = victims(before, op, after)
    if not gone:
        return []
    order = lambda n: (n.last_used, -n.end, -bytes_of(n))
    protected = frontiers(before, op, after)
    kept = [a for a in after.walk() if a.keys in before.nodes and a.keys not in protected and e2_evictable(after, a)
            and e2_evictable(before, before.nodes[a.keys]) and before.nodes[a.keys].start == a.start]
    out = []
    for g in gone:
        first = min(kept, key=order, default=None)
        if first is not None and order(first) < order(g):
            out.append(Violation("E3", str(g), f"evicted before {first} (last used {first.last_used} "
                                 f"< {g.last_used}, or tied and deeper/larger)"))
    return out


def e4_evict_shape(before: View, op: Op, after: View):
    """E4: evicting a leaf removes it; evicting a node with one child merges it
    into that child, which keeps its whole-state (G2): the child never stays
    as it was (same start and edge) once its parent is gone."""
    out = []
    for b in before.walk():
        if b.is_root or b.keys in after.nodes or len(b.children) != 1:
            continue
        c = before.nodes[b.children[0]]
        if any(a.parent == b.parent and a.start == c.start and a.keys[len(a.parent):] == c.edge
               for a in after.walk()):
            out.append(Violation("E4", str(b), f"removed without merging into its child {c}"))
    return out


def deepest_restore(before: View, keys: tuple, spans) -> tuple:
    """(m, r): the match m of `keys` in `before`'s trie after the decode-seed
    back-off and the M3 floor, and the largest r <= m that every stateful layer
    can be brought to (C2): a KV layer from the live buffer or KV snapshots
    covering [0, r) along the matched path; a whole-state layer from its live
    state at r (a windowed layer also rewound inside a window that never
    wrapped), or a snapshot at exactly r on the matched path."""
    m, path = 0, []
    node = before.root
    while m < len(keys):
        nxt = next((before.nodes[c] for c in node.children if before.nodes[c].keys[node.end] == keys[m]), None)
        if nxt is None:
            break
        k = common_prefix(nxt.edge, keys[m:])
        path.append(nxt)
        m += k
        if k < len(nxt.edge):
            break
        node = nxt
    m = resume_floor(min(m, len(keys) - 1), list(spans))
    path = [n for n in path if n.start < m]
    common = min(common_prefix(before.seq, keys), before.offset)

    def reach(i, x):
        layer = before.layers[i]
        if x == 0:
            return True
        if layer.kind == KV:
            return all((n.start >= x) or (min(n.end, x) <= common) or i in n.snaps for n in path)
        unwrapped = lambda end: layer.kind == WINDOWED and end <= layer.window
        if x <= common and before.offset >= x and (before.offset == x or unwrapped(before.offset)):
            return True
        return any(i in n.snaps and (n.snaps[i].end == x or (unwrapped(n.snaps[i].end) and x <= n.snaps[i].end))
                   for n in path)
    r = next(x for x in range(m, -1, -1) if not inside(x, spans)
             and all(reach(i, x) for i, l in enumerate(before.layers) if l.stateful))
    return m, r


def _begin_resume(before, op, after):
    if op.name != "begin" or op.outcome is None:
        return None
    spans = after.request.spans if after.request is not None else (op.args[1] if len(op.args) > 1 else ())
    m, r = deepest_restore(before, tuple(op.args[0]), spans)
    return m, r, op.outcome[1]


def c2_deepest_restore(before: View, op: Op, after: View):
    """C2: begin resumes at the deepest offset the trie can serve (E5 words
    the case where that is below the match)."""
    got = _begin_resume(before, op, after)
    if got is None:
        return []
    m, r, resume = got
    if resume != r:
        return [Violation("C2", f"begin of {len(op.args[0])} keys", f"resumed at {resume}, the trie serves {r}")]
    return []


def e5_rewind(before: View, op: Op, after: View):
    """E5: rewinding past an evicted checkpoint resumes at the newest surviving
    checkpoint before the match."""
    got = _begin_resume(before, op, after)
    if got is None:
        return []
    m, r, resume = got
    if r < m and resume != r:
        return [Violation("E5", f"begin of {len(op.args[0])} keys",
                          f"resumed at {resume}, the newest surviving checkpoint before {m} is {r}")]
    return []
