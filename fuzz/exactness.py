"""python -m fuzz.exactness [--report DIR] [--model M ...] [--dtype D ...]

Whether same-schedule replays are bit-identical here, per model (and so per layer kind), dtype and
device: the ground the exact C1 oracle stands on (fuzz/replay.py). For two prompt lengths and a
schedule of uneven chunks (one rewinding where every cache can trim), three runs of the same forwards:
mlx-lm's stock caches twice ("stock twice": the backend's kernels are deterministic for equal shapes)
and impl's caches once ("impl = stock": our caches compute exactly what mlx-lm's do). The rotating
window with `keep` is mlx-lm's --max-kv-size cache (RotatingKVCache(max_kv_size, keep=4)), run here on
SmolLM2 with max_kv_size 24. Writes DIR/exactness.md and .json; exit 1 when impl differs from stock
where stock itself is exact (a bug of ours, never the platform's).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from impl.platform import platform_line

from .replayer import Replayer, Source, Step

KINDS = {"smollm2": "KV", "smollm2+keep": "rotating window, keep=4 (--max-kv-size)",
         "gemma3": "KV + rotating window (keep=0)", "qwen3next": "KV + recurrent (gated delta)",
         "mamba2": "recurrent (SSD)", "mamba": "recurrent (selective scan)", "falcon_h1": "CacheList (KV + recurrent)",
         "deepseek_v32": "CacheList (KV + indexer KV)", "llama4": "chunked KV + KV"}


def _schedule(lm, n: int, rewind: bool):
    toks = np.random.default_rng(n).integers(1, lm.vocab_size, n).tolist()
    src = Source(tuple(toks), (), tuple(toks))
    cuts = sorted({0, 5, 17, n // 2, n - 1, n} | set(range(0, n - 1, 16)))
    steps = [Step(a, b, src) for a, b in zip(cuts, cuts[1:])]
    if rewind:                                   # forward past n//2 + 3, then back to n//2 and on
        steps.insert(cuts.index(n // 2), Step(n // 2 - 9, n // 2 + 3, src))
    return toks, steps


def _stock(lm, steps, max_kv_size):
    rp = Replayer(lm, max_kv_size)
    caches, off = rp.fresh(), 0
    for s in steps:
        out = rp.step(caches, off, s)
        off = s.b
    return np.array(out)


def _ours(lm, toks, steps, max_kv_size):
    from impl.caches.factory import forward, make_layer_caches
    caches = make_layer_caches(lm.model, max_kv_size)
    try:
        off = 0
        for s in steps:
            if s.a < off:
                for c in caches:
                    if c is not None and not c.restore(None, s.a):
                        return None
            got = forward(lm.model, list(toks[s.a:s.b]), caches)
            off = s.b
        return np.array(got[0, -1].astype(mx.float32))
    finally:
        for c in caches:
            if c is not None:
                c.free()


def measure(lm, label: str, max_kv_size=None) -> dict:
    from .calibrate import device_key
    from .replayer import NotReplayable

    t0, rows = time.perf_counter(), []
    for n, rewind in ((23, False), (61, False), (61, True)):
        toks, steps = _schedule(lm, n, rewind)
        try:
            a, b = _stock(lm, steps, max_kv_size), _stock(lm, steps, max_kv_size)
        except NotReplayable:
            continue                            # a cache that cannot rewind: no such schedule exists
        ours = _ours(lm, toks, steps, max_kv_size)
        rows.append({"n": n, "rewind": rewind, "stock_twice": float(np.abs(a - b).max()),
                     "impl_vs_stock": None if ours is None else float(np.abs(a - ours).max())})
    stock = all(r["stock_twice"] == 0 for r in rows)
    impl = all(r["impl_vs_stock"] in (0, None) for r in rows)
    return {"model": label, "kinds": KINDS.get(label, "?"), "dtype": getattr(lm, "dtype", "float32"),
            "device": device_key(), "stock_twice_exact": stock, "impl_equals_stock": impl,
            "rewinds": any(r["rewind"] for r in rows), "runs": rows, "seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
    from impl.models import DTYPES, MODEL_NAMES, DtypeUnsupported, load

    p = argparse.ArgumentParser(prog="python -m fuzz.exactness")
    p.add_argument("--report", type=Path, default=Path("reports"))
    p.add_argument("--model", action="append", choices=MODEL_NAMES + ("smollm2+keep",))
    p.add_argument("--dtype", action="append", choices=DTYPES)
    p.add_argument("--device", choices=("default", "cpu"), default="default",
                   help="cpu: MLX's CPU backend on a machine whose default device is a GPU")
    a = p.parse_args(argv)
    if a.device == "cpu":
        mx.set_default_device(mx.cpu)
    out = []
    for label in a.model or list(MODEL_NAMES) + ["smollm2+keep"]:
        for dtype in a.dtype or ["float32"]:
            name = label.split("+")[0]
            try:
                lm = load(name, dtype)
            except (KeyError, DtypeUnsupported) as e:
                print(f"{label} {dtype}: not run ({e})", flush=True)
                continue
            row = measure(lm, label, 24 if label.endswith("+keep") else None)
            out.append(row)
            print(f"{label:14s} {dtype:9s} {row['device']}: stock twice exact {row['stock_twice_exact']}, "
                  f"impl = stock {row['impl_equals_stock']} ({row['seconds']} s)", flush=True)
    a.report.mkdir(parents=True, exist_ok=True)
    platform = platform_line()
    (a.report / "exactness.json").write_text(json.dumps({"platform": platform, "rows": out}, indent=1))
    lines = [f"Platform: {platform}", "", "| model | layer kinds | dtype | device | stock twice | impl = stock |",
             "|---|---|---|---|---|---|"]
    for r in out:
        lines.append(f"| {r['model']} | {r['kinds']} | {r['dtype']} | {r['device']} | "
                     f"{'exact' if r['stock_twice_exact'] else 'NOT exact'} | {'exact' if r['impl_equals_stock'] else 'DIFFERS'} |")
    (a.report / "exactness.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {a.report}/exactness.md")
    return 1 if any(r["stock_twice_exact"] and not r["impl_equals_stock"] for r in out) else 0


if __name__ == "__main__":
    sys.exit(main())
