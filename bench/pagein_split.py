"""Where ours' bookkeeping goes on `bench.scale`'s rows: a per-request split (docs/benchmarks.md, issue #51).

  python -m bench.pagein_split [--apart] [--stream-copies] [--runs-experiment] [--json FILE] -- BENCH.SCALE ARGS
      bench.scale's run with timers around the prefix cache's verbs (begin, close, prefilled, evaluated,
      chunk_at; and eviction, which runs inside begin, prefilled and close, and the restore inside begin:
      the copies out of the views it overwrites and the writes of the resumed rows), the engine's before_write
      (the copies of the views a write overwrites: built for the first chunk, taken over for later
      ones), the page-in's one evaluation (with the count and bytes of
      the arrays it evaluates, and how many of those bytes MLX's allocator took from its pool of freed
      buffers or newly from the system) and the copies made ahead with forwards' evaluations (count and
      bytes).
      A table a request of ours' last engine (bench.scale warms up on another), and the sums; --json
      writes every request's record. --apart: each write's copies of the views it overwrites get an
      evaluation of their own (Engine.copy_ahead off), as before copy_ahead: the A/B of that design.
      --stream-copies: the views copied with MLX's stream, as on a GPU, also where the rows would be
      copied on the host (the CPU device, impl/caches/host_rows.py): with bench.scale's --smoke --layers 24
      the GPU path's Python at llama 1.3B's layer count, on a CPU.
  python -m bench.pagein_split --copies
      The page-in's copy-out at llama 1.3B's geometry (24 layers, K and V [1, 4, 8192, 128] float32): the
      same rows as 48 arrays, the allocator's pool emptied first or not, and as one join per K and V.

--runs-experiment measures a design that is NOT built: adjacent lazy views of one layer copied out as
one run (one copy per layer and K/V), each view's arrays slices of it. The values restored are the same
(the smoke test compares first tokens); memory is not: an evicted slice's rows stay while a sibling holds
the run. The timers add a few microseconds a call; the figures are for splitting, not for the floor.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

import mlx.core as mx

VERBS = ("begin", "close", "prefilled", "evaluated", "chunk_at")     # chunk_at: every next_chunk, and the engine's look ahead
INNER = ("_evict", "_restore")  # timed inside the verbs above (begin, prefilled and close evict; begin restores): "of which"


@contextmanager
def split_timers(records: list, runs: bool = False):
    """While open, every Engine.generate appends one dict to `records` (seconds and counts)."""
    import impl.caches.evaluation as ev
    import impl.engine as engine
    from impl.caches.kv_views import LiveViews
    from impl.prefix_cache import PrefixCache

    orig_begin = PrefixCache.begin
    cur: dict = defaultdict(float)
    engines: dict = {}                              # id -> ordinal: bench.scale warms up on an engine of its own
    saved = [(PrefixCache, v, getattr(PrefixCache, v)) for v in VERBS + INNER] + [
        (engine, "before_write", engine.before_write), (engine.Engine, "generate", engine.Engine.generate),
        (ev.deferred_eval, "__exit__", ev.deferred_eval.__exit__),
        (LiveViews, "_materialise_views", LiveViews.__dict__["_materialise_views"]),
        (LiveViews, "copy_ahead", LiveViews.copy_ahead)]

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                cur[name] += time.perf_counter() - t0
        return wrapper

    def begin(self, *a, **k):
        cur["_page_in"] = 1                       # the next outermost block to end is the page-in's
        return orig_begin(self, *a, **k)

    def exit_(self, *exc, _orig=ev.deferred_eval.__exit__):
        if self.outer or cur.get("_page_in") != 1:
            return _orig(self, *exc)
        cur["_page_in"] = 2
        arrays = list(ev._pending or ())
        active, pool = mx.get_active_memory(), mx.get_cache_memory()
        t0 = time.perf_counter()
        try:
            return _orig(self, *exc)
        finally:
            cur["pagein_eval"] += time.perf_counter() - t0
            cur["pagein_arrays"] += len(arrays)
            cur["pagein_bytes"] += sum(x.nbytes for x in arrays)
            grown, pooled = mx.get_active_memory() - active, max(0, pool - mx.get_cache_memory())
            cur["pagein_pool_bytes"] += pooled                  # served from MLX's pool of freed buffers
            cur["pagein_fresh_bytes"] += max(0, grown - pooled)   # newly allocated (CUDA: cudaMallocManaged)

    def generate(self, *a, _orig=engine.Engine.generate, **k):
        cur.clear()
        r = _orig(self, *a, **k)
        records.append({"engine": engines.setdefault(id(self), len(engines)), "budget": self.pc.budget,
                        "resumed": r.stats.resumed, "new_tokens": r.stats.total - r.stats.resumed,
                        "evictions": r.stats.evictions,
                        "bookkeeping_s": r.bookkeeping_s, "forward_s": r.forward_s,
                        **{k: v for k, v in cur.items() if not k.startswith("_")}})
        return r

    def copy_ahead(self, n, _orig=LiveViews.copy_ahead):
        k = len(self._ahead)
        _orig(self, n)
        made = self._ahead[k:]                    # copies evaluated with the forward, not in a block of their own
        cur["ahead_arrays"] += 2 * len(made)
        cur["ahead_bytes"] += sum(a.nbytes for s in made for a in s._ahead)

    LiveViews.copy_ahead = copy_ahead
    for v in VERBS[1:] + INNER:
        setattr(PrefixCache, v, timed(v.lstrip("_"), getattr(PrefixCache, v)))
    PrefixCache.begin = timed("begin", begin)
    engine.before_write = timed("before_write", engine.before_write)
    engine.Engine.generate = generate
    ev.deferred_eval.__exit__ = exit_
    if runs:
        LiveViews._materialise_views = staticmethod(_materialise_runs)
    try:
        yield records
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def _materialise_runs(views) -> None:
    """The experiment: one copy per run of adjacent views of one buffer, each view a slice of it."""
    from impl.caches.evaluation import evaluate

    for s in [s for s in views if s._ahead is not None]:
        s._materialise(now=False)              # copied with the forward before (copy_ahead): taken over
    views, runs, out = sorted((s for s in views if s._cache is not None), key=lambda s: s.start), [], []
    for s in views:
        if runs and runs[-1][-1].end == s.start and \
                s._cache._readable(s.start, s.end)[0] is runs[-1][0]._cache._readable(runs[-1][0].start, runs[-1][0].end)[0]:
            runs[-1].append(s)
        else:
            runs.append([s])
    for run in runs:
        c, a, b = run[0]._cache, run[0].start, run[-1].end
        keys, values = c._readable(a, b)
        rk, rv = mx.contiguous(keys[:, :, a:b]), mx.contiguous(values[:, :, a:b])
        out += [rk, rv]
        for s in run:
            s.keys, s.values, s._geom = rk[:, :, s.start - a:s.end - a], rv[:, :, s.start - a:s.end - a], None
            c._views.discard(s)
            s._cache = None
            if s.on_materialise is not None:
                s.on_materialise(s.size)
    if out:
        evaluate(*out)


COLUMNS = ("resumed", "new_tokens", "bookkeeping_s", "pagein_eval", "pagein_arrays", "pagein_bytes",
           "pagein_pool_bytes", "pagein_fresh_bytes", "begin",
           "before_write", "ahead_arrays", "ahead_bytes", "prefilled", "close", "evaluated", "chunk_at", "evict",
           "restore", "forward_s")


def _cell(k: str, v: float) -> str:
    if k.endswith("_s") or k in VERBS + ("pagein_eval", "before_write", "evict", "restore"):
        return f"{v * 1e3:.2f} ms"
    return f"{v / 1e6:.1f} MB" if k.endswith("_bytes") else f"{int(v)}"


def table(records: list) -> str:
    total = {k: sum(r.get(k, 0) for r in records) for k in COLUMNS}
    rows = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    rows += ["| " + " | ".join(_cell(k, r.get(k, 0)) for k in COLUMNS) + " |" for r in records]
    rows.append("| **sum** | " + " | ".join(_cell(k, total[k]) for k in COLUMNS[1:]) + " |")
    return "\n".join(rows)


COPIES = ("restore", "before_write", "pagein_eval")   # the parts that move the resumed state's rows


def shares(records: list) -> str:
    """One line: the bookkeeping summed over the records, split into the copies that move the resumed
    state's rows (COPIES) and the rest (matching, captures, merges, eviction, page-out), in ms and as
    shares of the forwards (bench.bookkeeping --split's split, docs/benchmarks.md)."""
    book, fwd = sum(r["bookkeeping_s"] for r in records), sum(r["forward_s"] for r in records)
    moved = sum(r.get(k, 0.0) for r in records for k in COPIES)
    pct = (lambda x: f"{100 * x / fwd:.2f} %") if fwd else (lambda x: "-")
    return (f"bookkeeping {book * 1e3:.1f} ms ({pct(book)} of the forwards' {fwd * 1e3:.1f} ms) = copies "
            f"{moved * 1e3:.1f} ms ({pct(moved)}: restore, before_write, the page-in's evaluation) + the rest "
            f"{(book - moved) * 1e3:.1f} ms ({pct(book - moved)})")


def copies() -> None:
    bufs = [mx.random.normal((1, 4, 8192, 128)) for _ in range(48)]
    mx.eval(bufs)
    print(f"mlx {mx.__version__}, {mx.default_device()}: 24 layers' K and V [1, 4, 8192, 128] float32")
    for rows in (1024, 2048, 4096, 6144):
        t = {}
        for label in ("pool emptied", "pool warm", "pool warm again", "one join per K and V"):
            if label == "pool emptied":
                mx.clear_cache()
            mx.synchronize()
            t0 = time.perf_counter()
            out = [mx.contiguous(x[:, :, :rows]) for x in bufs] if label != "one join per K and V" else \
                [mx.concatenate([x[:, :, :rows] for x in bufs[i::2]], axis=2) for i in (0, 1)]
            mx.eval(out)
            t[label] = time.perf_counter() - t0
            nbytes = sum(x.nbytes for x in out)
            del out
        print(f"{rows} rows, {nbytes / 1e6:.0f} MB: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in t.items()), flush=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, scale_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, None)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs-experiment", action="store_true")
    ap.add_argument("--apart", action="store_true")
    ap.add_argument("--stream-copies", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--copies", action="store_true")
    a = ap.parse_args(own)
    if a.copies:
        copies()
        return 0
    if scale_args is None:
        ap.error("give bench.scale's arguments after --")
    from bench import scale
    from impl.caches import host_rows
    from impl.engine import Engine

    records: list = []
    default, host = Engine.copy_ahead, host_rows.ENABLED
    if a.apart:
        Engine.copy_ahead = False
    if a.stream_copies:
        host_rows.ENABLED = False
    try:
        with split_timers(records, runs=a.runs_experiment):
            rc = scale.main(scale_args)
    finally:
        Engine.copy_ahead, host_rows.ENABLED = default, host
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=1)
    mine = [r for r in records if r["engine"] == records[-1]["engine"]] if records else []
    print(table(mine) + "\n\n" + shares(mine) if mine else "no request of ours")
    return rc


if __name__ == "__main__":
    sys.exit(main())
