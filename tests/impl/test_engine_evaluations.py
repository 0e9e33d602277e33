"""How often a request's cache bookkeeping synchronises with MLX (impl/caches/evaluation.py).

Every evaluation is a round trip to the MLX stream that costs tens of microseconds after a forward,
whatever it computes, so on a small model it is most of the bookkeeping. A request that switches
conversations on a hybrid model (qwen3next: recurrent layers beside full attention) makes:

- exactly one evaluation before its first forward where MLX's stream copies the views (a GPU): the
  page-in and the copies of the lazy views its first write overwrites, together (the views a later
  write overwrites are copied with the evaluation of the forward before it, Engine.copy_ahead, and stay
  lazy until that write); none where the views are copied on the host (the CPU device:
  impl/caches/host_rows.py); the restored rows themselves are written by the first forward's
  evaluation, in place;
- none in a decode step's bookkeeping here (no view lies past the prompt): a decode step makes one
  evaluation, its forward's own; and none at close (the page-out of the recurrent layers waits for
  the next forward, whose one evaluation takes it along, as it takes the captures its caches take).

A request that continues the conversation the live caches hold has nothing to copy out, so its page-in
makes no evaluation at all.

The rows stay right: each checked request passes C1 (test_engine_support.assert_c1; the engines are
`judged`: bit for bit against a same-schedule replay on mlx-lm's stock caches where such replays are
exact on this backend, else within the calibrated tolerance of a cold prefill).
"""
from __future__ import annotations

import pytest

import impl.caches.evaluation as evaluation
from impl.engine import Engine
from impl.models import load
from test_engine_support import assert_c1, judged
from tests.support.evaluations import COPIES, copies_made


@pytest.fixture(scope="module")
def hybrid():
    return load("qwen3next")


def recorder(monkeypatch, e: Engine) -> list:
    """Every evaluation the caches make, tagged with the request phase it happened in."""
    phase, log, real = ["idle"], [], evaluation.mx

    class Tagging:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def eval(*arrays):
            log.append(phase[0])
            real.eval(*arrays)

    monkeypatch.setattr(evaluation, "mx", Tagging())
    forward, close, generate = e._forward, e.pc.close, e.generate
    forwards = [0]

    def tagged_forward(tokens, p, media, spans, logits=True, **kw):
        forwards[0] += 1
        phase[0] = "decode" if logits and forwards[0] > 1 and len(tokens) == 1 and p >= e.pc.request.stats.total \
            else "forward"
        log.append(f"{phase[0]} starts")
        try:
            return forward(tokens, p, media, spans, logits, **kw)
        finally:
            phase[0] = "between"

    def tagged_close():
        phase[0] = "close"
        try:
            return close()
        finally:
            phase[0] = "idle"

    def tagged_generate(*a, **k):
        forwards[0], phase[0] = 0, "page-in"
        return generate(*a, **k)

    monkeypatch.setattr(e, "_forward", tagged_forward)
    monkeypatch.setattr(e.pc, "close", tagged_close)
    monkeypatch.setattr(e, "generate", tagged_generate)
    return log


@pytest.mark.parametrize("copies", COPIES)
def test_a_conversation_switch_synchronises_once_before_its_first_forward(hybrid, monkeypatch, copies):
    """Once with the stream's copies, not at all with the host's (the module's header)."""
    copies_made(monkeypatch, copies)
    e = judged(Engine(hybrid, capture_interval=1 << 20, near_end=0, check_rules=False))
    tok = hybrid.tokenizer
    system = {"role": "system", "content": "You answer every question in one short sentence, politely."}
    a = [system, {"role": "user", "content": "What colour is the sky on a clear day?"}]
    b = [system, {"role": "user", "content": "Name a large animal that lives in the sea."}]
    first = e.generate(a, max_tokens=12, stop_at_eos=False)
    e.generate(b, max_tokens=12, stop_at_eos=False)
    a2 = a + [{"role": "assistant", "content": tok.decode(first.tokens)},
              {"role": "user", "content": "And at sunset?"}]
    log = recorder(monkeypatch, e)
    r = e.generate(a2, max_tokens=12, stop_at_eos=False)
    assert r.stats.resumed > len(e.tokens_of([system])), r.stats   # back on A's branch, past the system prompt
    assert log.count("page-in") == (copies == "stream"), log
    steps = log.count("decode starts")
    assert steps == 11 and log.count("decode") == steps, log      # one evaluation a step: its forward's
    assert "close" not in log, log
    assert_c1(hybrid, e.tokens_of(a2), [], r)


