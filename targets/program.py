"""Programs of operations, and judging a target on them by the rules alone.

A program is a list of operations as plain dicts (JSON-ready):
  {"op": "begin", "keys": [...], "spans": [[pos, end], ...]}
  {"op": "prefill", "max_chunks": k or None}   (a cancel when close follows early)
  {"op": "step", "key": k}
  {"op": "close"}
  {"op": "set_budget", "budget": b}

`judge(target, program, rules)` runs it and, after every operation, runs
the state rules on the target's view and the operation rules on the views
before and after (spec.rules); it stops at the first operation with a
violation. Nothing is compared with the spec: the predicates alone judge.

`random_programs(seed)` yields programs a chat server sees: new
conversations, next turns, regenerations, edits, rewinds, non-causal and
causal media items, cancels and budget changes, over a tiny vocabulary so
prefixes are shared everywhere. Deterministic for a given seed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from spec.media import fold_key
from spec.rules import check, check_step
from spec.view import Op

BUDGETS = (0, 60, 150, 400, 1 << 40)


@dataclass
class Verdict:
    violations: list          # of spec.rules.Violation, from the first operation that broke a rule
    steps: int                # operations run (up to and including that one)
    error: str | None = None  # the target raised instead (not a verdict of the rules)

    @property
    def rules(self) -> set:
        return {v.rule for v in self.violations}


def apply(target, op: dict):
    name = op["op"]
    if name == "begin":
        return target.begin(tuple(op["keys"]), [tuple(s) for s in op["spans"]])
    if name == "prefill":
        return target.prefill(op.get("max_chunks"))
    if name == "step":
        return target.step(op["key"])
    if name == "set_budget":
        return target.set_budget(op["budget"])
    return target.close()


def as_op(op: dict, outcome, evicted) -> Op:
    name = op["op"]
    args = {"begin": lambda: (tuple(op["keys"]), tuple(tuple(s) for s in op["spans"])),
            "prefill": lambda: (op.get("max_chunks"),), "step": lambda: (op["key"],),
            "set_budget": lambda: (op["budget"],)}.get(name, lambda: ())()
    return Op(name, args, tuple(outcome) if name == "begin" else None, evicted)


def judge(target, program: list, rules=None, want: str | None = None) -> Verdict:
    """Stop at the first operation with a violation; with `want`, go on past
    other rules' violations until `want` is flagged (a chain of bugs)."""
    rules = target.RULES if rules is None else rules
    before = target.view()
    for n, op in enumerate(program, 1):
        seen = len(target.victims) if hasattr(target, "victims") else None
        try:
            out = apply(target, op)
            after = target.view()
        except Exception as e:          # a crash is the target's, not the rules' verdict
            return Verdict([], n, f"{type(e).__name__}: {e}")
        evicted = None if seen is None else tuple(target.victims[seen:])
        found = check(after, rules) + check_step(before, as_op(op, out, evicted), after, rules)
        if found and (want is None or want in {v.rule for v in found}):
            return Verdict(found, n)
        before = after
    return Verdict([], len(program))


def random_programs(seed: int, requests: int = 12, vocab: int = 4, media: bool = True):
    """An endless stream of programs of `requests` requests each."""
    rng = random.Random(seed)
    while True:
        yield program(rng, requests, vocab, media)


def program(rng: random.Random, requests: int, vocab: int, media: bool) -> list:
    ops, convs = [], []           # convs: transcripts (keys, items) so far; items: (pos, end, causal)
    for _ in range(requests):
        if rng.random() < 0.15:
            ops.append({"op": "set_budget", "budget": rng.choice(BUDGETS)})
        kind = rng.choice(["new", "next", "next", "regenerate", "edit", "rewind"]) if convs else "new"
        base, items = ((), []) if kind == "new" else rng.choice(convs)
        cut = len(base)
        if kind == "regenerate":
            cut = max(1, len(base) - rng.randint(1, 3))
        elif kind in ("edit", "rewind"):
            cut = rng.randint(0, len(base))
        cut = min([cut] + [a for a, e, _ in items if a < cut < e])      # an item is never cut: keys are whole runs
        keys, items = list(base[:cut]), [it for it in items if it[1] <= cut]
        new = [rng.randint(1, vocab) for _ in range(rng.randint(1 if keys else 2, 6))]
        if media and rng.random() < 0.25:
            length, causal = rng.randint(2, 4), rng.random() < 0.3
            fold = fold_key(bytes([rng.randint(0, 2)]), (), length, causal)
            at = rng.randint(0, len(new) - 1)
            new = new[:at] + [fold] * length + new[at:]
            items = items + [(len(keys) + at, len(keys) + at + length, causal)]
        keys = tuple(keys) + tuple(new)
        spans = [(a, e) for a, e, causal in items if not causal]
        ops.append({"op": "begin", "keys": list(keys), "spans": [list(s) for s in spans]})
        if rng.random() < 0.15:
            ops += [{"op": "prefill", "max_chunks": 1}, {"op": "close"}]          # a cancel
            continue
        ops.append({"op": "prefill", "max_chunks": None})
        gen = [rng.randint(1, vocab) for _ in range(rng.randint(1, 3))]
        ops += [{"op": "step", "key": k} for k in (keys[-1],) + tuple(gen[:-1])]
        ops.append({"op": "close"})
        convs.append((keys + tuple(gen[:-1]), items))
    return ops
