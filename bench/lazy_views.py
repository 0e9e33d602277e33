"""Decode-step cost of outstanding lazy KV views (SmolLM2-135M, float32, CPU).

Lazy views hold no array, only (cache, start, end), and the per-write overlap check is O(1) while
every view ends at or below the write position, so a decode step with 50 outstanding views per layer
must cost the same as one with none (ratio <= 1.05). Two cache sets with identical contents are
stepped alternately, in alternating order (so drift in machine load hits both), and the median step times are compared.

Run: ./dev python -m bench.lazy_views [--steps 40] [--views 50] [--prompt 256]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--views", type=int, default=50)
    ap.add_argument("--prompt", type=int, default=256)
    args = ap.parse_args(argv)

    from impl.caches import forward, live_snapshots, make_layer_caches
    from impl.models import load

    lm = load(args.model)
    model = lm.model
    prompt = mx.random.randint(0, lm.vocab_size, (args.prompt,), key=mx.random.key(0))

    plain = make_layer_caches(model)
    viewed = make_layer_caches(model)
    mx.eval(forward(model, prompt, plain))
    mx.eval(forward(model, prompt, viewed))

    # args.views views per layer, tiling [0, prompt) plus overlapping whole-prefix views
    views = []
    for c in viewed:
        if c is None or c.kind != "kv":
            continue
        for i in range(args.views):
            start = (i * args.prompt) // (args.views + 1)
            views.append(c.snapshot(start))
    assert all(v is not None and v.lazy for v in views)

    token = mx.array([1])
    t_plain, t_viewed = [], []
    for step in range(args.steps + 3):
        pair = [(plain, t_plain), (viewed, t_viewed)]
        for caches, sink in (pair if step % 2 else pair[::-1]):
            t0 = time.perf_counter()
            logits = forward(model, token, caches)
            mx.eval(logits)
            dt = time.perf_counter() - t0
            if step >= 3:  # warm-up
                sink.append(dt)
    still_lazy = sum(v.lazy for v in views)
    ratio = statistics.median(t_viewed) / statistics.median(t_plain)
    print(f"model={args.model} prompt={args.prompt} steps={args.steps} views/layer={args.views}")
    print(f"median decode step: 0 views {statistics.median(t_plain) * 1e3:.1f} ms, "
          f"{args.views} views {statistics.median(t_viewed) * 1e3:.1f} ms")
    print(f"views still lazy after decoding: {still_lazy}/{len(views)}")
    print(f"ratio {ratio:.3f}")
    for v in views:
        v.release()
    assert live_snapshots() == 0
    return ratio


if __name__ == "__main__":
    main()
