"""R1 on the real RunnerClient with real runner processes (fake engine).

- close kills and reaps: a runner that ignores SIGINT/SIGTERM is dead *and reaped* when close
  returns;
- load starts and records the process under the lock and refuses once close has run;
- close racing load (Hypothesis-drawn timings, bounded) never leaves a runner alive;
- a runner that died on its own is reported clearly.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import serve.client as client_mod
from serve.client import ClientClosed, RunnerClient, RunnerDied, RunnerError
from spec.scheduler import IllegalTransition, client_transition, no_orphan_after_close
from tests.support.fake_engine import FAKE_ENGINE
from tests.support.processes import runner_processes

pytestmark = pytest.mark.usefixtures("bounded_and_clean")


def reaped(pid: int) -> bool:
    """True when ``pid`` is no longer a child of ours, alive or zombie (read from /proc, without
    collecting it ourselves, which would hide a close that did not)."""
    try:
        return psutil.Process(pid).ppid() != os.getpid()
    except psutil.NoSuchProcess:
        return True


def fake_client(*args, **kw) -> RunnerClient:
    kw.setdefault("load_timeout", 30)
    return RunnerClient("fake-a", engine=FAKE_ENGINE, runner_args=list(args), **kw)


def test_close_kills_a_runner_that_ignores_signals_and_reaps_it():
    c = fake_client("--ignore-signals", grace=0.3)
    c.load()
    pid = c.pid
    os.kill(pid, signal.SIGINT)
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.1)
    assert c.alive(), "the runner was asked to ignore SIGINT/SIGTERM"
    t0 = time.monotonic()
    c.close()
    took = time.monotonic() - t0
    assert c._proc.returncode == -signal.SIGKILL
    assert reaped(pid), "R1: close returned before the process was reaped"
    assert 0.3 <= took < 3.0
    assert c.state == "closed"


def test_close_from_every_state_ends_closed():
    c = fake_client()
    c.close()                      # new
    assert c.state == "closed"
    c2 = fake_client("--fake-load-delay", "5")
    t = threading.Thread(target=lambda: pytest.raises(ClientClosed, c2.load), daemon=True)
    t.start()
    while c2.pid is None:
        time.sleep(0.01)
    c2.close()                     # loading
    t.join(10)
    assert not t.is_alive() and c2.state == "closed" and reaped(c2.pid)
    c3 = fake_client()
    c3.load()
    c3.close()                     # loaded
    c3.close()                     # closed (idempotent)
    assert c3.state == "closed" and reaped(c3.pid)


def test_load_after_close_refuses_and_starts_nothing():
    c = fake_client()
    c.close()
    before = runner_processes()
    with pytest.raises(ClientClosed, match="R1"):
        c.load()
    assert c.pid is None and runner_processes() == before


def test_concurrent_closes_all_return_after_the_reap():
    c = fake_client("--ignore-signals", grace=0.2)
    c.load()
    pid = c.pid
    results = []

    def close():
        c.close()
        results.append(c._proc.returncode is not None and not c.alive())

    ts = [threading.Thread(target=close) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert results == [True] * 4 and reaped(pid)


def test_runner_that_died_on_its_own_is_reported_clearly():
    c = fake_client()
    c.load()
    os.kill(c.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while c.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not c.alive()
    with pytest.raises(RunnerDied) as ei:
        c.generate([1, 2], 3)
    msg = str(ei.value)
    assert "fake-a" in msg and "SIGKILL" in msg and str(c.pid) in msg
    c.close()
    assert c.state == "closed"


def test_client_states_follow_the_spec_model():
    c = fake_client()
    seen = [c.state]
    c.load()
    seen.append(c.state)
    c.close()
    seen.append(c.state)
    model = ["new"]
    for ev in ("load", "ready", "close"):
        model.append(client_transition(model[-1], ev))
    assert seen == ["new", "loaded", "closed"] and model == ["new", "loading", "loaded", "closed"]
    with pytest.raises(IllegalTransition):
        client_transition(c.state, "load")


def _race_examples() -> int:
    return max(5, settings().max_examples // 4)


@settings(max_examples=_race_examples())
@given(close_after=st.floats(0, 0.25), spawn_delay=st.sampled_from([0.0, 0.01, 0.05]),
       load_delay=st.sampled_from([0.0, 0.05, 0.2]), ignore_signals=st.booleans())
def test_close_racing_load_never_leaves_a_runner_alive(monkeypatch_popen, close_after, spawn_delay,
                                                       load_delay, ignore_signals):
    """R1: whatever the interleaving of load and close, once close has returned no runner
    process of the client is alive (spec.scheduler.no_orphan_after_close) and a late load
    refuses. The spawn delay widens the window between starting the process and recording it."""
    monkeypatch_popen["delay"] = spawn_delay
    args = ["--fake-load-delay", str(load_delay)] + (["--ignore-signals"] if ignore_signals else [])
    c = fake_client(*args, grace=0.1)
    outcome = []

    def load():
        try:
            c.load()
            outcome.append("loaded")
        except (ClientClosed, RunnerError) as e:
            outcome.append(type(e).__name__)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    time.sleep(close_after)
    c.close()
    pid = c.pid
    assert no_orphan_after_close(True, pid is not None and not reaped(pid))
    t.join(15)
    assert not t.is_alive()
    assert outcome and outcome[0] in ("loaded", "ClientClosed", "RunnerLoadError")
    assert c.state == "closed"
    with pytest.raises(ClientClosed):
        c.load()
    assert not runner_processes()


@pytest.fixture(scope="module")
def monkeypatch_popen():
    """Delay subprocess.Popen inside serve.client (the window R1 protects)."""
    knobs = {"delay": 0.0}
    real = subprocess.Popen

    def slow_popen(*a, **kw):
        time.sleep(knobs["delay"])
        return real(*a, **kw)

    class Sub:
        Popen = staticmethod(slow_popen)

        def __getattr__(self, name):
            return getattr(subprocess, name)

    client_mod.subprocess = Sub()
    try:
        yield knobs
    finally:
        client_mod.subprocess = subprocess
