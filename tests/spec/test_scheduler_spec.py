"""spec/scheduler.py: scenario tests per rule (F1, F2, R1), properties, the CrossHair contracts, and
the historical R1 load/close race on the spec's interleavings. The seed's bugs reintroduced in the
serving code: tests/serve/test_scheduler_historical_bugs.py."""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec.scheduler import CLOSED, EVENTS, LOADED, LOADING, NEW, STATES, IllegalTransition, client_transition, fit_available, fit_decision, fits, lru_idle, overcommits

GiB = 1 << 30


# ------------------------------------------------------------------------------------ F1

def test_f1_first_load_uses_the_device_figure_alone():
    assert fit_available(10 * GiB, 1 * GiB, others_loaded=0) == 10 * GiB
    assert fit_decision(4 * GiB, 10 * GiB, 1 * GiB, []) == "load"


def test_f1_with_others_loaded_system_free_bounds_it():
    assert fit_available(10 * GiB, 3 * GiB, others_loaded=1) == 3 * GiB
    assert fit_available(2 * GiB, 3 * GiB, others_loaded=2) == 2 * GiB
    assert fit_decision(4 * GiB, 10 * GiB, 3 * GiB, [("a", True, 0.0)]) == ("evict", "a")


def test_f1_discrete_devices_keep_the_device_figure():
    assert fit_available(10 * GiB, 1 * GiB, others_loaded=3, shared_memory=False) == 10 * GiB


def test_f1_overcommit_oracle():
    assert overcommits(4 * GiB, 10 * GiB, 3 * GiB, 1)
    assert not overcommits(4 * GiB, 10 * GiB, 3 * GiB, 0)
    assert overcommits(11 * GiB, 10 * GiB, 30 * GiB, 0)


# ------------------------------------------------------------------------------------ F2

def test_f2_miss_evicts_least_recently_used_idle():
    loaded = [("a", True, 5.0), ("b", True, 2.0), ("c", False, 1.0)]
    assert fit_decision(8 * GiB, 4 * GiB, 4 * GiB, loaded) == ("evict", "b")   # c is busy


def test_f2_ties_break_by_name():
    assert lru_idle([("z", True, 1.0), ("m", True, 1.0)]) == "m"


def test_f2_all_busy_waits_never_evicts_a_busy_runner():
    assert fit_decision(8 * GiB, 4 * GiB, 4 * GiB, [("a", False, 0.0)]) == "wait"


def test_f2_cannot_fit_alone_is_refused():
    assert fit_decision(12 * GiB, 10 * GiB, 10 * GiB, []) == "refuse"
    # knowing the figure with nothing loaded refuses before evicting anything
    assert fit_decision(12 * GiB, 6 * GiB, 6 * GiB, [("a", True, 0.0)], alone_free=10 * GiB) == "refuse"
    assert fit_decision(8 * GiB, 6 * GiB, 6 * GiB, [("a", True, 0.0)], alone_free=10 * GiB) == ("evict", "a")


def _run_scheduler_loop(required, device_total, system_other, loaded_sizes, busy=(), clock=None):
    """The impl's loop in miniature: decide, evict (memory comes back), decide again."""
    loaded = dict(loaded_sizes)
    last = {n: i for i, n in enumerate(loaded)}
    for _ in range(len(loaded) + 2):
        held = sum(loaded.values())
        device_free = max(0, device_total - held)
        system_free = max(0, device_total - held - system_other)
        d = fit_decision(required, device_free, system_free,
                         [(n, n not in busy, last[n]) for n in loaded], alone_free=device_total)
        if d == "load":
            assert not overcommits(required, device_free, system_free, len(loaded)), "F1 violated"
            return d, sorted(loaded)
        if d in ("refuse", "wait"):
            return d, sorted(loaded)
        loaded.pop(d[1])
    raise AssertionError("the evict/retry loop did not terminate")


@settings()
@given(required=st.integers(0, 16), device_total=st.integers(1, 16), system_other=st.integers(0, 16),
       sizes=st.lists(st.integers(1, 6), max_size=4), busy=st.sets(st.integers(0, 3)))
def test_f2_evict_retry_terminates_without_overcommitting(required, device_total, system_other, sizes, busy):
    loaded = {f"m{i}": s for i, s in enumerate(sizes)}
    outcome, left = _run_scheduler_loop(required, device_total, system_other, loaded,
                                        busy={f"m{i}" for i in busy})
    if outcome == "refuse":
        assert required > device_total or not left
    if outcome == "wait":
        assert left and all(f"m{i}" in left for i in busy if f"m{i}" in loaded)


