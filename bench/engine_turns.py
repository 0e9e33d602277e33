"""A 10-turn chat through the Engine, with and without the prefix cache, per turn.

With cache: one Engine for the whole chat. Without: a fresh Engine (empty trie, fresh caches) for every
request, the same prompt. The two runs are interleaved turn by turn (cached, then uncached) so that
drift in machine load hits both, and both get the conversation of the cached run (greedy decoding:
the answers are the same; the script checks it). Prints, per turn: prompt tokens, prefilled tokens
with / without the cache, time to first token with / without, and the share of the request spent in
the prefix cache's bookkeeping (Result.bookkeeping_s / Result.total_s); then the median TTFT ratio
cached / uncached and the bookkeeping share (median, max).

Run: ./dev python -m bench.engine_turns [--models smollm2,qwen3next] [--turns 10] [--max-tokens 16]
"""
from __future__ import annotations

import argparse
import statistics

QUESTIONS = [
    "What is the capital of France?",
    "And what is the capital of Germany?",
    "Which of the two cities is larger?",
    "Name one famous museum in Paris.",
    "What river flows through Berlin?",
    "Give me a short tip for visiting Paris in winter.",
    "How long is the train ride between the two cities?",
    "What food should I try in Berlin?",
    "Say hello in German.",
    "Thank you! Say goodbye in French.",
]


def run_model(name: str, turns: int, max_tokens: int) -> dict:
    from impl.engine import Engine
    from impl.models import load

    lm = load(name)
    tok = lm.tokenizer
    Engine(lm).generate([{"role": "user", "content": "Hi"}], max_tokens=2)      # warm-up, discarded
    cached = Engine(lm)
    messages, rows = [], []
    for t in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
        a = cached.generate(messages, max_tokens=max_tokens)
        b = Engine(lm).generate(messages, max_tokens=max_tokens)
        rows.append({"turn": t + 1, "prompt": a.prompt_tokens, "pre_c": a.stats.prefilled, "pre_u": b.stats.prefilled,
                     "ttft_c": a.ttft_s, "ttft_u": b.ttft_s, "book": a.bookkeeping_s / a.total_s,
                     "same": a.tokens == b.tokens})
        messages.append({"role": "assistant", "content": tok.decode(a.tokens, skip_special_tokens=True).strip()})
    return {"model": name, "rows": rows, "memory": cached.memory()}


def report(res: dict) -> str:
    rows = res["rows"]
    out = [f"\n{res['model']}: {len(rows)} turns",
           f"{'turn':>4} {'prompt':>6} {'prefilled cached':>16} {'uncached':>8} {'ttft cached':>11} "
           f"{'uncached':>8} {'ratio':>6} {'bookkeeping':>11} same"]
    for r in rows:
        out.append(f"{r['turn']:>4} {r['prompt']:>6} {r['pre_c']:>16} {r['pre_u']:>8} {r['ttft_c'] * 1e3:>9.0f}ms "
                   f"{r['ttft_u'] * 1e3:>6.0f}ms {r['ttft_c'] / r['ttft_u']:>6.2f} {r['book'] * 100:>10.3f}% "
                   f"{'yes' if r['same'] else 'NO'}")
    later = rows[1:] or rows
    ratio = statistics.median(r["ttft_c"] / r["ttft_u"] for r in later)
    shares = [r["book"] for r in rows]
    out.append(f"prefilled total: cached {sum(r['pre_c'] for r in rows)}, uncached {sum(r['pre_u'] for r in rows)}")
    out.append(f"median TTFT ratio cached/uncached (turns 2-{len(rows)}): {ratio:.3f}")
    out.append(f"bookkeeping share of request time: median {statistics.median(shares) * 100:.3f}%, "
               f"max {max(shares) * 100:.3f}%")
    out.append(f"answers identical with and without the cache: {all(r['same'] for r in rows)}")
    m = res["memory"]
    out.append(f"paged out after the chat: {m['paged_out']} B, live caches {m['live_caches']} B")
    return "\n".join(out)


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,qwen3next")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    results = []
    for name in args.models.split(","):
        res = run_model(name, args.turns, args.max_tokens)
        print(report(res), flush=True)
        results.append(res)
    return results


if __name__ == "__main__":
    main()
