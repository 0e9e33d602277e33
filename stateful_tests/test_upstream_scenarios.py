"""Ollama's three prefix-cache scenario timelines, run on the spec and on impl.

Ollama's x/mlxrunner tests its cache with three multi-request timelines on a hybrid layout
(recurrent, KV, recurrent, KV), captures every 8 keys and 4 before a prompt's end
(TestScenarioConversationTurns, TestScenarioCancelledPrefills and TestScenarioDivergentCancels in
prefix_cache_scenario_test.go at fb30760). The timelines are re-expressed here as data on our verbs.
Each runs on the spec and on impl (the tracer's real MLX caches, with ``check=True`` so that impl
asserts every rule itself), both as targets (targets/reference.py) fed program operations
(targets/program.py); every rule is judged on their views after every operation. The two must return
the same (matched, resume) at every ``begin``.

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
from spec.rules import check, check_step
from stateful_tests.mutants import MUTANTS, mutated
from stateful_tests.requests import kv, recurrent
from targets.program import apply, as_op
from targets.reference import ImplTarget, SpecTarget

LAYERS = (recurrent(), kv(), recurrent(), kv())
INTERVAL, NEAR_END = 8, 4


def both(chunk):
    """The spec and impl (the tracer's MLX caches, asserting every rule itself) as targets."""
    config = dict(chunk=chunk, interval=INTERVAL, near_end=NEAR_END)
    return SpecTarget(LAYERS, **config), ImplTarget(LAYERS, check=True, **config)


def do(target, op: dict):
    """Apply one program operation (targets.program); every state and operation rule holds after it."""
    before, seen = target.view(), len(target.victims)
    out = apply(target, op)
    after = target.view()
    found = check(after, target.RULES) + check_step(before, as_op(op, out, tuple(target.victims[seen:])), after,
                                                     target.RULES)
    assert found == [], f"{target.name}, after {op['op']}: " + "\n".join(map(str, found))
    return out


def begin(target, tokens):
    return do(target, dict(op="begin", keys=tokens, spans=[]))


def request(target, tokens, generated):
    """begin, the whole prefill, the decode (the prompt's last key, then every produced key but the last), close."""
    result = begin(target, tokens)
    do(target, dict(op="prefill", max_chunks=None))
    for key in [tokens[-1], *generated[:-1]]:
        do(target, dict(op="step", key=key))
    do(target, dict(op="close"))
    return result


def cancelled(target, tokens, stop):
    """A prefill cancelled at the first chunk end at or past `stop` (before the prompt's end)."""
    result = begin(target, tokens)
    while target.pc.offset < stop:
        done = do(target, dict(op="prefill", max_chunks=1))
        assert done is False, "the cancel point must lie before the prompt's end"
    do(target, dict(op="close"))
    return result


def probe(target, tokens):
    """begin, then close at once (a request cancelled before its first chunk)."""
    result = begin(target, tokens)
    do(target, dict(op="close"))
    return result


def agree(targets, timeline_step, *args):
    """Run one request on every target; all return the same (matched, resume)."""
    results = [timeline_step(t, *args) for t in targets]
    assert len(set(results)) == 1, f"{timeline_step.__name__}: spec {results[0]}, impl {results[1]}"
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
    targets, fresh = both(chunk=16), fresh_tokens()
    stream, last = fresh(50), fresh(6)
    assert agree(targets, request, stream, last) == (0, 0)
    for i, (kept, new, length, away) in enumerate(TURNS):
        if away:
            agree(targets, request, fresh(24), fresh(4))
        dropped = 0 if kept is None else len(last) - kept
        prompt = stream + last[:kept] + fresh(new)
        generated = fresh(length)
        matched, resume = agree(targets, request, prompt, generated)
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
    targets, fresh = both(chunk=9), fresh_tokens()
    prompt = fresh(47)
    assert agree(targets, cancelled, prompt, 18) == (0, 0)
    stopped = targets[0].pc.offset
    assert stopped == 24 == targets[1].pc.offset          # chunks end at the captures 8, 16, 24
    diverging = prompt[:18] + fresh(10)
    assert agree(targets, probe, diverging) == (18, 16)     # Ollama: 17 / 15 with its look-ahead key
    assert agree(targets, cancelled, prompt, 36) == (stopped, stopped)
    stopped = targets[0].pc.offset
    assert stopped == 40
    assert agree(targets, request, prompt, fresh(6)) == (stopped, stopped)


def test_divergent_cancels():
    """Cancelled prefills that branch off the conversation mid-history, above and below its captures,
    cost the conversation nothing: its next turn and a later re-request resume exactly at the match."""
    targets, fresh = both(chunk=5), fresh_tokens()
    prompt, generated = fresh(24), fresh(8)
    agree(targets, request, prompt, generated)
    stream = prompt + generated
    matched, resume = agree(targets, cancelled, stream[:2 * INTERVAL + 2] + fresh(20), 12)
    assert (matched, resume) == (18, 16)                  # past the cancel point 12: nothing evaluated
    prompt2, generated2 = stream + fresh(10), fresh(4)
    assert agree(targets, request, prompt2, generated2) == (len(stream) - 1,) * 2
    stream = prompt2 + generated2
    assert agree(targets, cancelled, stream[:INTERVAL - 2] + fresh(16), 14) == (6, 0)
    matched, resume = agree(targets, request, stream + fresh(12), fresh(5))
    assert matched == resume == len(stream) - 1
    assert matched - resume <= cadence_bound(len(generated2), 0)


@pytest.mark.parametrize("which", [0, 1], ids=["spec", "impl"])
def test_a_cancel_at_the_prompts_end_is_refused(which):
    """The timelines' cancel points lie before each prompt's end (else the 'cancel' completes)."""
    target, fresh = both(9)[which], fresh_tokens()
    with pytest.raises(AssertionError, match="the cancel point must lie before the prompt's end"):
        cancelled(target, fresh(10), 12)


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
