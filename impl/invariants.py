"""Checked assertions of the REFERENCE rules on impl's own objects.

Off by default; `PrefixCache(check=True)` runs `assert_rules` after every
operation (tests and fuzz turn it on). Each failure names its rule id.
Cheap: one walk of the trie.
"""
from __future__ import annotations

from impl.trie import walk


class RuleViolation(AssertionError):
    pass


def violations(pc) -> list:
    out = []
    request = pc.request
    quiet = request is None or (not request.chunks and not request.prefilled)
    offsets = {c.offset for c in pc.caches if c is not None}
    if len(offsets) > 1:
        out.append(f"T3: layer caches at offsets {sorted(offsets)}")
    if pc.path[0] is not pc.root or any(b.parent is not a for a, b in zip(pc.path, pc.path[1:])):
        out.append("T3: active path is not a root-to-node chain")
    if quiet and pc.frontier.end != pc.offset:
        out.append(f"T3: frontier ends at {pc.frontier.end}, live offset {pc.offset}")
    total = 0
    for n in walk(pc.root):
        firsts = set()
        for k, c in n.children.items():
            if c.parent is not n or c.start != n.end or not c.edge or c.edge[0] != k:
                out.append(f"T1: {c} under {n}")
            firsts.add(c.edge[0] if c.edge else None)
        if len(firsts) != len(n.children):
            out.append(f"T2: children of {n} share a first key")
        for i, s in enumerate(n.snaps):
            if s is None:
                continue
            if s.closed:
                out.append(f"A2: {n} holds closed snapshot of layer {i}")
            total += s.size
            if s.kind == "kv" and (s.start, s.end) != (n.start, n.end):
                out.append(f"S1: {n} layer {i} KV [{s.start}, {s.end})")
            if s.kind != "kv" and s.end != n.end:
                out.append(f"S2: {n} layer {i} state at {s.end}")
    if total != pc.counter:
        out.append(f"A1: counter {pc.counter} != owned bytes {total}")
    if request is None and pc.frontier is not pc.root:
        missing = [i for i in pc.stateful() if pc.frontier.snaps[i] is None]
        if missing:
            out.append(f"S3: frontier {pc.frontier} misses layers {missing}")
        out += [f"P2: {n} left uncompacted" for n in pc.path[1:-1] if not n.user and len(n.children) == 1]
    if request is not None:
        inside = lambda x: any(a < x < e for a, e in request.spans)
        out += [f"M1: chunk [{p}, {q}) ends inside a non-causal item" for p, q in request.chunks if inside(q)]
        out += [f"M2: capture {c} inside a non-causal item" for c, _ in request.schedule if inside(c)]
        if inside(request.resume):
            out.append(f"M3: resume {request.resume} inside a non-causal item")
        if quiet and pc.frontier.end != request.resume:
            out.append(f"P1: frontier {pc.frontier} does not end at resume {request.resume}")
    # E1 with E2's protection as the rule states it (root, frontier, branch points), not as
    # pc.evictable implements it, so a policy that protects more is caught.
    unprotected = lambda n: n is not pc.root and n is not pc.frontier and len(n.children) < 2
    if quiet and pc.counter > pc.budget and any(unprotected(n) for n in walk(pc.root)):
        out.append(f"E1: {pc.counter} bytes over budget {pc.budget} with evictable nodes")
    return out


def assert_rules(pc, what: str = "") -> None:
    v = violations(pc)
    if v:
        raise RuleViolation(f"after {what}: " + "; ".join(v) + "\n" + pc.dump())
