"""serve/collector.py: Python's full collections run at the runner's idle moments, never by themselves;
and the premise that makes deferring them safe: the prefix cache's requests leave no cyclic garbage."""
from __future__ import annotations

import argparse
import gc
import queue
import threading
import time
from concurrent.futures import Future

import pytest

from serve.collector import OUT_OF_REACH, IdleCollector


@pytest.fixture
def full_passes():
    """The full collections (generation 2) started while the test runs; thresholds restored after."""
    saved, started = gc.get_threshold(), []

    def note(phase, info):
        if phase == "start" and info["generation"] == 2:
            started.append(info)

    gc.callbacks.append(note)
    try:
        yield started
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*saved)


def churn_until(pending: int, collector: IdleCollector, limit: int = 2_000_000) -> None:
    """Allocate surviving container objects until generation 1 has run `pending` times since the last
    full collection (a bounded loop: the test fails instead of hanging if the count never moves)."""
    keep = []
    for i in range(limit):
        keep.append([i])
        if collector.pending() >= pending:
            return
    raise AssertionError(f"{pending} generation-1 collections not reached in {limit} allocations")


def test_installed_python_starts_no_full_collection(full_passes):
    c = IdleCollector().install()
    try:
        assert gc.get_threshold()[2] == OUT_OF_REACH
        churn_until(3 * c.due, c)
        assert full_passes == [], "Python started a full collection while the policy was installed"
    finally:
        c.uninstall()
    assert gc.get_threshold()[2] == c.due


def test_idle_runs_a_full_collection_only_when_due(full_passes):
    c = IdleCollector().install()
    try:
        gc.collect()
        full_passes.clear()
        assert not c.idle() and full_passes == []
        churn_until(c.due, c)
        assert c.idle() and len(full_passes) == 1
        assert c.pending() == 0 and c.passes == {"idle": 1, "backstop": 0} and c.pause_s > 0
    finally:
        c.uninstall()


def test_between_calls_only_past_the_backstop(full_passes):
    c = IdleCollector(backstop=3).install()
    try:
        gc.collect()
        full_passes.clear()
        churn_until(c.due, c)
        assert not c.after_call() and full_passes == []
        churn_until(3 * c.due, c)
        assert c.after_call() and len(full_passes) == 1 and c.passes["backstop"] == 1
    finally:
        c.uninstall()


def test_not_installed_it_runs_nothing(full_passes):
    c = IdleCollector()
    gc.set_threshold(700, 10, OUT_OF_REACH)      # (so that Python's own passes do not blur the count)
    churn_until(c.due * 2, c)
    assert not c.idle() and not c.after_call() and full_passes == []


@pytest.mark.parametrize("quiet_s, backstop", [(0, 1), (0.1, 0), (-1, 5)])
def test_bad_settings_are_refused(quiet_s, backstop):
    with pytest.raises(ValueError, match="quiet_s"):
        IdleCollector(quiet_s=quiet_s, backstop=backstop)


class Recording(IdleCollector):
    def __init__(self, log):
        super().__init__(quiet_s=0.05)
        self.log = log

    def install(self):
        self.log.append("install")
        return self

    def idle(self):
        self.log.append("idle")
        return False

    def after_call(self):
        self.log.append("after")
        return False


def test_the_runner_loop_collects_between_calls_and_at_idle_only():
    """RunnerState.serve_engine: the collector is installed first, asked after every call and, when no
    call has come for its quiet time, at idle; never while a call runs."""
    from serve.runner import RunnerState

    log = []
    state = RunnerState(argparse.Namespace(model="m"))
    state.collector = Recording(log)

    def call(name):
        def fn():
            log.append(name)
            return name
        return fn

    class Stop(BaseException):                            # (not an Exception: it ends the loop)
        pass

    def stop():
        raise Stop

    def serve():
        try:
            state.serve_engine()
        except Stop:
            pass

    first, second = Future(), Future()
    state._calls.put((call("a"), first))
    state._calls.put((call("b"), second))                # already waiting: no idle between a and b
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert second.result(timeout=10) == "b"
    deadline = time.monotonic() + 20                     # the queue stays empty past the quiet time
    while "idle" not in log and time.monotonic() < deadline:
        time.sleep(0.01)
    state._calls.put((stop, Future()))
    t.join(10)
    assert not t.is_alive()
    assert log[:5] == ["install", "a", "after", "b", "after"], log
    assert log[5] == "idle" and log[5:] == ["idle"], log


# --- the premise: no cyclic garbage from requests ---------------------------------------------

def cyclic_garbage_of_ours(run, requests: int) -> list:
    """The objects of impl's or MLX's types that only a full collection would free, after `requests`
    calls of run() with the collector off (a cycle of ours always holds at least one of them)."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(requests):
            run()
        gc.collect()
        found = [o for o in gc.garbage if type(o).__module__.split(".")[0] in ("impl", "mlx")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    return found


def test_the_detector_sees_a_cycle_of_ours():
    """The two tests below can fail: a node and a child that still point at each other once dropped
    (a detach that forgot one link) are found."""
    from impl.trie import Node, Trie

    def run():
        trie = Trie([])
        a = Node((1,), 0, 1, trie=trie)
        b = Node((2,), 1, 1, a, trie=trie)
        a.children[2] = b

    assert len([o for o in cyclic_garbage_of_ours(run, 3) if type(o) is Node and o.edge]) == 6   # (not the roots)


def test_trie_requests_with_evictions_leave_no_cyclic_garbage():
    from bench.trie_scale import Conversations, Model, request
    from impl.prefix_cache import PrefixCache

    model, conv = Model(), Conversations(0)
    pc = PrefixCache([model.cache], interval=0, near_end=0)

    def run():
        slot, prompt, answer = conv.next()
        request(pc, model, prompt, answer)
        conv.answered(slot, prompt, answer)

    for _ in range(100):
        run()
    pc.set_budget(pc.counter // 2)
    evictions = pc.evictions
    found = cyclic_garbage_of_ours(run, 300)
    assert pc.evictions - evictions > 100                # splits, merges and removals all ran
    assert found == [], f"{len(found)} objects of ours left in reference cycles: {found[:5]}"


def test_engine_requests_leave_no_cyclic_garbage():
    import random

    from impl.engine import Engine
    from impl.models import load

    eng = Engine(load("qwen3next"), budget_bytes=1 << 18, chunk_size=32)
    rng = random.Random(0)
    system = [rng.randrange(100, 40000) for _ in range(40)]
    convs = [list(system) for _ in range(3)]

    def run():
        k = rng.randrange(len(convs))
        convs[k] += [rng.randrange(100, 40000) for _ in range(8)]
        convs[k] += eng.generate(convs[k], max_tokens=3).tokens
        if len(convs[k]) > 200:
            convs[k] = list(system)

    for _ in range(6):
        run()
    evictions = eng.pc.evictions
    found = cyclic_garbage_of_ours(run, 30)
    assert eng.pc.evictions > evictions
    assert found == [], f"{len(found)} objects of ours left in reference cycles: {found[:5]}"
