"""Why a program breaks its rule on Ollama, read from the program's own run.

`diagnose(target, rule, ops)` replays the program on the target, finds the
first operation after which the rule is broken, and matches what the views
before and after it show against the mechanisms we know in Ollama's code
(at fb30760, the stored snapshot, and the commits before it). A mechanism is
named only when the run shows its evidence (which nodes, which offsets, which
merge); otherwise the answer starts with "unexplained" and says what was seen.

Invariants: read-only over views (spec.view); the target is driven only by
the program (reset first), so the cause is the program's, not a campaign's.
"""
from __future__ import annotations

from dataclasses import dataclass

from spec.rules_eviction import deepest_restore, e2_evictable
from spec.view import View
from targets.report import program_text
from targets.machine import send
from targets.viewcheck import as_op, check_op, check_view

WHOLE = ("recurrent", "windowed")


@dataclass
class Step:
    index: int              # 1-based position of the operation in the program (reset excluded)
    op: dict
    before: View | None
    after: View
    merges: list
    found: dict             # rule -> first message at this step


def trace(target, ops: list) -> list:
    """Every operation of the program with the views around it and the rules it breaks."""
    out, before = [], None
    for i, op in enumerate(ops):
        name = op["op"]
        send(target, op)
        after = target.view()
        wire = dict(op, keys=after.request.keys) if name == "begin" and after.request else op
        found = {}
        if name != "reset":
            partial = getattr(target, "PARTIAL", None)
            for v in check_view(after, partial=partial) + check_op(before, as_op(wire, target.outcome), after,
                                                                   target.merges):
                found.setdefault(v.rule, str(v))
        out.append(Step(i, op, before, after, list(target.merges), found))   # shown as the program has it
        before = after
    return out


def _op(step: Step) -> str:
    return f"operation {step.index} (`{program_text([step.op])}`)"


def _nodes(ns) -> str:
    return ", ".join(f"[{n.start}, {n.end})" for n in ns)


def resumed_inside_edge(steps: list, upto: int) -> Step | None:
    """The first begin before step `upto` whose resume lies strictly inside a stored node's edge."""
    for s in steps[1:upto + 1]:
        if s.op["op"] != "begin" or s.before is None or s.after.request is None:
            continue
        r, keys = s.after.request.resume, s.after.request.keys
        if any(n.start < r < n.end and tuple(keys[:r]) == n.keys[:r] for n in s.before.walk() if not n.is_root):
            return s
    return None


def _p1_chain(steps, k, what) -> str | None:
    p = resumed_inside_edge(steps, k)
    if p is None:
        return None
    return (f"{what} It follows a resume inside an edge at {_op(p)}, resumed at {p.after.request.resume}: "
            "switchToPath trims activePath to the nodes ending at or below the live offset instead of splitting "
            "the node there (seed paragraph 3, P1), so the captures of that request start at the resume offset "
            "while the node attachPrefillSnapshots -> advancePath rebuilds begins earlier.")


def why_e1(steps, k, layout):
    s = steps[k]
    v = s.after
    ev = [n for n in v.walk() if e2_evictable(v, n)]
    on_path = set(v.path)
    active = [n for n in ev if n.keys in on_path]
    off = [n for n in ev if n.keys not in on_path]
    head = f"After {_op(s)}, {v.counter} bytes are held against a budget of {v.budget}."
    if active and not off:
        return (f"{head} Every evictable node ({_nodes(active)}) is on the active path, and "
                "enforceEvictionPolicy skips every node of activeSet (the whole active path), so it evicts nothing "
                "(seed paragraph 4: only the root, the frontier and branch points are protected).")
    b = s.before
    if (s.op["op"] == "close" and layout.endswith("-lazy") and b is not None and off
            and v.frontier.start < b.frontier.end < v.frontier.end
            and any(x.kind == "kv" and not x.lazy and x.nbytes > 0 for x in v.frontier.snaps.values())):
        f = v.frontier
        extra = (f" The active-path nodes {_nodes(active)} are also skipped (activeSet)." if active else "")
        return (f"{head} `close` paged the new tokens out as lazy KV views, and pageOut enforced the budget; then "
                f"compactPath merged the frontier's parent into it (now [{f.start}, {f.end})). The parent's KV "
                "snapshots were owned, so KVCache.Merge copies the lazy child out; mergeWithChild has detached the "
                "hooks (swapSnapshots) before it merges, and the copied bytes reach pagedOutBytes through the merged "
                "snapshot's Size() when it calls setSnapshots. Nothing enforces the budget after compactPath, and "
                f"evictable nodes off the active path survive ({_nodes(off)}). The owned parent is a snapshot that "
                f"page-in restored and left owned: Ollama never makes it a view of the live rows again.{extra}")
    if off:
        return (f"unexplained: {head} Evictable nodes off the active path survive ({_nodes(off)}), so no eviction "
                f"ran after the counter last grew, by a path we do not recognise.")
    return None


