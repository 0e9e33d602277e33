"""Cancellation at every chunk boundary of a long prompt (REFERENCE section 2, step 6).

For every k, a fresh Engine gets a cancel callable that answers True from its (k+1)-th call: the
Engine asks it before each prefill chunk and after each decoded token, so k = 0..C-1 stops the prefill
after k chunks and k = C (the number of chunks) stops the decode after its first token. Then:
  - the request reports cancelled, with no tokens (or one, for k = C) and stats that add up;
  - close() kept every capture the prefill crossed (a user node ending at each) and none it did not
    reach, and paged out the frontier at the live offset;
  - the same request again resumes from there (stats.resumed >= the last crossed capture; exactly the
    offset reached when the prefill was cut), its greedy tokens equal an uncancelled run's, and it
    passes C1 (test_engine_support.assert_c1): every engine is `judged`, so where same-schedule
    replays are bit-identical on this backend its first logits equal, bit for bit, a cold replay on
    mlx-lm's stock caches of the forwards that wrote the state it resumed (the cancelled request's
    chunks, then its own), and its greedy tokens are that replay's argmax; elsewhere the first logits
    lie within the calibrated tolerance of one cold forward on the stock caches.
"""
from __future__ import annotations

import numpy as np
import pytest

from impl.engine import Engine
from test_engine_support import ForwardSpy, assert_c1, assert_stats_consistent, judged, nodes

CASES = [("qwen3next", 70, 8, 4), ("gemma3", 70, 8, 4), ("mamba2", 70, 8, 4), ("smollm2", 26, 8, 2)]
INTERVAL, NEAR_END = 16, 4


class CancelAfter:
    def __init__(self, k: int):
        self.k, self.calls = k, 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls > self.k


@pytest.mark.parametrize("name,n,chunk,new", CASES)
def test_cancel_at_every_chunk_boundary(name, n, chunk, new, models):
    lm = models[name]
    prompt = np.random.default_rng(11).integers(1, lm.vocab_size, n).tolist()
    make = lambda: judged(Engine(lm, chunk_size=chunk, capture_interval=INTERVAL, near_end=NEAR_END,
                                 check_rules=True))
    captures = sorted(set(range(INTERVAL, n, INTERVAL)) | {n - NEAR_END})

    ref_engine = make()
    spy = ForwardSpy(ref_engine)
    ref = ref_engine.generate(prompt, new, stop_at_eos=False)
    chunks = [c for c in spy.calls if c[1] <= n - 1]
    assert chunks[-1][1] == n - 1 and len(chunks) == len(spy.calls) - new
    assert_c1(lm, prompt, [], ref, what="uncancelled")

    for k in range(len(chunks) + 1):
        e = make()
        cancel = CancelAfter(k)
        r = e.generate(prompt, new, cancel=cancel, stop_at_eos=False)
        assert r.cancelled, k
        in_prefill = k < len(chunks)
        if in_prefill:
            reached = chunks[k - 1][1] if k else 0                 # the end of the last chunk run
            assert r.tokens == [] and r.first_logits is None, k
            assert r.stats.prefilled == reached and e.dump_json()["offset"] == reached, (k, r.stats)
        else:
            reached = n                                            # the whole prompt; the token is not fed
            assert r.tokens == ref.tokens[:1], k                   # cancelled after the first token
            assert_c1(lm, prompt, [], r, what="cancelled after the first token")
            assert e.dump_json()["offset"] == n
        assert_stats_consistent(r, n)
        crossed = [c for c in captures if c <= reached]
        assert r.stats.captures == len(crossed), (k, r.stats, crossed)
        user_ends = {s_e for _, s_e, user, _, _ in nodes(e) if user}
        assert set(crossed) <= user_ends, (k, crossed, e.dump())
        assert not {c for c in captures if c > reached} & {end for _, end, *_ in nodes(e)}, e.dump()
        if reached:
            frontier = [x for x in nodes(e) if x[3]][-1]
            assert frontier[1] == reached and "-" not in frontier[4], e.dump()   # paged out, all layers

        again = e.generate(prompt, new, stop_at_eos=False)
        assert not again.cancelled
        last = crossed[-1] if crossed else 0
        assert again.stats.resumed >= last, (k, again.stats, crossed)
        if in_prefill:
            assert again.stats.resumed == reached, (k, again.stats)
        assert again.tokens == ref.tokens, k
        assert_c1(lm, prompt, [], again, what=f"again after a cancel at call {k + 1}")


