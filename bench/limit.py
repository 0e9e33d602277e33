"""The limit runner of ``python -m bench.scale``: ours' TTFT against the forward of exactly the tokens
ours prefilled, on a stock mlx-lm cache that already holds the prefix ours resumed from.

For every request ours served (same prompt, in the same order, in the same process and device):
  untimed  ``mlx_lm.models.cache.make_prompt_cache(model)``, then the prompt's first ``resumed`` tokens
           (``Stats.resumed``: where ours' restore landed) in forwards of ``chunk`` tokens, each followed
           by ``mx.eval`` of every layer's state; then every plain ``KVCache`` given room for the whole
           prompt (ours reserves a request's rows before it starts; a stock cache would otherwise copy
           its rows into a larger buffer in the timed part, 256 rows at a time);
  timed    the forwards ours ran, at the same offsets (``Stats.chunks``: the prefill's [p, q), evaluated
           as ours does, caches only, no vocabulary projection), then the decode seed (the prompt's last
           token) with its logits and the caches evaluated, then greedy sampling of the first token
           (``argmax(...).item()``).
Ours' TTFT (``Result.ttft_s``) runs from the call of ``Engine.generate`` to the first sampled token:
input checks, ``begin`` (trie match, page-in of the resumed state), the same prefill forwards and seed,
the same sampling, and every bookkeeping step between them (captures, lazy-view copies). So TTFT ours /
limit = 1 means the cache costs nothing beyond the physical forward of the uncovered tokens.

The limit is not stock mlx-lm's TTFT: no prompt cache lookup, no buffer growth, no Python between the
forwards beyond the loop itself; only the model's work on the uncovered tokens.
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
        self.shapes = None

    def prepare(self, prompt, resumed: int):
        """Untimed: a stock cache holding the prompt's first ``resumed`` tokens, evaluated, with room for
        the request's rows (below)."""
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(self.model)
        for p in range(0, resumed, self.chunk):
            self.model(mx.array([prompt[p:min(p + self.chunk, resumed)]]), cache=cache)
            mx.eval(_states(cache))
        self.reserve(cache, len(prompt))
        return cache

    def reserve(self, cache, rows: int) -> None:
        """Every plain ``KVCache`` given a buffer of at least ``rows`` rows (its 256-row steps), the
        prefix copied in: the timed forwards then write in place, as ours' reserved buffers do, instead of
        growing the buffer by concatenation (a copy of every row held, once per chunk)."""
        from mlx_lm.models.cache import KVCache

        for i, c in enumerate(cache):
            if type(c) is not KVCache or (c.keys is not None and c.keys.shape[2] >= rows):
                continue
            k, v = self._shapes()[i]
            cap = -(-rows // c.step) * c.step
            keys = mx.zeros((1, k.shape[1], cap, k.shape[3]), k.dtype)
            values = mx.zeros((1, v.shape[1], cap, v.shape[3]), v.dtype)
            if c.offset:
                keys[..., :c.offset, :] = c.keys[..., :c.offset, :]
                values[..., :c.offset, :] = c.values[..., :c.offset, :]
            c.keys, c.values = keys, values
        mx.eval(_states(cache))

    def _shapes(self) -> list:
        """Per layer, the K and V of a one-token forward on a throw-away stock cache (heads, dims, dtype)."""
        if self.shapes is None:
            from mlx_lm.models.cache import make_prompt_cache

            probe = make_prompt_cache(self.model)
            self.model(mx.array([[1]]), cache=probe)
            self.shapes = [(getattr(c, "keys", None), getattr(c, "values", None)) for c in probe]
            mx.eval([x for kv in self.shapes for x in kv if x is not None])
        return self.shapes

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


GAP_PARTS = ("total", "forward", "bookkeeping", "other")


def gap_parts(ours_row: dict, limit_s: float) -> dict:
    """Where ours' TTFT exceeds the limit's (``gap_total_s``): its forwards up to the first token against
    the limit's forwards (``gap_forward_s``), its bookkeeping up to the first token, and the rest of its
    TTFT (``gap_other_s``: input checks, the buffers' reservation, sampling, the engine's steps between
    forwards). The parts add up to the total by construction; each is the row's own measurement."""
    fwd, bk = ours_row["ttft_forward_s"], ours_row["ttft_bookkeeping_s"]
    return {"gap_total_s": ours_row["ttft_s"] - limit_s, "gap_forward_s": fwd - limit_s,
            "gap_bookkeeping_s": bk, "gap_other_s": ours_row["ttft_s"] - fwd - bk}


def measure(lm, ours: dict, prompts: list, *, chunk: int, warm_prompt=None, between=None) -> dict:
    """The limit of every request in ``ours`` (bench.scale's measure() result for the ours runner, whose
    rows carry ``resumed``, ``chunks`` and ``first``); ``prompts``: the prompts ours served, in order;
    ``between()`` runs after each request, as bench.scale's serve() does for ours.
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
        if between is not None:
            between()
        rows.append({"conv": o["conv"], "turn": o["turn"], "prompt": o["prompt"], "resumed": o["resumed"],
                     "prefilled": o["prefilled"], "ttft_s": x["ttft_s"], "prep_s": x["prep_s"],
                     "ttft_ours_s": o["ttft_s"], "ratio": o["ttft_s"] / x["ttft_s"],
                     "same_first_token": x["token"] == o["first"], **gap_parts(o, x["ttft_s"])})
    wall = time.perf_counter() - t0
    mx.clear_cache()
    ttft = [r["ttft_s"] for r in rows]
    stats = ratio_stats([o["ttft_s"] for o in ours["rows"]], ttft)
    ours["ttft_over_limit"] = {k: v for k, v in stats.items() if k != "per_request"}
    ours["ttft_over_limit"]["gap_s"] = {k: sum(r[f"gap_{k}_s"] for r in rows) for k in GAP_PARTS}
    return {"runner": "limit", "requests": len(rows), "prompt_tokens": ours["prompt_tokens"],
            "prefilled": sum(r["prefilled"] for r in rows), "ttft_sum_s": sum(ttft),
            "ttft_median_s": statistics.median(ttft), "ttft_max_s": max(ttft), "wall_s": wall,
            "prep_s": sum(r["prep_s"] for r in rows), "peak_bytes": None, "peak_above_weights": None,
            "held_bytes": 0, "same_first_token": sum(r["same_first_token"] for r in rows),
            "ttft_over_limit": ours["ttft_over_limit"], "rows": rows}