def why_e3(steps, k, layout):
    s = steps[k]
    msg = s.found["E3"]
    b = s.before
    kept = [n for n in b.walk() if str(n) in msg and n.keys in set(b.path)] if b else []
    if kept:
        return (f"At {_op(s)}: {msg}. The node that should have gone first is on the active path: "
                "enforceEvictionPolicy skips every node of activeSet (seed paragraph 4).")
    return None


def why_s3(steps, k, layout):
    s = steps[k]
    if s.op["op"] != "close":
        return None
    f = s.after.frontier
    kinds = {i: l.kind for i, l in enumerate(s.after.layers) if l.kind}
    missing = [i for i in kinds if i not in f.snaps]
    has_kv = [i for i in f.snaps if kinds.get(i) == "kv"]
    if not f.snaps:
        return (f"At {_op(s)} the frontier [{f.start}, {f.end}) holds no snapshot at all: close did not page out "
                "the node it recorded (Ollama before 30e289180).")
    if has_kv and any(kinds[i] in WHOLE for i in missing):
        return (f"At {_op(s)} the frontier [{f.start}, {f.end}) holds KV snapshots (layers {has_kv}) but none for "
                f"layers {[i for i in missing if kinds[i] in WHOLE]}: pageOut returns early when "
                "node.hasSnapshots(), and a head split off a stored edge (advancePath -> splitNode) has the KV "
                "halves only (seed paragraph 1).")
    return None


def why_media(rule):
    def why(steps, k, layout):
        s = steps[k]
        r = s.after.request
        if r is None:
            return None
        spans = [tuple(x) for x in r.spans]
        if rule == "M2":
            bad = [o for o, _ in r.schedule if any(p < o < e for p, e in spans)]
            if bad:
                return (f"At {_op(s)}, schedulePrefillSnapshots kept the capture offsets {bad} strictly inside the "
                        f"non-causal media items {spans} (seed paragraph 2).")
        else:
            inside = [(p, e) for p, e in spans if p < r.resume < e]
            if inside:
                return (f"At {_op(s)}, begin/switchToPath resumed at {r.resume}, strictly inside the non-causal "
                        f"media item {inside[0]}: the match is not floored to the item's start (seed paragraph 2).")
        return None
    return why


def why_p1(steps, k, layout):
    s = steps[k]
    if s.op["op"] != "begin" or resumed_inside_edge(steps, k) is not steps[k]:
        return None
    f = s.after.frontier
    return (f"At {_op(s)}, begin resumed at {s.after.request.resume}, strictly inside a stored edge; the frontier "
            f"ends at {f.end}: switchToPath trims activePath to the nodes ending at or below the live offset, "
            "so the resumed node leaves the path instead of being split there (seed paragraph 3).")


def why_chain(rule):
    def why(steps, k, layout):
        s = steps[k]
        msg = s.found[rule]
        if rule == "G1" and s.merges:
            m = s.merges[0]
            what = (f"At {_op(s)}, mergeWithChild -> Cache.Merge concatenated KV {tuple(m['first'])} and "
                    f"{tuple(m['then'])}, not adjacent, without checking (seed paragraph 3, G1).")
        else:
            what = f"At {_op(s)}: {msg}."
        if rule in ("C2", "E5") and s.op["op"] == "begin" and s.after.request is not None:
            r = s.after.request
            spans = [tuple(x) for x in r.spans]
            used = [(p, e) for p, e in spans if p < r.resume < e]
            if used:
                return (f"{what} The checkpoint it used, at {r.resume}, lies strictly inside the non-causal media "
                        f"item {used[0]}, so the deepest valid one is lower: a consequence of the media bugs "
                        "(M2: a capture scheduled inside the item; M3: a resume inside it).")
        return _p1_chain(steps, k, what)
    return why


DIAGNOSE = {"E1": why_e1, "E3": why_e3, "S3": why_s3, "M2": why_media("M2"), "M3": why_media("M3"),
            "P1": why_p1, "T3": why_p1, "S1": why_chain("S1"), "S4": why_chain("S4"), "G1": why_chain("G1"),
            "C2": why_chain("C2"), "E5": why_chain("E5")}


def diagnose(target, rule: str, ops: list) -> str:
    """The cause of `rule` in this program's run, or a sentence starting with "unexplained"."""
    layout = ops[0].get("layout", "")
    try:
        steps = trace(target, ops)
    except Exception as e:                     # the target panicked or died on the replay
        return f"unexplained: the replay for the cause stopped ({type(e).__name__}: {str(e)[:120]})"
    k = next((i for i, s in enumerate(steps) if rule in s.found), None)
    if k is None:
        return f"unexplained: replayed for its cause, the program does not break {rule}"
    fn = DIAGNOSE.get(rule)
    why = fn(steps, k, layout) if fn else None
    return why or f"unexplained: {rule} first shows after {_op(steps[k])}: {steps[k].found[rule]}"