class Boom(Exception):
    pass


@pytest.mark.parametrize("name", ["qwen3next", "smollm2"])
@pytest.mark.parametrize("how", ["cancel", "raise"])
def test_a_decode_stopped_midway_keeps_every_token_it_evaluated(name, how, models):
    """The Engine reports its decode steps to the prefix cache in one call before close; a decode stopped
    after its j-th token, by a cancel or by on_token raising, has evaluated the seed and j-1 tokens, and
    close records exactly those: the live offset, the trie's frontier and a next request's resume."""
    lm = models[name]
    n, new = 20, 5
    prompt = np.random.default_rng(5).integers(1, lm.vocab_size, n).tolist()
    ref = Engine(lm, check_rules=True).generate(prompt, new, stop_at_eos=False)
    for j in range(1, new):
        e = Engine(lm, check_rules=True)
        seen = []

        def on_token(tok):
            seen.append(tok)
            if how == "raise" and len(seen) == j:
                raise Boom(j)

        if how == "raise":
            with pytest.raises(Boom):
                e.generate(prompt, new, on_token=on_token, stop_at_eos=False)
        else:
            r = e.generate(prompt, new, on_token=on_token, cancel=lambda: len(seen) >= j, stop_at_eos=False)
            assert r.cancelled and r.tokens == ref.tokens[:j], (j, r.tokens)
        assert seen == ref.tokens[:j], j
        fed = prompt + ref.tokens[:j - 1]
        assert e.pc.request is None and list(e.pc.seq) == fed, (j, e.pc.seq[n - 1:])
        assert e.dump_json()["offset"] == len(fed) and [x for x in nodes(e) if x[3]][-1][1] == len(fed), e.dump()
        again = e.generate(fed + [ref.tokens[j - 1]], 1, stop_at_eos=False)
        assert again.stats.resumed == len(fed) and again.tokens == ref.tokens[j:j + 1], (j, again.stats)


def test_a_cancel_leaves_the_views_the_next_chunk_would_overwrite_lazy(models):
    """The views a chunk overwrites are copied with the evaluation of the forward before it
    (Engine.copy_ahead) but stay lazy until the chunk's write: a cancel between the two leaves them lazy
    (REFERENCE section 1: copied out only when the live cache must overwrite them), owning 0 bytes, and
    the copies made ahead go with the request. The last conversation, resumed, gets its rows back (C1)."""
    lm = models["smollm2"]                  # KV layers only: chunks are never cut at captures
    rng = np.random.default_rng(3)
    system, long_tail, short_tail = (rng.integers(1, lm.vocab_size, k).tolist() for k in (24, 48, 6))
    e = judged(Engine(lm, chunk_size=8, capture_interval=8, near_end=0, check_rules=True))
    e.generate(system + short_tail, 2, stop_at_eos=False)
    e.generate(system + long_tail, 2, stop_at_eos=False)               # its nodes: views in the live buffer
    views = {id(s): s for _, c in e.pc._kv for s in c._views}
    r = e.generate(system + short_tail + rng.integers(1, lm.vocab_size, 40).tolist(), 2,
                   cancel=CancelAfter(1), stop_at_eos=False)                # one chunk past the page-in
    assert r.cancelled and len(r.stats.chunks) == 1, r.stats
    (_, reached), = r.stats.chunks
    kept = [s for s in views.values() if not s.closed]
    nxt = [s for s in kept if reached <= s.start < reached + 8]     # views only the next chunk overwrites
    assert nxt and all(s.lazy and s.size == 0 and s._ahead is None for s in nxt), nxt
    assert not any(c._ahead for _, c in e.pc._kv)
    owned = [s for s in kept if not s.lazy]
    assert all(s.start < reached and s.end > r.stats.resumed for s in owned), owned   # only rows written
    again = e.generate(system + long_tail + [7], 1, stop_at_eos=False)
    assert again.stats.resumed >= len(system) + len(long_tail) - 8, again.stats
    assert_c1(lm, system + long_tail + [7], [], again)
