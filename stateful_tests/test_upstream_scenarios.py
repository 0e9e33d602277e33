"""Ollama's three prefix-cache scenario timelines, run on the spec and on impl.

Ollama's x/mlxrunner tests its cache with three multi-request timelines on a hybrid layout
(recurrent, KV, recurrent, KV), captures every 8 keys and 4 before a prompt's end
(TestScenarioConversationTurns, TestScenarioCancelledPrefills and TestScenarioDivergentCancels in
prefix_cache_scenario_test.go at fb30760). The timelines are re-expressed here as data on our verbs.
Each runs twice:
- on the spec, every rule judged after every operation (spec_helpers' convention);
- on impl with the tracer's real MLX caches and ``check=True``, so impl asserts every rule itself.
The two must return the same (matched, resume) at every ``begin``.

Ollama asserts that a restore trails its match by at most the capture cadence plus the tokens
generated or dropped since. Ours asserts that bound too. It also asserts the exact resume offsets that
REFERENCE's close page-out (S3) and deepest restore (C2) give. Ollama's own draft look-ahead (keys
that pack token pairs) is not modelled, so its expected offsets are one key lower than ours.
"""
from __future__ import annotations

import itertools

import pytest

from impl.invariants import RuleViolation
from impl.prefix_cache import PrefixCache as ImplCache
from spec.cache import PrefixCache as SpecCache
from spec.rules import check, check_step
from spec.view import Op
from stateful_tests.mutants import MUTANTS, mutated
from stateful_tests.requests import kv, recurrent
from stateful_tests.tracer import Tracer

LAYERS = (recurrent(), kv(), recurrent(), kv())
INTERVAL, NEAR_END = 8, 4


class SpecDriver:
    """The spec, with every state and operation rule judged after each operation."""

    def __init__(self, chunk):
        self.pc = SpecCache(LAYERS, interval=INTERVAL, near_end=NEAR_END, chunk=chunk)

    def _do(self, name, *args):
        before, evicted = self.pc.view(), len(self.pc.victims)
        out = getattr(self.pc, name)(*args)
        op = Op(name, (tuple(args[0]), ()) if name == "begin" else args, out if name == "begin" else None,
                tuple(self.pc.victims[evicted:]))
        after = self.pc.view()
        violations = check(after) + check_step(before, op, after)
        assert violations == [], f"spec, after {name}: " + "\n".join(map(str, violations))
        return out

    def request(self, tokens, generated):
        result = self._do("begin", tokens)
        self._do("prefill")
        for key in [tokens[-1], *generated[:-1]]:
            self._do("step", key)
        self._do("close")
        return result

    def cancelled(self, tokens, stop):
        """A prefill cancelled at the first chunk end at or past `stop` (before the prompt's end)."""
        result = self._do("begin", tokens)
        while self.pc.offset < stop:
            assert self._do("prefill", 1) is False, "the cancel point must lie before the prompt's end"
        self._do("close")
        return result

    def probe(self, tokens):
        """begin, then close at once (a request cancelled before its first chunk)."""
        result = self._do("begin", tokens)
        self._do("close")
        return result


class ImplDriver:
    """impl on the tracer's real MLX caches, asserting every rule after each operation."""

    def __init__(self, chunk):
        self.tracer = Tracer(LAYERS)
        self.pc = ImplCache(self.tracer.caches, interval=INTERVAL, near_end=NEAR_END, check=True)
        self.chunk = chunk

    def _chunk(self, keys) -> bool:
        cut = self.pc.next_chunk(self.chunk)
        if cut is None:
            return False
        p, q = cut
        self.tracer.forward(p, keys[p:q], ())
        self.pc.evaluated(keys[p:q])
        return True

    def request(self, tokens, generated):
        result = self.pc.begin(tokens)
        while self._chunk(tokens):
            pass
        self.pc.prefilled()
        for key in [tokens[-1], *generated[:-1]]:
            self.tracer.forward(self.pc.offset, [key], ())
            self.pc.evaluated([key])
        self.pc.close()
        return result

    def cancelled(self, tokens, stop):
        result = self.pc.begin(tokens)
        while self.pc.offset < stop:
            ran = self._chunk(tokens)
            assert ran and self.pc.offset < len(tokens) - 1, "the cancel point must lie before the prompt's end"
        self.pc.close()
        return result

    def probe(self, tokens):
        result = self.pc.begin(tokens)
        self.pc.close()
        return result


def both(chunk):
    return SpecDriver(chunk), ImplDriver(chunk)


def agree(drivers, call, *args):
    """Run one request on every driver; all return the same (matched, resume)."""
    results = [getattr(d, call)(*args) for d in drivers]
    assert len(set(results)) == 1, f"{call}: spec {results[0]}, impl {results[1]}"
    return results[0]


def fresh_tokens():
    counter = itertools.count(1)
    return lambda n: [next(counter) for _ in range(n)]


def cadence_bound(generated_before: int, dropped: int) -> int:
    """Ollama's bound on matched - resume, without its look-ahead key."""
    return INTERVAL + NEAR_END + generated_before + dropped


# (kept tokens of the previous response (None: all), new tokens, response length, another session first)
TURNS = [(3, 9, 6, False), (None, 4, 5, False), (4, 6, 7, False), (None, 5, 6, False), (5, 8, 8, False),
         (4, 7, 6, True), (None, 6, 7, False), (3, 8, 6, False), (None, 5, 5, False), (4, 9, 6, False)]


