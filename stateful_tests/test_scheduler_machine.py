"""A Hypothesis state machine driving serve.scheduler.Scheduler (in-process fake runners) through
requests, unloads, runner deaths and memory-figure changes, checking F1/F2/R1 against
spec/scheduler.py after every step.

The model: memory is counted in GiB units. The device figure is ``device_total - held`` where
``held`` is what loaded runners report; the system figure is ``device_total - other - held``
(other applications hold ``other``). For each request the machine predicts, with
``spec.scheduler.fit_decision`` alone, the sequence of decisions (evictions, then load or
refuse) and the resulting table, and checks the scheduler made exactly those.
"""
from __future__ import annotations

import itertools

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from serve.scheduler import ModelTooLarge, Scheduler
from spec.scheduler import CLOSED, fit_decision, overcommits
from tests.support.in_process_runner import InProcessRunner

SIZES = {"a": 3, "b": 4, "c": 5, "d": 8, "huge": 30}


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.device_total = 16
        self.other = 0
        self.ticks = itertools.count(1)
        self.clients: list[InProcessRunner] = []

        def factory(name):
            r = InProcessRunner(name, SIZES[name])
            self.clients.append(r)
            return r

        self.s = Scheduler(factory, device_total=lambda: self.device_total,
                           system_free=self.system_free, required_bytes=lambda n: SIZES[n],
                           known_model=lambda n: n in SIZES, clock=lambda: float(next(self.ticks)),
                           wait_timeout=1.0)

    def system_free(self) -> int:
        held = sum(m for _n, _i, _t, m in self.s.snapshot())
        return max(0, self.device_total - self.other - held)

    # ------------------------------------------------------------------ the spec's prediction
    def predict(self, name):
        table = {n: (t, m) for n, _i, t, m in self.s.snapshot()}
        for r in self.clients:
            if r.model in table and r.pid is not None and not r.alive() and r.state != CLOSED:
                table.pop(r.model, None)                      # dead runners are dropped first
        if name in table:
            return [], sorted(table), True
        outcomes = []
        while True:
            held = sum(m for _t, m in table.values())
            dev = max(0, self.device_total - held)
            sysf = max(0, self.device_total - self.other - held)
            loaded = [(n, True, t) for n, (t, _m) in table.items()]
            d = fit_decision(SIZES[name], dev, sysf, loaded, True, alone_free=self.device_total)
            outcomes.append(d)
            if d == "load":
                assert not overcommits(SIZES[name], dev, sysf, len(loaded))
                table[name] = (0.0, SIZES[name])
                return outcomes, sorted(table), True
            if d == "refuse":
                return outcomes, sorted(table), False
            assert d != "wait", "single-threaded: nothing is ever busy"
            table.pop(d[1])

    # ------------------------------------------------------------------ rules
    @rule(name=st.sampled_from(sorted(SIZES)), n=st.integers(0, 3))
    def request(self, name, n):
        want_outcomes, want_table, want_ok = self.predict(name)
        before = len(self.s.decisions)
        try:
            r = self.s.generate(name, [1, 2, 3], n)
            ok = True
            assert len(r["tokens"]) == n
        except ModelTooLarge:
            ok = False
        got = [d.outcome for d in list(self.s.decisions)[before:]]
        assert got == want_outcomes, (got, want_outcomes)
        assert ok == want_ok
        assert sorted(n for n, *_ in self.s.snapshot()) == want_table
        for d in list(self.s.decisions)[before:]:
            assert fit_decision(d.required, d.device_free, d.system_free, d.loaded, d.shared_memory,
                                alone_free=d.alone_free) == d.outcome
            if d.outcome == "load":
                assert not overcommits(d.required, d.device_free, d.system_free, len(d.loaded))
            if not d.loaded:
                assert d.outcome in ("load", "refuse")            # F1: first load, device alone
                assert (d.outcome == "load") == (d.required <= d.device_free)

    @rule(name=st.sampled_from(sorted(SIZES)))
    def unload(self, name):
        was = name in [n for n, *_ in self.s.snapshot()]
        assert self.s.unload(name) is was
        assert name not in [n for n, *_ in self.s.snapshot()]

    @precondition(lambda self: any(r.alive() for r in self.clients))
    @rule(data=st.data())
    def kill_a_runner(self, data):
        live = [r for r in self.clients if r.alive()]
        data.draw(st.sampled_from(live), label="victim").kill()

    @rule(device_total=st.integers(4, 24), other=st.integers(0, 16))
    def change_figures(self, device_total, other):
        self.device_total, self.other = device_total, other

    # ------------------------------------------------------------------ invariants
    @invariant()
    def r1_every_runner_outside_the_table_is_closed(self):
        in_table = {id(e.client) for e in self.s._entries.values()}
        for r in self.clients:
            if id(r) not in in_table:
                assert r.state == CLOSED and not r.alive(), f"R1: {r.model} pid {r.pid} leaked"

    @invariant()
    def one_runner_per_model(self):
        names = [n for n, *_ in self.s.snapshot()]
        assert len(names) == len(set(names))
        assert all(e.refs == 0 for e in self.s._entries.values())

    def teardown(self):
        self.s.close()
        assert all(r.state == CLOSED and not r.alive() for r in self.clients)


TestSchedulerMachine = SchedulerMachine.TestCase