def test_decode_asks_about_lazy_views_once_and_still_copies_those_it_overwrites(hybrid, monkeypatch):
    """The seed and the decode steps write rows [n-1, n-1+max_tokens) and make no view, so the engine
    asks once: when no lazy view lies there, no step calls before_write; when one does (a shorter
    conversation decoding over a longer one's tail), every step asks, so each step's copies of all
    layers ride on one evaluation (the step before's, copy_ahead), and the longer conversation,
    resumed, gets its own rows back (C1 against a cold prefill; a skipped question would not lose
    rows, as a KV write copies out the views it overwrites itself, but would evaluate the copies
    layer by layer)."""
    import impl.engine as engine_module

    calls = []
    real = engine_module.before_write
    monkeypatch.setattr(engine_module, "before_write", lambda caches, n: (calls.append(n), real(caches, n)))
    e = judged(Engine(hybrid, capture_interval=1 << 20, near_end=0))
    system = {"role": "system", "content": "You answer every question in one short sentence, politely."}
    long_q = [system, {"role": "user", "content": "Describe, in some detail, how a river carves a canyon "
                                                  "over millions of years, and what the rock layers show."}]
    short_q = [system, {"role": "user", "content": "Hi?"}]
    prefilled = e.pc.prefilled
    monkeypatch.setattr(e.pc, "prefilled", lambda: (calls.append("prefilled"), prefilled()))
    first = e.generate(long_q, max_tokens=6, stop_at_eos=False)
    assert calls[-1] == "prefilled", calls             # the prefill chunks asked; the seed and decode did not
    calls.clear()
    views_past = max(s.end for _, c in e.pc._kv for s in c._views)
    r = e.generate(short_q, max_tokens=40, stop_at_eos=False)
    n = r.prompt_tokens
    assert n + 40 > views_past > n                     # the decode overwrites the long conversation's tail
    assert calls[calls.index("prefilled") + 1:] == [1] * 40, calls    # then every step asks (seed, 39 steps)
    again = long_q + [{"role": "assistant", "content": hybrid.tokenizer.decode(first.tokens)},
                      {"role": "user", "content": "Shorter, please."}]
    resumed = e.generate(again, max_tokens=1)
    assert resumed.stats.resumed == resumed.stats.matched >= views_past, resumed.stats   # over the copied rows
    assert_c1(hybrid, e.tokens_of(again), [], resumed)


def test_a_continued_conversation_does_not_synchronise_before_its_first_forward(hybrid, monkeypatch):
    """Nothing to copy out (the conversation goes on where the live caches rest): the page-in makes no
    evaluation. The recurrent page-out the last close left pending is evaluated with the first
    forward (its slots are replaced, never written in place), and the restored rows stay right."""
    e = judged(Engine(hybrid, capture_interval=1 << 20, near_end=0, check_rules=False))
    a = [{"role": "system", "content": "You answer every question in one short sentence, politely."},
         {"role": "user", "content": "What colour is the sky on a clear day?"}]
    first = e.generate(a, max_tokens=12, stop_at_eos=False)
    a2 = a + [{"role": "assistant", "content": hybrid.tokenizer.decode(first.tokens)},
              {"role": "user", "content": "And at sunset?"}]
    log = recorder(monkeypatch, e)
    r = e.generate(a2, max_tokens=4, stop_at_eos=False)
    assert r.stats.resumed > first.prompt_tokens, r.stats        # on from the live caches
    assert "page-in" not in log and "close" not in log, log
    assert log.count("forward") == log.count("forward starts"), log    # one evaluation a forward
    assert_c1(hybrid, e.tokens_of(a2), [], r)


@pytest.mark.parametrize("copies", COPIES)
@pytest.mark.parametrize("ahead", [True, False], ids=["copy_ahead", "apart"])
def test_a_prefill_over_the_last_conversations_views_copies_them_with_the_forward_before(hybrid, monkeypatch, ahead,
                                                                                        copies):
    """A resumed conversation whose prefill runs on over the rows of the one before (lazy views in the
    live buffer, a node every few tokens) copies the views each chunk overwrites out with the evaluation
    of the forward before it (Engine.copy_ahead): every forward makes one evaluation, its own. Apart
    (copy_ahead off), each chunk that overwrites views evaluates their copies alone first with the
    stream's copies, and not at all with the host's. C1 holds."""
    copies_made(monkeypatch, copies)
    e = judged(Engine(hybrid, chunk_size=8, capture_interval=8, near_end=0, check_rules=False))
    monkeypatch.setattr(e, "copy_ahead", ahead)
    system = {"role": "system", "content": "You answer every question in one short sentence, politely."}
    a = [system, {"role": "user", "content": "Hi?"}]
    b = [system, {"role": "user", "content": "Describe, in some detail, how a river carves a canyon over "
                                             "millions of years, and what the rock layers show about it."}]
    first = e.generate(a, max_tokens=4, stop_at_eos=False)
    e.generate(b, max_tokens=4, stop_at_eos=False)
    b_end = e.pc.offset
    a2 = a + [{"role": "assistant", "content": hybrid.tokenizer.decode(first.tokens)},
              {"role": "user", "content": "Now tell me, in as much detail, how glaciers shape a valley."}]
    from impl.caches.kv import KVCache

    calls = []
    real = KVCache.before_write
    monkeypatch.setattr(KVCache, "before_write", lambda c, n: (calls.append((c.offset, c.would_copy(n))), real(c, n))[1])
    log = recorder(monkeypatch, e)
    r = e.generate(a2, max_tokens=2, stop_at_eos=False)
    n = r.prompt_tokens
    assert r.stats.resumed < first.prompt_tokens + len(first.tokens) < b_end < n, (r.stats, b_end, n)
    overwriting = {p for p, would in calls if would}
    assert len(overwriting) >= 3, calls                 # several chunks past the page-in overwrite views
    forwards = log.count("forward starts") + log.count("decode starts")
    evaluations = log.count("forward") + log.count("decode")
    if ahead or copies == "host":
        assert evaluations == forwards, log
    else:
        assert evaluations >= forwards + len(overwriting) - 1, log    # (the first chunk's: in the page-in)
    assert_c1(hybrid, e.tokens_of(a2), [], r)


@pytest.mark.parametrize("copies", COPIES)
def test_copies_are_made_ahead_only_where_they_save_an_evaluation(hybrid, monkeypatch, copies):
    """Engine.copy_ahead's default: on with the stream's copies (the copy rides on the forward's
    evaluation), off with the host's (nothing to evaluate: the copy is made right before its write and
    counted as bookkeeping); an explicit setting stands."""
    copies_made(monkeypatch, copies)
    assert Engine(hybrid).copy_ahead is (copies == "stream")
    monkeypatch.setattr(Engine, "copy_ahead", False)
    assert Engine(hybrid).copy_ahead is False