def test_conversation_turns():
    """Each turn keeps all or part of the previous response. Keeping all of it extends the frontier and
    resumes exactly at the match. Dropping part of it resumes at
    the deepest checkpoint the trie can serve (C2, judged at every begin): at worst the previous
    prompt's near-end capture, well within Ollama's cadence bound."""
    drivers, fresh = both(chunk=16), fresh_tokens()
    stream, last = fresh(50), fresh(6)
    assert agree(drivers, "request", stream, last) == (0, 0)
    for i, (kept, new, length, away) in enumerate(TURNS):
        if away:
            agree(drivers, "request", fresh(24), fresh(4))
        dropped = 0 if kept is None else len(last) - kept
        prompt = stream + last[:kept] + fresh(new)
        generated = fresh(length)
        matched, resume = agree(drivers, "request", prompt, generated)
        assert matched == len(stream) + len(last[:kept]) - (dropped == 0), f"turn {i}: matched {matched}"
        if dropped == 0:
            assert resume == matched, f"turn {i}: an extension resumed at {resume}, not at its match {matched}"
        else:
            # The checkpoints near the match: the previous prompt's near-end capture, NEAR_END keys
            # before the response began, and the response's frontier, one key short of its end.
            assert len(stream) - NEAR_END <= resume <= matched, f"turn {i}: resumed at {resume}, the " \
                f"response began at {len(stream)}"
        assert matched - resume <= cadence_bound(len(last), dropped), f"turn {i}"
        stream, last = prompt, generated


def test_cancelled_prefills():
    """A cancelled prefill keeps the captures it crossed (section 2 step 6) and its frontier (S3): a
    prompt diverging inside the cancelled span resumes at the deepest crossed capture, and each retry
    resumes exactly where the cancelled attempt stopped."""
    drivers, fresh = both(chunk=9), fresh_tokens()
    prompt = fresh(47)
    assert agree(drivers, "cancelled", prompt, 18) == (0, 0)
    stopped = drivers[0].pc.offset
    assert stopped == 24 == drivers[1].pc.offset          # chunks end at the captures 8, 16, 24
    probe = prompt[:18] + fresh(10)
    assert agree(drivers, "probe", probe) == (18, 16)     # Ollama: 17 / 15 with its look-ahead key
    assert agree(drivers, "cancelled", prompt, 36) == (stopped, stopped)
    stopped = drivers[0].pc.offset
    assert stopped == 40
    assert agree(drivers, "request", prompt, fresh(6)) == (stopped, stopped)


def test_divergent_cancels():
    """Cancelled prefills that branch off the conversation mid-history, above and below its captures,
    cost the conversation nothing: its next turn and a later re-request resume exactly at the match."""
    drivers, fresh = both(chunk=5), fresh_tokens()
    prompt, generated = fresh(24), fresh(8)
    agree(drivers, "request", prompt, generated)
    stream = prompt + generated
    matched, resume = agree(drivers, "cancelled", stream[:2 * INTERVAL + 2] + fresh(20), 12)
    assert (matched, resume) == (18, 16)                  # past the cancel point 12: nothing evaluated
    prompt2, generated2 = stream + fresh(10), fresh(4)
    assert agree(drivers, "request", prompt2, generated2) == (len(stream) - 1,) * 2
    stream = prompt2 + generated2
    assert agree(drivers, "cancelled", stream[:INTERVAL - 2] + fresh(16), 14) == (6, 0)
    matched, resume = agree(drivers, "request", stream + fresh(12), fresh(5))
    assert matched == resume == len(stream) - 1
    assert matched - resume <= cadence_bound(len(generated2), 0)


@pytest.mark.parametrize("driver", [SpecDriver, ImplDriver])
def test_a_cancel_at_the_prompts_end_is_refused_by_the_driver(driver):
    """The timelines' cancel points lie before each prompt's end (else the 'cancel' completes)."""
    d, fresh = driver(9), fresh_tokens()
    with pytest.raises(AssertionError, match="the cancel point must lie before the prompt's end"):
        d.cancelled(fresh(10), 12)


# ------------------------------------------------------ the timelines catch reuse bugs
def test_ollamas_cancelled_prefill_bug_fails_the_cancel_timeline(monkeypatch):
    """Ollama's c44575ef1 bug, re-created on impl: close drops the captures a cancelled prefill crossed
    (section 2 step 6 keeps them). No rule judges the missing restore points, but the timeline does:
    impl's probe into the cancelled span no longer resumes where the spec's does."""
    monkeypatch.setattr(ImplCache, "attach", mutated(
        ImplCache.attach, "reached = self.offset", "reached = self.offset if req.prefilled else -1"))
    with pytest.raises(AssertionError, match=r"^probe: spec \(18, 16\), impl \(18, 0\)(\n|$)"):
        test_cancelled_prefills()


@pytest.mark.parametrize("key, timeline", [("P2", test_conversation_turns), ("C2", test_divergent_cancels)])
def test_reuse_mutants_fail_the_timelines(key, timeline):
    """The P2 mutant (compaction merges checkpoints away) and the C2 mutant (resume one checkpoint low)
    fail these timelines on impl's own rule assertions (check=True)."""
    mutant = MUTANTS[key]
    with mutant.apply(), pytest.raises(RuleViolation, match=rf"^after (attach|begin): ({'|'.join(mutant.cites)}) "):
        timeline()