@settings()
@given(req=st.integers(0, 100), dev=st.integers(0, 100), sysf=st.integers(0, 100),
       loaded=st.lists(st.tuples(st.sampled_from("abcd"), st.booleans(), st.floats(0, 10)), max_size=4,
                       unique_by=lambda t: t[0]))
def test_f2_decision_properties(req, dev, sysf, loaded):
    d = fit_decision(req, dev, sysf, loaded)
    assert (d == "load") == fits(req, fit_available(dev, sysf, len(loaded)))
    if d == "refuse":
        assert not loaded
    if isinstance(d, tuple):
        victim = [x for x in loaded if x[0] == d[1]][0]
        assert victim[1] and all(victim[2] <= t for _n, i, t in loaded if i)
    if d == "wait":
        assert loaded and not any(i for _n, i, _t in loaded)


# ------------------------------------------------------------------------------------ R1

def test_r1_transitions():
    assert client_transition(NEW, "load") == LOADING
    assert client_transition(LOADING, "ready") == LOADED
    for s in STATES:
        assert client_transition(s, "close") == CLOSED
    with pytest.raises(IllegalTransition, match="load after close"):
        client_transition(CLOSED, "load")
    with pytest.raises(IllegalTransition, match="reaped"):
        client_transition(LOADED, "close", process_reaped=False)
    with pytest.raises(IllegalTransition):
        client_transition(LOADED, "load")


@settings()
@given(st.lists(st.sampled_from(EVENTS), max_size=12))
def test_r1_once_closed_always_closed_and_never_loads(events):
    state = NEW
    for ev in events:
        try:
            new = client_transition(state, ev)
        except IllegalTransition:
            assert ev in ("load", "ready")
            continue
        if state == CLOSED:
            assert new == CLOSED
        state = new
    assert state in STATES


# Interleavings of one load and one close on a client, as atomic steps. With the lock, load's
# check-closed/spawn/record is one step; without it (the historical bug) they are three.

def _steps_locked():
    load = [("load_atomic",)]
    close = [("close_atomic",)]
    return load, close


def _steps_unlocked():
    load = [("check_closed",), ("spawn",), ("record",)]
    close = [("close_atomic",)]
    return load, close


def _run_interleaving(order):
    st_ = {"closed": False, "refused": False, "spawned": None, "recorded": None, "alive": set()}
    for step in order:
        kind = step[0]
        if kind == "load_atomic":
            if st_["closed"]:
                st_["refused"] = True
            else:
                st_["alive"].add(1)
                st_["recorded"] = 1
        elif kind == "check_closed":
            st_["refused"] = st_["closed"]
        elif kind == "spawn":
            if not st_["refused"]:
                st_["spawned"] = 1
                st_["alive"].add(1)
        elif kind == "record":
            if not st_["refused"]:
                st_["recorded"] = st_["spawned"]
        elif kind == "close_atomic":
            st_["closed"] = True
            if st_["recorded"] is not None:
                st_["alive"].discard(st_["recorded"])     # kill + reap what it can see
    return st_


def _interleavings(a, b):
    n = len(a) + len(b)
    for pos in itertools.combinations(range(n), len(a)):
        ai, bi, out = iter(a), iter(b), []
        for i in range(n):
            out.append(next(ai) if i in pos else next(bi))
        yield out


def _orphans(steps):
    load, close = steps
    return [o for o in _interleavings(load, close) if _run_interleaving(o)["alive"]]


def test_r1_load_under_the_lock_leaves_no_orphan_in_any_interleaving():
    assert _orphans(_steps_locked()) == []


def test_r1_historical_bug_load_outside_the_lock_is_caught():
    bad = _orphans(_steps_unlocked())
    assert bad, "the model must expose the race"
    assert ["check_closed", "close_atomic", "spawn", "record"] in [[s[0] for s in o] for o in bad]


# ------------------------------------------------------------------------------ CrossHair

@pytest.mark.skipif(shutil.which("crosshair", path=os.path.dirname(sys.executable)) is None,
                    reason="crosshair-tool not installed")
def test_crosshair_finds_no_counterexample_to_the_contracts():
    exe = os.path.join(os.path.dirname(sys.executable), "crosshair")
    r = subprocess.run([exe, "check", "--per_condition_timeout=0.25", "spec/scheduler.py"],
                       capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert r.returncode == 0, r.stdout + r.stderr
