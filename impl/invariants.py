"""Checked assertions of the REFERENCE rules on impl, switched on by
`PrefixCache(check=True)` (tests and fuzz turn it on).

The rules themselves live once, in spec/rules.py: this module judges impl's
view (impl.view) with them — the state rules after every operation, the
operation rules on the views before and after begin, attach, close and
set_budget — plus the facts only impl has (a closed snapshot still held is
shown to the rules as held-and-released, A2). Each failure names its rule id.
"""
from __future__ import annotations

from spec.rules import check, check_step, e2_evictable
from spec.view import Op, View


class RuleViolation(AssertionError):
    pass


def violations(pc, before: View | None = None, op: Op | None = None) -> list:
    """Every violation, as text: the state rules on impl's view, and the
    operation rules when the view before `op` is given."""
    from impl.view import view
    after = view(pc)
    found = check(after)
    if before is not None and op is not None:
        found += check_step(before, op, after)
    return [str(v) for v in found]


def assert_rules(pc, what: str = "", before: View | None = None, op: Op | None = None) -> None:
    v = violations(pc, before, op)
    if v:
        raise RuleViolation(f"after {what}: " + "; ".join(v) + "\n" + pc.dump())


def before(pc) -> tuple:
    """The view before an operation, and how many victims impl had recorded then."""
    from impl.view import view
    return view(pc), len(pc.victims)


def checked(pc, what: str, before_: tuple | None, args: tuple = (), outcome=None) -> None:
    """After operation `what`: every state rule, and its operation rules on the
    views around it (victims: those recorded since `before_`)."""
    op = None if before_ is None else Op(what, args, outcome, tuple(pc.victims[before_[1]:]))
    assert_rules(pc, what, before_ and before_[0], op)


def assert_evictable(pc, victim) -> None:
    """E2, where protection is decided: the victim impl chose is one the rule
    lets go (not the root, the frontier or a branch point)."""
    from impl.view import view
    v = view(pc)
    node = v.node(victim.path_keys())
    if not e2_evictable(v, node):
        raise RuleViolation(f"E2 at {node}: chosen for eviction but protected (root, frontier or branch point)"
                            + "\n" + pc.dump())


def walked_victim(pc):
    """E3's first evictable node by a walk over the whole trie (O(n)): the definition the incremental
    order (impl.eviction.EvictionOrder) must agree with, victim after victim. Ties on the order's key
    are broken by key path, which is unique."""
    from impl.trie import Node, walk
    best, tied = None, []
    for n in walk(pc.root):
        if pc.evictable(n):
            k = pc.evict_order(n)
            if best is None or k < best:
                best, tied = k, [n]
            elif k == best:
                tied.append(n)
    return min(tied, key=Node.path_keys) if tied else None


def assert_victim(pc, victim) -> None:
    """E3, where the victim is chosen: the incremental order's choice is the walk's."""
    walked = walked_victim(pc)
    if walked is not victim:
        def show(n):
            return "none" if n is None else f"{n} key {pc.evict_order(n)} path {n.path_keys()}"
        raise RuleViolation(f"E3: the eviction order chose {show(victim)}, the walk over the trie chooses "
                            f"{show(walked)}\n" + pc.dump())
