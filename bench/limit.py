"""The limit runner of ``python -m bench.scale``: ours' TTFT against the forward of exactly the tokens
ours prefilled, on a stock mlx-lm cache that already holds the prefix ours resumed from.

For every request ours served (same prompt, in the same order, in the same process and device):
  untimed  ``mlx_lm.models.cache.make_prompt_cache(model)``, then the prompt's first ``resumed`` tokens
           (``Stats.resumed``: where ours' restore landed) in forwards of ``chunk`` tokens, each followed
           by ``mx.eval`` of every layer's state;
  timed    the forwards ours ran, at the same offsets (``Stats.chunks``: the prefill's [p, q), evaluated
           as ours does, caches only, no vocabulary projection), then the decode seed (the prompt's last
           token) with its logits and the caches evaluated, then greedy sampling of the first token
           (``argmax(...).item()``).
Ours' TTFT (``Result.ttft_s``) runs from the call of ``Engine.generate`` to the first sampled token:
input checks, ``begin`` (trie match, page-in of the resumed state), the same prefill forwards and seed,
the same sampling, and every bookkeeping step between them (captures, lazy-view copies). So TTFT ours /
limit = 1 means the cache costs nothing beyond the physical forward of the uncovered tokens.

Stock caches differ from ours in one way that favours neither side by design: mlx-lm's ``KVCache``
grows its buffer 256 rows at a time by concatenation, ours reserves the request's rows up front.
"""
from __future__ import annotations

import statistics
import time

import mlx.core as mx
import numpy as np


def check_plan(n: int, resumed: int, chunks) -> list:
    """The prefill forwards ours reported, validated: contiguous, from ``resumed`` to the seed at n - 1."""
    chunks = [tuple(c) for c in chunks]
    if not 0 <= resumed <= n - 1:
        raise ValueError(f"resumed offset {resumed} outside [0, {n - 1}] for a {n}-token prompt")
    at = resumed
    for p, q in chunks:
        if p != at or q <= p:
            raise ValueError(f"prefill chunks {chunks} are not contiguous from the resume offset {resumed}")
        at = q
    if at != n - 1:
        raise ValueError(f"prefill chunks {chunks} end at {at}, not at the decode seed {n - 1}")
    return chunks


def _states(cache) -> list:
    return [c.state for c in cache]


class Limit:
    def __init__(self, lm, *, chunk: int):
        self.model, self.chunk = lm.model, chunk

    def prepare(self, prompt, resumed: int):
        """Untimed: a stock cache holding the prompt's first ``resumed`` tokens, evaluated."""
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(self.model)
        for p in range(0, resumed, self.chunk):
            self.model(mx.array([prompt[p:min(p + self.chunk, resumed)]]), cache=cache)
            mx.eval(_states(cache))
        return cache

    def time(self, prompt, chunks, cache) -> tuple:
        """Timed: the prefill forwards ``chunks``, the seed with logits, the first greedy token.
        Returns (seconds, token)."""
        n = len(prompt)
        mx.synchronize()
        t0 = time.perf_counter()
        for p, q in chunks:
            self.model(mx.array([prompt[p:q]]), cache=cache)
            mx.eval(_states(cache))
        logits = self.model(mx.array([prompt[n - 1:]]), cache=cache)
        mx.eval(logits, _states(cache))
        token = int(mx.argmax(logits[0, -1]).item())
        return time.perf_counter() - t0, token

    def run(self, prompt, resumed: int, chunks) -> dict:
        prompt = [int(t) for t in prompt]
        chunks = check_plan(len(prompt), resumed, chunks)
        t0 = time.perf_counter()
        cache = self.prepare(prompt, resumed)
        prep = time.perf_counter() - t0
        ttft, token = self.time(prompt, chunks, cache)
        del cache
        return {"ttft_s": ttft, "token": token, "prep_s": prep}


def ratio_stats(ours: list, limit: list) -> dict:
    """Per-request TTFT ours / limit: median, p90 (numpy's linear interpolation) and max."""
    if not limit or len(ours) != len(limit) or min(limit) <= 0:
        raise ValueError(f"TTFT / limit needs as many ours as limit times, at least one, the limit's > 0 "
                         f"(got {len(ours)} and {len(limit)}, min {min(limit, default=None)})")
    r = [a / b for a, b in zip(ours, limit)]
    return {"median": statistics.median(r), "p90": float(np.percentile(r, 90)), "max": max(r), "per_request": r}


def measure(lm, ours: dict, prompts: list, *, chunk: int, warm_prompt=None) -> dict:
    """The limit of every request in ``ours`` (bench.scale's measure() result for the ours runner, whose
    rows carry ``resumed``, ``chunks`` and ``first``); ``prompts``: the prompts ours served, in order.
    Adds ``ttft_over_limit`` to ``ours`` and returns the limit runner's own result."""
    if len(prompts) != len(ours["rows"]):
        raise ValueError(f"{len(prompts)} prompts for {len(ours['rows'])} requests of ours")
    runner = Limit(lm, chunk=chunk)
    if warm_prompt is not None:                  # kernel compilation excluded, as for the other runners
        n = len(warm_prompt)
        runner.run(warm_prompt, n // 2, [(n // 2, n - 1)] if n // 2 < n - 1 else [])
    rows, t0 = [], time.perf_counter()
    for prompt, o in zip(prompts, ours["rows"]):
        x = runner.run(prompt, o["resumed"], o["chunks"])
        rows.append({"conv": o["conv"], "turn": o["turn"], "prompt": o["prompt"], "resumed": o["resumed"],
                     "prefilled": o["prefilled"], "ttft_s": x["ttft_s"], "prep_s": x["prep_s"],
                     "ttft_ours_s": o["ttft_s"], "ratio": o["ttft_s"] / x["ttft_s"],
                     "same_first_token": x["token"] == o["first"]})
    wall = time.perf_counter() - t0
    mx.clear_cache()
    ttft = [r["ttft_s"] for r in rows]
    stats = ratio_stats([o["ttft_s"] for o in ours["rows"]], ttft)
    ours["ttft_over_limit"] = {k: v for k, v in stats.items() if k != "per_request"}
    return {"runner": "limit", "requests": len(rows), "prompt_tokens": ours["prompt_tokens"],
            "prefilled": sum(r["prefilled"] for r in rows), "ttft_sum_s": sum(ttft),
            "ttft_median_s": statistics.median(ttft), "ttft_max_s": max(ttft), "wall_s": wall,
            "prep_s": sum(r["prep_s"] for r in rows), "peak_bytes": None, "peak_above_weights": None,
            "held_bytes": 0, "same_first_token": sum(r["same_first_token"] for r in rows),
            "ttft_over_limit": ours["ttft_over_limit"], "rows": rows}
