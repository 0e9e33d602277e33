"""The seed's historical scheduler and runner-client bugs, reintroduced in the serving code
(serve/scheduler.py, serve/client.py) as test-only monkeypatches: the spec's oracles
(spec/scheduler.py: F1 fit, R1 no orphan after close) catch each one."""
from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

import spec.scheduler as S
from spec.scheduler import NEW, IllegalTransition, no_orphan_after_close, overcommits
from tests.support.fake_engine import FAKE_ENGINE
from tests.support.in_process_runner import InProcessRunner
from tests.support.processes import runner_processes

GiB = 1 << 30


def test_bug_fit_check_without_the_system_bound_is_caught(monkeypatch):
    """Historical bug: the fit check ignored system free memory while other models were
    loaded. Reintroduced in the impl's scheduler, the spec oracle flags the overcommit."""
    import serve.scheduler as IS

    def run():
        sizes = {"a": 4 * GiB, "b": 4 * GiB}
        fig = {"system": 10 * GiB}
        s = IS.Scheduler(lambda n: InProcessRunner(n, sizes[n]), device_total=lambda: 10 * GiB,
                         system_free=lambda: fig["system"], required_bytes=lambda n: sizes[n],
                         known_model=lambda n: n in sizes)
        s.generate("a", [1], 1)
        fig["system"] = 2 * GiB
        s.generate("b", [1], 1)
        for d in s.decisions:
            assert d.outcome == S.fit_decision(d.required, d.device_free, d.system_free, d.loaded,
                                               d.shared_memory, d.alone_free), "decision disagrees with the spec"
            if d.outcome == "load":
                assert not overcommits(d.required, d.device_free, d.system_free, len(d.loaded)), \
                    f"F1: overcommitted {d}"
        s.close()

    run()  # the real code passes

    def device_only(required, device_free, system_free, loaded, shared_memory=True, alone_free=None):
        return S.fit_decision(required, device_free, 10 ** 18, loaded, shared_memory, alone_free)

    monkeypatch.setattr(IS, "fit_decision", device_only)
    with pytest.raises(AssertionError, match="disagrees|F1"):
        run()




def _our_child(pid: int) -> bool:
    try:
        return psutil.Process(pid).ppid() == os.getpid()
    except psutil.NoSuchProcess:
        return False


def r1_close_check(client) -> list:
    """The R1 check our tests apply: close, then the process must already be reaped (it is
    no longer our child, alive or zombie) and the spec transition must accept the close."""
    problems = []
    try:
        client.close()
    except IllegalTransition as e:
        problems.append(str(e))
    pid = client.pid
    if pid is not None and _our_child(pid):
        problems.append(f"R1: pid {pid} not reaped when close returned")
    return problems


def test_bug_close_returning_before_reap_is_caught(monkeypatch):
    """Historical bug: close signalled, waited a grace period, sent SIGKILL and returned
    without waiting, so the next load overlapped a dying runner."""
    import json

    from serve.client import RunnerClient

    good = RunnerClient("fake-a", engine=FAKE_ENGINE, runner_args=["--ignore-signals"], grace=0.2,
                        load_timeout=30)
    good.load()
    assert r1_close_check(good) == []

    def kill_without_reap(self, proc):
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(self.grace)
        os.killpg(proc.pid, signal.SIGKILL)   # ...and return at once: the bug

    def read_stdout_without_reaping(self, proc):
        # the start-up events only; no helper thread reaps behind close's back, so what the
        # check sees is close's own doing
        for raw in proc.stdout:
            ev = json.loads(raw)
            with self._cv:
                if ev.get("event") == "port":
                    self._port = ev["port"]
                elif ev.get("event") == "ready":
                    self._ready = ev
                self._cv.notify_all()

    monkeypatch.setattr(RunnerClient, "_kill_and_reap", kill_without_reap)
    monkeypatch.setattr(RunnerClient, "_read_stdout", read_stdout_without_reaping)
    bad = RunnerClient("fake-a", engine=FAKE_ENGINE, runner_args=["--ignore-signals"], grace=0.2,
                       load_timeout=30)
    bad.load()
    proc = bad._proc
    try:
        problems = r1_close_check(bad)
        assert problems, "the reintroduced bug was not caught"
        assert all("reaped" in p for p in problems), problems
    finally:
        proc.kill()
        proc.wait(10)


def test_bug_load_not_under_the_lock_is_caught(monkeypatch):
    """Historical bug: load started and recorded the process without the client's lock, so
    a close racing it found nothing to stop. Forced interleaving: load checks 'closed', close
    runs to completion, then load spawns - the runner outlives close."""
    from serve.client import ClientClosed, RunnerClient

    checked, closed_done = threading.Event(), threading.Event()

    def unlocked_load(self):
        with self._lock:
            if self._closed:
                raise ClientClosed("closed")
        checked.set()
        closed_done.wait(60)
        self._state = NEW   # the bug also skipped R1's state check
        with self._lock:
            self._closed_seen = self._closed
        # spawn + record outside the lock (the bug)
        saved, self._closed = self._closed, False
        try:
            self._start_locked()
        finally:
            self._closed = saved
        return {}

    def run(load_impl):
        checked.clear()
        closed_done.clear()     # the real run sets it: left set, the planted load would not wait for close
        c = RunnerClient("fake-a", engine=FAKE_ENGINE, load_timeout=30)
        if load_impl is not None:
            monkeypatch.setattr(RunnerClient, "load", load_impl)
        errors = []
        t = threading.Thread(target=lambda: _swallow(c.load, errors))
        t.start()
        checked.wait(10) if load_impl is not None else time.sleep(0.05)
        c.close()
        closed_done.set()
        t.join(60)
        assert not t.is_alive(), "load did not return within 60 s"
        orphan = c.pid is not None and c.alive()
        ok = no_orphan_after_close(True, orphan)
        if c._proc is not None and c._proc.poll() is None:
            c._proc.kill()
            c._proc.wait(10)
        return ok

    assert run(None)                 # the real load: nothing survives close
    assert not run(unlocked_load)    # the bug: a runner outlives close, and the check sees it
    assert not runner_processes()


def test_bug_load_allowed_after_close_is_caught(monkeypatch):
    from serve.client import ClientClosed, RunnerClient

    c = RunnerClient("fake-a", engine=FAKE_ENGINE, load_timeout=30)
    c.close()
    with pytest.raises(ClientClosed):
        c.load()

    def no_closed_check(self):
        self._closed, saved = False, self._closed
        try:
            RunnerClient._real_start(self)
        finally:
            self._closed = saved

    monkeypatch.setattr(RunnerClient, "_real_start", RunnerClient._start_locked, raising=False)
    monkeypatch.setattr(RunnerClient, "_start_locked", no_closed_check)
    c2 = RunnerClient("fake-a", engine=FAKE_ENGINE, load_timeout=30)
    c2.close()
    c2._state = NEW
    try:
        c2._start_locked()                                # the bug: starts a process after close
        assert not no_orphan_after_close(True, c2.alive())  # caught
    finally:
        if c2._proc is not None:
            c2._proc.kill()
            c2._proc.wait(10)


def _swallow(fn, errors):
    try:
        fn()
    except Exception as e:
        errors.append(e)
