"""Conformance: impl against spec, step by step, one state machine per layer
mix (stateful_tests/machines.py). Volume comes from the Hypothesis profile
(root conftest.py: ci / dev / nightly); the example database from
stateful_tests/conftest.py.

The kept examples at the bottom are shrunk programs exactly as Hypothesis
printed them, turned into plain regression tests.
"""
from __future__ import annotations

from stateful_tests.conftest import stateful_settings
from stateful_tests.machines import (HybridMachine, KvKvMachine, KvMachine, KvRecurrentMachine,
                                     KvWindowedMachine, Media, RecurrentMachine, WindowedMachine)

TestKv = KvMachine.TestCase
TestKvKv = KvKvMachine.TestCase
TestKvRecurrent = KvRecurrentMachine.TestCase
TestRecurrent = RecurrentMachine.TestCase
TestKvWindowed = KvWindowedMachine.TestCase
TestWindowed = WindowedMachine.TestCase
TestHybrid = HybridMachine.TestCase
for _case in (TestKv, TestKvKv, TestKvRecurrent, TestRecurrent, TestKvWindowed, TestWindowed, TestHybrid):
    _case.settings = stateful_settings()
del _case


def run_all_invariants(state) -> None:
    state.checks()


def test_windowed_noop_restore_after_wrap_hybrid():
    """Found by HybridMachine, shrunk by Hypothesis (steps as printed,
    invariants folded into run_all_invariants). Before 4727b7f,
    WindowedCache.restore(None, t) with t == offset (the no-op "live" restore
    in begin) reset the ring index of a window wrapped by single-token writes:
    the live window decoded to the wrong positions (C1 at the windowed layer
    after regenerate) and later captures were scrambled (S2). It was a strict
    xfail until then."""
    state = HybridMachine()
    state.configure(chunk=1, interval=0, near_end=0, budget=0)
    state.new_conversation(media=[], text=[1, 1, 1, 1, 1, 1, 1, 1])
    for _ in range(7):
        state.prefill_chunk()
        run_all_invariants(state)
    conversations_0 = state.close()
    run_all_invariants(state)
    state.regenerate(conv=conversations_0)
    run_all_invariants(state)          # C1 at layer 1 (the windowed layer)
    state.teardown()


def test_machines_replay_as_printed():
    """A printed program runs as is: Media values and plain lists as arguments."""
    state = KvRecurrentMachine()
    state.configure(chunk=3, interval=4, near_end=2, budget=150)
    run_all_invariants(state)
    state.new_conversation(text=[1, 2, 3, 4, 1, 2], media=[Media(at=1, length=3, data=b"a", causal=False)])
    while state.req.prefilled is False:
        state.prefill_chunk()
        run_all_invariants(state)
    state.produce(tokens=[2, 3])
    conversations_0 = state.close()
    run_all_invariants(state)
    state.edit(conv=conversations_0, at=3, text=[4, 4], media=[])
    state.cancel()
    run_all_invariants(state)
    state.teardown()
