"""Judge a target's views with spec.rules (state rules on each view, operation
rules on each (before, op, after)), plus the evidence a target reports about an
operation that a view cannot show.

Local evidence (stated from REFERENCE's words, nothing more):
  G1  the harness reports every KV merge whose halves are not adjacent; each is
      a G1 violation even when the merged node is evicted in the same operation.

Invariants: every other verdict is spec.rules'; `rules` restricts the ids
reported (a target's declared RULES).
"""
from __future__ import annotations

import dataclasses

import spec.rules as R
from spec.view import Op, View


def view_of(raw: dict) -> View:
    """View.from_dict, keeping the request's pending captures (A2 counts them)."""
    v = View.from_dict(raw)
    pend = ((raw.get("request") or {}).get("pending")) or ()
    if v.request is not None and pend:
        v = dataclasses.replace(v, request=dataclasses.replace(v.request, pending=tuple(pend)))
    return v


def check_view(view: View, rules=None, partial=None) -> list:
    """spec.rules' state rules on the view; a rule in `partial` (rule id -> view -> view) is judged by its own
    predicate on that function's image of the view instead (a target that shows only part of what the rule
    reads, e.g. M2's capture clause alone on a view without its nodes)."""
    partial = partial or {}
    keep = None if rules is None else set(rules)
    whole = [r for r in R.STATE if r not in partial and (keep is None or r in keep)]
    out = R.check(view, rules=whole)
    for rid, part in partial.items():
        if keep is None or rid in keep:
            out += R.check(part(view), rules={rid})
    return out


def check_op(before: View | None, op: Op, after: View, merges=(), rules=None) -> list:
    out = [] if before is None else R.check_step(before, op, after, rules=rules)
    for m in merges:
        (a, b), (c, d) = m["first"], m["then"]
        out.append(R.Violation("G1", f"layer {m['layer']}",
                               f"merged KV [{a}, {b}) with [{c}, {d}): not adjacent, concatenated silently"))
    return [v for v in out if rules is None or v.rule in rules]


def as_op(op: dict, outcome=None) -> Op:
    """A program operation (JSON dict) as spec.view.Op."""
    name = op["op"]
    if name == "begin":
        args = (tuple(op["keys"]), tuple(tuple(s) for s in op["spans"]))
    elif name == "prefill":
        args = (op.get("max_chunks") or None,)
    elif name == "step":
        args = (op["key"],)
    elif name == "set_budget":
        args = (op["budget"],)
    else:
        args = ()
    return Op(name, args, None if outcome is None else tuple(outcome))
