"""The prefix cache's bookkeeping per request against the trie's node count (issue 51's scaling table).

Many conversations on a few shared system prompts: each request is an open conversation's next turn
(its history plus a new user message, then a short answer), and a conversation ends after a few turns,
so that the trie fills with finished conversations (`Conversations`). The trie grows with the budget
unbounded to each size in `--sizes`; there the budget is set to the bytes the trie holds, so that every further request evicts (E1-E4) about what it stores, and, after
WARM_UP requests, `--requests` requests are measured at that size. (The first eviction after the
growth reads the nodes changed since the last one that the order has not read yet, at most
impl.eviction's BACKLOG of them: the table's "first request" column.) The figure is the prefix cache's bookkeeping per request: the
process CPU time of a request less that of its forwards (begin, next_chunk, evaluated, attach and
close, page-in and page-out included), and, beside it, `PrefixCache.bookkeeping_s` (wall time, which
on a shared machine also counts the time the process waited for a core). The mean is the figure: the
median request evicts nothing (evictions come in bursts), so the median hides a walk's cost. Python's
automatic garbage collection is off while requests are measured, as a runner keeps full collections
out of requests (serve/collector.py), and one full collection is timed after them at each size (its
pause grows with the heap, whatever the trie's algorithms; bench.gc_pauses runs them on).

The model is one full-attention layer (impl's KVCache) with 1 head of 4 float16 values per row, and
the "forward" writes zeros: snapshots are real and tiny, so the trie's own bookkeeping dominates.
`--walk` chooses each victim by the O(n) walk over the trie (impl.invariants.walked_victim, the
definition the incremental order is checked against) instead of the order: the before figure.
Floor (issue 51): bookkeeping per request at 10^5 nodes <= 2x that at 10^2 (CPU time, the means).

Run: ./dev python -m bench.trie_scale [--sizes 100,1000,10000,100000] [--requests 400] [--walk]
     [--seed 0] [--json reports/trie_scale.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PROMPTS, SYSTEM_LEN, USER_LEN, HEADER_LEN, ANSWER_LEN, TURNS, LIVE = 4, 24, 6, 2, 4, 4, 8
WARM_UP = 20                     # requests under the budget before the measured ones
FLOOR = 2.0


class Conversations:
    """The workload, deterministic for a seed and the same at every size: LIVE open conversations, each
    request the next turn of one drawn at random; a conversation of TURNS turns is replaced by a new one
    on a random system prompt. The open conversations stay cached (recently used); the rest of the trie
    is finished conversations, which eviction takes, least recently used first. Keys are token ids
    below 2^20."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.systems = [self._tokens(SYSTEM_LEN) for _ in range(SYSTEM_PROMPTS)]
        self.live = [self._new() for _ in range(LIVE)]     # (history so far, turns so far) per conversation

    def _tokens(self, n: int) -> tuple:
        return tuple(self.rng.randrange(1, 1 << 20) for _ in range(n))

    def _new(self) -> tuple:
        return self.rng.choice(self.systems), 0

    def next(self) -> tuple:
        """(slot, prompt, answer): slot is where the conversation's history goes after the answer."""
        slot = self.rng.randrange(len(self.live))
        prompt = self.live[slot][0] + self._tokens(USER_LEN)
        return slot, prompt, self._tokens(ANSWER_LEN)

    def answered(self, slot: int, prompt: tuple, answer: tuple) -> None:
        turns = self.live[slot][1] + 1
        self.live[slot] = self._new() if turns == TURNS else (prompt + answer, turns)


class Model:
    """One KV layer of impl's real cache; a forward writes n zero rows."""

    def __init__(self):
        import mlx.core as mx
        from impl.caches.kv import KVCache
        self.mx, self.cache = mx, KVCache(layer=0)
        self.rows = {}
        self.cpu_s = 0.0             # process CPU time spent in forwards

    def forward(self, n: int) -> None:
        t0 = time.process_time()
        rows = self.rows.get(n)
        if rows is None:
            rows = self.rows[n] = self.mx.zeros((1, 1, n, 4), dtype=self.mx.float16)
        k, v = self.cache.update_and_fetch(rows, rows)
        self.cache.finish_forward(n)
        self.mx.eval(k, v)
        self.cpu_s += time.process_time() - t0


def request(pc, model: Model, prompt: tuple, answer: tuple, chunk: int = 64) -> None:
    """One request as the engine makes it: begin, prefill in chunks, decode the answer, close. The
    answer's steps are one forward, reported in one call (the prefix cache's figure is the same: it
    reads them only at close)."""
    n = len(prompt)
    pc.begin(prompt, (), (n - USER_LEN, n - HEADER_LEN))  # message boundaries: the user's, the answer's header
    while (cut := pc.next_chunk(chunk)) is not None:
        p, q = cut
        model.forward(q - p)
        pc.evaluated(prompt[p:q])
    pc.prefilled()
    model.forward(len(answer))
    pc.evaluated(prompt[-1:] + answer[:-1])
    pc.close()


def nodes(pc) -> int:
    from impl.trie import walk
    return sum(1 for _ in walk(pc.root))


