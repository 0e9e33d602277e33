"""The cold oracle: what a request would give with no cache at all, and the chunking tie.

Used where C1 is judged by the calibrated tolerance (fuzz/calibrate.py; fuzz/replay.py judges it
exactly wherever same-schedule replays are bit-identical). Cold run: text-only prompts -> mlx-lm's
own stock caches (make_prompt_cache), one forward of the whole prompt, then greedy steps: an
independent path. Prompts with media -> a fresh Engine with an empty trie and one prefill chunk
(stock caches cannot build the bidirectional mask of a non-causal item). Cold results are cached
per (model, prompt, media) keeping the longest greedy run, so repeats and smaller max_tokens are free.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from impl.engine import Engine

from .alive import register, teardown
from .workload import media_from_json


@dataclass
class Cold:
    logits: np.ndarray          # last prompt position, float32
    tokens: list                # greedy tokens (stops after eos)
    gaps: list                  # cold top-2 logit gap before each token
    eos: bool                   # the run ended at eos (so it covers any max_tokens)


def _top2_gap(logits: mx.array) -> float:
    t = mx.topk(logits.astype(mx.float32), 2)
    return float(mx.abs(t[0] - t[1]).item())


class ColdOracle:
    def __init__(self):
        self.cache: dict = {}
        self.hits = self.misses = 0
        self.seconds = 0.0

    def get(self, loaded, tokens, media_json, max_tokens: int) -> Cold:
        key = (loaded.name, getattr(loaded, "dtype", "float32"), tuple(tokens), tuple(sorted((m["pos"], m["length"], m["data"], tuple(m["dims"]),
                                                          m["causal"]) for m in media_json)))
        have = self.cache.get(key)
        if have is not None and (have.eos or len(have.tokens) >= max_tokens):
            self.hits += 1
            return have
        self.misses += 1
        t0 = time.perf_counter()
        n = max(max_tokens, 1, len(have.tokens) if have else 0)
        cold = self._media(loaded, tokens, media_json, n) if media_json else self._stock(loaded, tokens, n)
        self.seconds += time.perf_counter() - t0
        self.cache[key] = cold
        if len(self.cache) > 4096:
            self.cache.pop(next(iter(self.cache)))
        return cold

    @staticmethod
    def _stock(loaded, tokens, n: int) -> Cold:
        from mlx_lm.models.cache import make_prompt_cache

        model, eos = loaded.model, loaded.tokenizer.eos_token_id
        cache = make_prompt_cache(model)
        logits = model(mx.array([list(tokens)]), cache=cache)[0, -1]
        mx.eval(logits)
        first = np.array(logits.astype(mx.float32))
        toks, gaps = [], []
        while True:
            gaps.append(_top2_gap(logits))
            t = int(mx.argmax(logits).item())
            toks.append(t)
            if t == eos or len(toks) >= n:
                break
            logits = model(mx.array([[t]]), cache=cache)[0, -1]
            mx.eval(logits)
        del cache, logits
        return Cold(first, toks, gaps, toks[-1] == eos)

    @staticmethod
    def _media(loaded, tokens, media_json, n: int) -> Cold:
        gaps = []

        def sampler(logits):
            gaps.append(_top2_gap(logits[0, -1]))
            return int(mx.argmax(logits[0, -1]).item())

        eng = Engine(loaded, 1 << 62, chunk_size=1 << 20, capture_interval=0, near_end=0)
        register(eng)
        try:
            r = eng.generate(list(tokens), max_tokens=n, media=[media_from_json(m) for m in media_json],
                             sampler=sampler)
            first = np.array(r.first_logits.astype(mx.float32))
            toks = list(r.tokens)
        finally:
            teardown(eng)
        eos = loaded.tokenizer.eos_token_id
        return Cold(first, toks, gaps, bool(toks) and toks[-1] == eos)



def chunking_tie(lm, tokens, media, r, first, tol: float) -> dict | None:
    """A C1-logits mismatch the model's own instability explains: the cold path, cut where this
    request's forwards were cut (with or without the decode seed's own forward, or once at the
    resume), gives a result within tol of ours (`first`, float32) that itself differs by more than
    tol from the cold run's one forward (run here, not taken from a cold cache: a cold answer that
    is itself wrong, as test_calibration plants, must still fail). The cold path: mlx-lm's stock
    caches for text; for a prompt with media, a fresh Engine's own forwards (fuzz.calibrate.
    media_cut_forward), whose one-forward run is the media prompt's cold answer.
    deepseek_v32's indexer keeps the top-k keys by score, so float noise from where a forward is cut
    (1e-6) can swap a key at the top-k boundary and move the logits by 0.25 with stock caches alone
    (docs/fuzz.md); qwen3next (mixture-of-experts routing) moved one media prompt's logits by
    7.2e-5, over its tol of 6.7e-5, between one forward and chunks of 1 (the model machine's nightly
    run, stateful_tests/test_model_machine.py). For a model whose logits are continuous in that
    noise no cut differs from one forward by more than tol, so this never applies. None otherwise."""
    from .calibrate import cut_forward, media_cut_forward

    n, resume = len(tokens), r.stats.resumed
    if media:
        run = lambda cuts: np.array(media_cut_forward(lm, tokens, media, cuts))
        one = run([0, n - 1, n])
    else:
        run = lambda cuts: np.array(cut_forward(lm, tokens, cuts, stock=True))
        one = run([0, n])
    own = _cuts(r, n)
    ways = [own, [c for c in own if c != n - 1] if n - 1 > resume else own, sorted({0, resume, n})]
    for cuts in ways:
        cut = run(cuts)
        ours, model = float(np.abs(first - cut).max()), float(np.abs(one - cut).max())
        if ours <= tol < model:
            return {"cuts": cuts, "ours_vs_cut": ours, "one_forward_vs_cut": model}
    return None


def _cuts(r, n: int) -> list:
    """The forward boundaries of a request's own prefill: its resume, its chunks' ends, the seed."""
    return sorted({0, r.stats.resumed, n - 1, n} | {q for _, q in r.stats.chunks})
