"""Python's full collections against the trie's size: where their pauses land, by policy.

A full collection (generation 2) visits every object Python's cyclic collector tracks, about seven a
trie node here (one layer), so its pause grows with the trie; Python starts one when its allocation counts run out,
inside whatever request allocated last. ``bench.trie_scale`` measures the bookkeeping with collection
off and times one full collection apart; this benchmark runs the same workload (its
``Conversations``, ``Model`` and ``request``) with collection on, under three policies:

  python  Python's own thresholds (a library's default, and the runner's before serve/collector.py);
  idle    the runner's ``IdleCollector`` with a gap after every request: ``idle()`` there, untimed
          (a server that is not saturated);
  busy    the same collector with no gap: ``after_call()`` between requests (a saturated server: passes
          only past the backstop, between two requests).

Per size and policy: request latency (median, p99, p99.9, max, in ms) and the full collections that
ran inside requests against those that ran between them (count, the longest in ms).

Run: ./dev python -m bench.gc_pauses [--sizes 1000,10000] [--requests 20000] [--json reports/gc_pauses.json]
"""
from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

from bench.trie_scale import WARM_UP, Conversations, Model, head, nodes, parse_sizes, request, save

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("python", "idle", "busy")


def measure(size: int, requests: int, policy: str, seed: int = 0, backstop: int = 100) -> dict:
    from impl.prefix_cache import PrefixCache
    from serve.collector import IdleCollector

    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r} is not one of {POLICIES}")
    model, conv = Model(), Conversations(seed)
    pc = PrefixCache([model.cache], interval=0, near_end=0)

    def one() -> float:
        slot, prompt, answer = conv.next()
        t0 = time.perf_counter()
        request(pc, model, prompt, answer)
        dt = time.perf_counter() - t0
        conv.answered(slot, prompt, answer)
        return dt

    while (n := nodes(pc)) < size:
        for _ in range(max(1, (size - n) // 3)):
            one()
    pc.set_budget(pc.counter)
    for _ in range(WARM_UP):
        one()
    collector = IdleCollector(backstop=backstop)
    inside, passes = [False], {True: [], False: []}     # full passes inside requests / between them (s)

    def note(phase, info):
        if info["generation"] != 2:
            return
        if phase == "start":
            note.t0 = time.perf_counter()
        else:
            passes[inside[0]].append(time.perf_counter() - note.t0)

    gc.collect()
    if policy != "python":
        collector.install()
    gc.callbacks.append(note)
    lat = []
    try:
        for _ in range(requests):
            inside[0] = True
            lat.append(one())
            inside[0] = False
            if policy == "idle":
                collector.idle()
            elif policy == "busy":
                collector.after_call()
    finally:
        gc.callbacks.remove(note)
        collector.uninstall()
    lat.sort()

    def q(p: float) -> float:
        return 1e3 * lat[min(len(lat) - 1, int(p * len(lat)))]

    return {"size": size, "nodes": nodes(pc), "policy": policy, "requests": requests,
            "median_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999), "max_ms": 1e3 * lat[-1],
            "passes_inside": len(passes[True]), "longest_inside_ms": 1e3 * max(passes[True], default=0),
            "passes_between": len(passes[False]), "longest_between_ms": 1e3 * max(passes[False], default=0)}


def table(rows: list) -> str:
    out = ["| nodes | policy | requests | median ms | p99 | p99.9 | max | full passes inside requests: count, "
           "longest ms | between requests: count, longest ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['nodes']:,} | {r['policy']} | {r['requests']:,} | {r['median_ms']:.2f} | {r['p99_ms']:.2f} | "
                   f"{r['p999_ms']:.2f} | {r['max_ms']:.1f} | {r['passes_inside']}, {r['longest_inside_ms']:.0f} | "
                   f"{r['passes_between']}, {r['longest_between_ms']:.0f} |")
    return "\n".join(out)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench.gc_pauses", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000", help="node counts, ascending")
    ap.add_argument("--requests", type=int, default=20000, help="requests measured per size and policy")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=str(ROOT / "reports" / "gc_pauses.json"), help="'' = none")
    a = ap.parse_args(argv)
    sizes, policies = parse_sizes(ap, a.sizes), a.policies.split(",")
    if a.requests < 1:
        ap.error(f"--requests must be at least 1, got {a.requests}")
    if not policies or any(p not in POLICIES for p in policies):
        ap.error(f"--policies must name some of {', '.join(POLICIES)}, got {a.policies!r}")
    t0 = time.monotonic()
    rows = [measure(s, a.requests, p, a.seed) for s in sizes for p in policies]
    result = {"seed": a.seed, "commit": head(), "seconds": time.monotonic() - t0, "rows": rows}
    print(table(rows))
    print(f"{result['seconds']:.0f} s, commit {result['commit']}")
    save(a.json, result)
    return result


if __name__ == "__main__":
    main()