def measure(sizes: list, requests: int, walk: bool, seed: int, check: bool = False) -> list:
    """One row per size: the trie grown to it, then `requests` requests measured under a budget
    equal to the bytes held there."""
    from impl import invariants
    from impl.prefix_cache import PrefixCache

    model, conv = Model(), Conversations(seed)
    pc = PrefixCache([model.cache], interval=0, near_end=0, check=check)
    if walk:
        pc._victim = lambda: invariants.walked_victim(pc)
    rows, done = [], 0
    for size in sizes:
        pc.set_budget(1 << 62)
        while (n := nodes(pc)) < size:
            for _ in range(max(1, (size - n) // 3)):
                slot, prompt, answer = conv.next()
                request(pc, model, prompt, answer)
                conv.answered(slot, prompt, answer)
                done += 1
        pc.set_budget(pc.counter)
        for k in range(WARM_UP):     # the first eviction reads the order's backlog (at most Eviction.BACKLOG)
            slot, prompt, answer = conv.next()
            f0, c0 = model.cpu_s, time.process_time()
            request(pc, model, prompt, answer)
            if k == 0:
                first_ms = 1e3 * (time.process_time() - c0 - (model.cpu_s - f0))
            conv.answered(slot, prompt, answer)
        done += WARM_UP
        wall, cpu, counts, evictions0 = [], [], [], pc.evictions
        gc.collect()
        gc.disable()                 # a full collection's pause is measured on its own, below
        for k in range(requests):
            slot, prompt, answer = conv.next()
            b0, f0, c0 = pc.bookkeeping_s, model.cpu_s, time.process_time()
            request(pc, model, prompt, answer)
            cpu.append(time.process_time() - c0 - (model.cpu_s - f0))
            wall.append(pc.bookkeeping_s - b0)
            conv.answered(slot, prompt, answer)
            if k % max(1, requests // 4) == 0:
                counts.append(nodes(pc))
        counts.append(nodes(pc))
        gc.enable()
        t0 = time.process_time()
        gc.collect()
        full_gc_ms = 1e3 * (time.process_time() - t0)
        done += requests
        rows.append({"size": size, "nodes_min": min(counts), "nodes_max": max(counts),
                     "requests": requests, "evictions_per_request": (pc.evictions - evictions0) / requests,
                     "budget_bytes": pc.budget, "requests_before": done - requests, "full_gc_ms": full_gc_ms,
                     "first_request_ms": first_ms,
                     **figures("cpu", cpu), **figures("wall", wall)})
    return rows


def figures(name: str, seconds: list) -> dict:
    us = sorted(1e6 * s for s in seconds)
    return {f"{name}_us_median": statistics.median(us), f"{name}_us_mean": statistics.fmean(us),
            f"{name}_us_p90": us[int(0.9 * (len(us) - 1))]}


def table(rows: list) -> str:
    out = ["| nodes (target) | nodes during | evictions / request | CPU µs / request: mean | vs the first row |"
           " median | p90 | wall µs / request: mean | median | first request, ms | a full GC, ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['size']:,} | {r['nodes_min']:,}-{r['nodes_max']:,} | {r['evictions_per_request']:.2f} | "
                   f"{r['cpu_us_mean']:.0f} | {r['cpu_us_mean'] / rows[0]['cpu_us_mean']:.2f}x | "
                   f"{r['cpu_us_median']:.0f} | {r['cpu_us_p90']:.0f} | "
                   f"{r['wall_us_mean']:.0f} | {r['wall_us_median']:.0f} | {r['first_request_ms']:.1f} | "
                   f"{r['full_gc_ms']:.0f} |")
    return "\n".join(out)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench.trie_scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100,1000,10000,100000", help="node counts, ascending")
    ap.add_argument("--requests", type=int, default=400, help="requests measured at each size")
    ap.add_argument("--walk", action="store_true", help="victims by the O(n) walk (the before figure)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=str(ROOT / "reports" / "trie_scale.json"), help="'' = none")
    a = ap.parse_args(argv)
    sizes = parse_sizes(ap, a.sizes)
    if a.requests < 1:
        ap.error(f"--requests must be at least 1, got {a.requests}")
    t0 = time.monotonic()
    rows = measure(sizes, a.requests, a.walk, a.seed)
    ratio = rows[-1]["cpu_us_mean"] / rows[0]["cpu_us_mean"]
    commit = head()
    result = {"victims": "walk" if a.walk else "order", "seed": a.seed, "commit": commit,
              "seconds": time.monotonic() - t0, "rows": rows, "ratio_last_to_first": ratio,
              "floor": FLOOR, "floor_met": ratio <= FLOOR}
    print(table(rows))
    print(f"victims by {result['victims']}; last / first (CPU mean): {ratio:.2f}x, floor {FLOOR}x: "
          f"{'met' if result['floor_met'] else 'NOT met'}; {result['seconds']:.0f} s, commit {commit}")
    save(a.json, result)
    return result


def parse_sizes(ap, text: str) -> list:
    """--sizes: positive node counts, ascending (an argparse error naming the flag otherwise)."""
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or sizes != sorted(sizes) or sizes[0] < 1:
        ap.error(f"--sizes must be positive node counts in ascending order, got {text!r}")
    return sizes


def head() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def save(path: str, result: dict) -> None:
    """The run's figures as JSON at path ('' = none)."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
