"""The bookkeeping floor's rows only, repeated: sum(Result.bookkeeping_s) / sum(Result.forward_s) per
(workload, model, budget), as `python -m bench` measures it (bench/suite.py run_case), the median of
`--repeat` runs after one warm-up run. `--split`: also where ours' bookkeeping went, per row, with
bench/pagein_split.py's timers (the prefix cache's verbs, eviction inside them, the copies before a
write, the page-in's evaluation), in ms a request over the repeated runs; `copies` sums the parts that
move the resumed state's rows (the restore inside `begin`, `before_write`, the page-in's evaluation),
`rest` is the bookkeeping less them (matching, captures, merges, eviction, page-out), and a second
table gives both as shares of the forward.

On the 2-core CPU this ratio moves by +-50 % between runs made hours apart, more than most changes do:
compare two versions of the code with this script, alternating runs of the two on one machine within
minutes (copy it into the older checkout; it imports `bench` and `impl` from the current directory).

Run: LD_PRELOAD=<OpenBLAS> .venv/bin/python -m bench.bookkeeping [--models qwen3next]
     [--workloads chat,branching,agent] [--repeat 3] [--split] [--scale full|quick]
"""
from __future__ import annotations

import argparse
import statistics
from contextlib import nullcontext

from bench.pagein_split import COPIES        # the parts that move the resumed state's rows

PARTS = ("begin", "before_write", "pagein_eval", "prefilled", "close", "evaluated", "chunk_at")   # the sum
OF_WHICH = ("evict", "restore")              # timed inside begin, prefilled, close; the restore inside begin


def measure(model: str, workloads: list, repeat: int, split: bool = False, scale: str = "full") -> list:
    """[(workload, model, budget, median %, runs %, split)]: split maps a part to its ms a request
    (None without `split`)."""
    from bench import pagein_split, suite
    from bench.runners import geometry
    from impl.models import load

    lm = load(model)
    geom = geometry(lm)
    settings = suite.Settings(iso=False)          # python -m bench's defaults; the iso-memory search reads no time
    rows = []
    for name in workloads:
        wl = suite.build_workload(name, lm, scale, settings.seed)
        if wl is None:
            continue
        suite.run_case(lm, geom, wl, settings, log=lambda _: None)          # warm-up
        runs: dict = {}
        records: list = []
        for _ in range(repeat):
            with pagein_split.split_timers(records) if split else nullcontext():
                out = suite.run_case(lm, geom, wl, settings, log=lambda _: None)
            for budget, r in out.items():
                runs.setdefault(budget, []).append(100 * r["bk_frac"])
        ample = suite.budgets_for(wl, geom, settings)["ample"]
        for budget, v in runs.items():
            mine = [r for r in records if (r["budget"] == ample) == (budget == "ample")]
            rows.append((name, model, budget, statistics.median(v), v, split_of(mine) if split else None))
    return rows


def split_of(records: list) -> dict:
    """ms a request for each part, the rest of the bookkeeping (`other`: what no timer covers, less the
    timers' own few microseconds, so it can dip below 0) and the forward, and evictions a request; {}
    for no records."""
    if not records:
        return {}
    per = {k: 1e3 * sum(r.get(k, 0.0) for r in records) / len(records) for k in PARTS + OF_WHICH}
    total = 1e3 * sum(r["bookkeeping_s"] for r in records) / len(records)
    copies = sum(per[k] for k in COPIES)
    return {**per, "other": total - sum(per[k] for k in PARTS), "bookkeeping": total,
            "copies": copies, "rest": total - copies,
            "forward": 1e3 * sum(r["forward_s"] for r in records) / len(records), "requests": len(records),
            "evictions": sum(r["evictions"] for r in records) / len(records)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen3next")
    ap.add_argument("--workloads", default="chat,branching,agent")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--split", action="store_true", help="also where the bookkeeping went (ms a request)")
    ap.add_argument("--scale", choices=("full", "quick"), default="full")
    a = ap.parse_args(argv)
    rows = [r for m in a.models.split(",") for r in measure(m, a.workloads.split(","), a.repeat, a.split, a.scale)]
    print("| workload | model | budget | bookkeeping / forward, median | runs |")
    print("|---|---|---|---|---|")
    for w, model, budget, med, runs, _ in rows:
        print(f"| {w} | {model} | {budget} | {med:.2f}% | {', '.join(f'{x:.2f}' for x in runs)} |")
    if a.split:
        cols = PARTS + ("other", "bookkeeping") + OF_WHICH + ("copies", "rest", "forward", "evictions")
        print("\nms a request (every run's requests; evictions a request):\n\n| workload | model | budget | requests | "
              + " | ".join(f"of which {c}" if c in OF_WHICH else c for c in cols) + " |")
        print("|---|---|---|---|" + "---|" * len(cols))
        for w, model, budget, _, _, sp in rows:
            print(f"| {w} | {model} | {budget} | {sp.get('requests', 0)} | "
                  + " | ".join(f"{sp.get(c, 0.0):.3f}" for c in cols) + " |")
        print("\nShares of the forward (every run's requests):\n\n| workload | model | budget | bookkeeping | copies | rest |")
        print("|---|---|---|---|---|---|")
        for w, model, budget, _, _, sp in rows:
            print(f"| {w} | {model} | {budget} | " + " | ".join(
                f"{100 * sp.get(c, 0.0) / sp['forward']:.2f}%" if sp.get("forward") else "-"
                for c in ("bookkeeping", "copies", "rest")) + " |")


if __name__ == "__main__":
    main()
