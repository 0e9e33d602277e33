"""The rule machines of targets/machine.py over SGLang's radix cache, without media.

`SglangMachine` is targets.machine.TargetMachine with a begin that draws token-only prompts (the
radix key is token ids; spans are not modelled), fresh, extending, branching off or repeating
a stored stream. Everything else -- judging every view with spec.rules, the spec alongside for
policy differences, replay and `minimize` -- is targets.machine's.

`campaign(target, minutes)` hunts round-robin until the time is up; each new rule's program is
reduced by targets.machine.minimize until no request or run of operations can go. The target runs
inside targets.sglang.crash.Guarded: an exception raised in SGLang's code is rule PANIC (its program
reduced while it keeps raising the same exception type in the same SGLang function); one raised in ours
stops the campaign with its traceback.
"""
from __future__ import annotations

import time

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException
from hypothesis.stateful import precondition, rule, run_state_machine_as_test

from targets.machine import Hunt, TargetMachine, minimize, reduce_ops, replay_checked, well_formed
from targets.sglang.crash import SglangCrash, guard
from targets.report import Campaign, Finding

TOK = st.integers(1, 6)
CONFIG = dict(interval=8, near_end=4, chunk=8, layout="kv")


class SglangMachine(TargetMachine):
    @precondition(lambda self: not self.open)
    @rule(data=st.data())
    def begin(self, data):
        kind = data.draw(st.sampled_from(["fresh", "extend", "prefix", "same"] if self.streams else ["fresh"]))
        _, base, _ = data.draw(st.sampled_from(self.streams)) if self.streams and kind != "fresh" else ((), (), ())
        if kind == "prefix":
            base = base[:data.draw(st.integers(1, len(base)))]
        tail = data.draw(st.lists(TOK, min_size=1 if kind == "prefix" else 0 if base else 1, max_size=8))
        tokens = list(base) + tail
        self.tokens, self.media = list(tokens), []
        self.open, self.prefilled, self.seeded, self.keys = True, False, False, tuple(tokens)
        self.run(dict(op="begin", keys=list(tokens), spans=[], tokens=tokens, media=[]),
                 lambda: self.target.begin(tokens, ()), lambda: self.spec.begin(tokens, []))


def hunt_once(target, hunt: Hunt, max_examples: int = 40, steps: int = 15):
    hunt.rule = None
    cls = type("SglangMachine_kv", (SglangMachine,), dict(target=target, hunt=hunt, config=CONFIG))
    s = settings(max_examples=max_examples, stateful_step_count=steps, deadline=None, database=None,
                 suppress_health_check=list(HealthCheck), print_blob=False,
                 phases=[Phase.explicit, Phase.generate])
    try:
        run_state_machine_as_test(cls, settings=s)
    except Exception as e:                       # RuleViolation (an AssertionError) or a crash
        from targets.machine import RuleViolation
        if isinstance(e, RuleViolation):
            return e
        if isinstance(e, HypothesisException):
            hunt.notes.append(f"{type(e).__name__}: {str(e).splitlines()[0]}")
            return None
        raise
    return None


def campaign(target, minutes: float, max_examples: int = 40, steps: int = 15, on_finding=None,
             log=None) -> Campaign:
    target = guard(target)
    hunt = Hunt(rules=frozenset(target.RULES) | {"PANIC"})
    deadline = time.monotonic() + minutes * 60
    out = Campaign(target.name, ("kv",), minutes)
    while time.monotonic() < deadline:
        out.runs += 1
        e = hunt_once(target, hunt, max_examples=max_examples, steps=steps)
        if e is not None and e.rule not in out.findings:
            ops = minimize_crash(target, e.ops) if e.rule == "PANIC" else minimize(target, e.ops, e.rule)
            f = Finding(e.rule, "kv", hunt.seen.get(e.rule, hunt.found[e.rule]), e.message, ops)
            out.findings[e.rule] = f
            if log:
                log(f"[{time.monotonic() - hunt.t0:6.1f}s] {e.rule} in {f.length} operations: {e.message}")
            if on_finding:
                on_finding(f)
    out.seconds = time.monotonic() - hunt.t0
    out.steps, out.policy = hunt.steps, hunt.policy
    return out


def crash_of(target, ops: list):
    """The SglangCrash a well-formed program raises on `target` (a Guarded one), or None."""
    if not well_formed(ops):
        return None
    try:
        replay_checked(target, ops)
    except SglangCrash as c:
        return c
    except ValueError:                            # not a pipeline order
        return None
    return None


def minimize_crash(target, ops: list) -> list:
    """targets.machine.reduce_ops for a crash: drop requests and runs of operations while the program
    still raises the same exception type in the same SGLang function."""
    first = crash_of(target, ops)
    if first is None:
        return list(ops)

    def same(cand):
        c = crash_of(target, cand)
        return c is not None and c.signature == first.signature
    return reduce_ops(ops, same)
