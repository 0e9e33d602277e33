"""The bookkeeping floor's rows only, repeated: sum(Result.bookkeeping_s) / sum(Result.forward_s) per
(workload, model, budget), as `python -m bench` measures it (bench/suite.py run_case), the median of
`--repeat` runs after one warm-up run.

On the 2-core CPU this ratio moves by +-50 % between runs made hours apart, more than most changes do:
compare two versions of the code with this script, alternating runs of the two on one machine within
minutes (copy it into the older checkout; it imports `bench` and `impl` from the current directory).

Run: LD_PRELOAD=<OpenBLAS> .venv/bin/python -m bench.bookkeeping [--models qwen3next]
     [--workloads chat,branching,agent] [--repeat 3]
"""
from __future__ import annotations

import argparse
import statistics


def measure(model: str, workloads: list, repeat: int) -> list:
    from bench import suite
    from bench.runners import geometry
    from impl.models import load

    lm = load(model)
    geom = geometry(lm)
    settings = suite.Settings()                                            # python -m bench's defaults
    rows = []
    for name in workloads:
        wl = suite.build_workload(name, lm, "full", settings.seed)
        if wl is None:
            continue
        suite.run_case(lm, geom, wl, settings, log=lambda _: None)          # warm-up
        runs: dict = {}
        for _ in range(repeat):
            for budget, r in suite.run_case(lm, geom, wl, settings, log=lambda _: None).items():
                runs.setdefault(budget, []).append(100 * r["bk_frac"])
        rows += [(name, model, budget, statistics.median(v), v) for budget, v in runs.items()]
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen3next")
    ap.add_argument("--workloads", default="chat,branching,agent")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    print("| workload | model | budget | bookkeeping / forward, median | runs |")
    print("|---|---|---|---|---|")
    for m in a.models.split(","):
        for w, model, budget, med, runs in measure(m, a.workloads.split(","), a.repeat):
            print(f"| {w} | {model} | {budget} | {med:.2f}% | {', '.join(f'{x:.2f}' for x in runs)} |", flush=True)


if __name__ == "__main__":
    main()
