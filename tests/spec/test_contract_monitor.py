"""The `pre:` lines CrossHair assumes are met by every call the spec makes.

CrossHair proves a `post:` only for inputs that satisfy the `pre:` lines
(tests/spec/test_crosshair.py). A precondition stronger than what the callers
guarantee would hide a real bug; one weaker than they guarantee lets CrossHair
report counterexamples no request can produce (as it did: `schedule(3, 0, 1,
[(0, 2)], 0, 3)`, a branch point strictly inside a non-causal span, which
`begin` never passes because it floors the match first, M3). This test wraps
each contracted function of spec.plan and spec.media, runs random request
sequences through the spec (the driver of test_spec_properties), and asserts
every call met every `pre:` line.
"""
from __future__ import annotations

import ast
import inspect

import pytest

import spec.cache
import spec.plan
import spec.media
from test_spec_properties import test_no_rule_ever_fires

MONITORED = [(spec.plan, "schedule"), (spec.plan, "next_chunk_end"), (spec.media, "resume_floor"),
             (spec.media, "capture_ceiling"), (spec.media, "extend_chunk")]


def preconditions(func) -> list[str]:
    return [line.strip()[len("pre:"):].strip() for line in (inspect.getdoc(func) or "").splitlines()
            if line.strip().startswith("pre:")]


def unmet(func, args, kwargs) -> list[str]:
    bound = inspect.signature(func).bind(*args, **kwargs)
    env = dict(bound.arguments)      # globals, so the generator expressions of a pre: line see them
    return [pre for pre in preconditions(func) if not eval(compile(ast.parse(pre, mode="eval"), "<pre>", "eval"),
                                                            env)]


def test_crosshair_counterexample_is_outside_schedules_precondition():
    assert unmet(spec.plan.schedule, (3, 0, 1, [(0, 2)], 0, 3), {}) == [
        "not any(p < matched < e for (p, e) in spans)"]
    assert unmet(spec.plan.schedule, (3, 0, 0, [(0, 2)], 0, 3), {}) == []


@pytest.fixture
def monitored(monkeypatch):
    calls, bad = [], []
    for module, name in MONITORED:
        original = getattr(module, name)
        assert preconditions(original), f"{module.__name__}.{name} has no pre: lines"

        def wrapper(*args, _original=original, **kwargs):
            calls.append(_original.__name__)
            missing = unmet(_original, args, kwargs)
            if missing:
                bad.append((_original.__name__, args, kwargs, missing))
            return _original(*args, **kwargs)
        for mod in (spec.plan, spec.cache, spec.media):          # the function and every module that imported it
            if getattr(mod, name, None) is original:
                monkeypatch.setattr(mod, name, wrapper)
    return calls, bad


def test_every_spec_call_meets_the_preconditions(monitored):
    calls, bad = monitored
    test_no_rule_ever_fires()
    assert {"schedule", "next_chunk_end", "resume_floor"} <= set(calls), sorted(set(calls))
    assert not bad, "calls outside their preconditions:\n" + "\n".join(map(repr, bad[:5]))
