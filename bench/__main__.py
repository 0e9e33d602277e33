"""python -m bench — our prefix cache vs mlx-lm's LRUPromptCache vs no cache vs the ideal.

Workloads (bench/workloads.py) x models (SmolLM2-135M, pure attention; qwen3next, gated delta + attention)
x budgets (ample, tight), all caches in lockstep in one process (bench/suite.py). Prints the table and
writes the full report to reports/benchmarks.md (ignored by git; earlier runs kept below the new one),
reports/fifty_turns.md and a PNG chart. docs/benchmarks.md holds the curated tables, copied by hand.

Run: ./dev bench [--models smollm2,qwen3next] [--workloads chat,branching,agent,chat_long,...]
     [--scale full|quick] [--out reports/benchmarks.md] [--png reports/benchmarks.png] [--lazy-steps 20]
     [--fifty-turns 50]
The floors of issue #16 (bench/floors.py) are printed and recorded as a PASS/FAIL table.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import re
import shlex
import sys
import time
from pathlib import Path

from impl.platform import command as platform_command, reexec_with_openblas

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- analysis of this run: hand-written below, kept by later reruns in 'Earlier runs' -->"


def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,qwen3next")
    ap.add_argument("--workloads", default="chat,branching,agent,chat_long,branching_long,agent_long,fifty")
    ap.add_argument("--scale", default="full", choices=["full", "quick"])
    ap.add_argument("--out", default=str(ROOT / "reports" / "benchmarks.md"), help="markdown report ('' = none)")
    ap.add_argument("--png", default=str(ROOT / "reports" / "benchmarks.png"), help="chart ('' = none)")
    ap.add_argument("--json", default=str(ROOT / "reports" / "bench.json"), help="raw figures ('' = none)")
    ap.add_argument("--lazy-steps", type=int, default=16, help="decode steps for bench/lazy_views.py on SmolLM2 (qwen3next: 5x; 0 = skip)")
    ap.add_argument("--fifty-turns", type=int, default=50, help="turns of bench/fifty_turns.py's table (0 = skip)")
    ap.add_argument("--tight-fraction", type=float, default=0.5)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv=None) -> list:
    args = parse(argv if argv is not None else sys.argv[1:])
    import mlx.core as mx

    from bench import report, suite
    from bench.runners import geometry
    from impl.models import load

    started = dt.datetime.now().astimezone()
    t0 = time.perf_counter()
    info0 = report.machine()
    s = suite.Settings(chunk=args.chunk, tight_fraction=args.tight_fraction, seed=args.seed)
    models = [m for m in args.models.split(",") if m]
    names = [w for w in args.workloads.split(",") if w]
    rows, lazy, geoms = [], {}, {}
    if args.lazy_steps > 0:       # before any engine exists: lazy_views checks the process-wide snapshot count
        for m in models:
            lazy[m] = suite.lazy_view_ratio(m, args.lazy_steps)
    for m in models:
        print(f"== {m}", flush=True)
        lm = load(m)
        geoms[m] = g = geometry(lm)
        first = next((wl for wl in (suite.build_workload(w, lm, args.scale, args.seed) for w in names) if wl), None)
        if first is not None:     # warm-up, discarded: kernel compilation (MLX's GPU backends) is no cache's cost
            print(f"-- warm-up: {first.name} on {m}, discarded", flush=True)
            suite.run_case(lm, g, first, dataclasses.replace(s, iso=False), log=lambda _: None)
        for w in names:
            wl = suite.build_workload(w, lm, args.scale, args.seed)
            if wl is None:
                continue
            print(f"-- {w} on {m}: {len(wl)} requests ({wl.notes})", flush=True)
            case = suite.run_case(lm, g, wl, s, log=lambda x: print(x, flush=True))
            for r in case.values():
                r["lazy_ratio"] = lazy.get(m)
                r["notes"] = wl.notes
                rows.append(r)
        mx.clear_cache()
    fifty = None
    if args.fifty_turns > 0:
        from bench import fifty_turns
        print(f"== fifty-turn table ({args.fifty_turns} turns)", flush=True)
        fifty = fifty_turns.run("qwen3next", turns=args.fifty_turns, chunk=args.chunk)
    order = {w: i for i, w in enumerate(names)}
    rows.sort(key=lambda r: (order[r["workload"]], models.index(r["model"]), r["budget"] != "ample"))
    elapsed = time.perf_counter() - t0
    info1 = report.machine()
    print()
    print(report.text_table(rows))
    checks = []                                   # the floors below replace the old per-target lines
    from bench import floors
    floor_lines = floors.judge(rows, lazy, fifty)
    print()
    print(floors.table(floor_lines))
    print(f"\n{elapsed:.0f} s")

    command = (platform_command("bench")
               + ("" if not (argv or sys.argv[1:]) else " " + " ".join(map(shlex.quote, argv or sys.argv[1:]))))
    png_note = ""
    if args.png:
        png = Path(args.png)
        size = report.chart(rows, png)
        if size > 200_000 and "reports" not in png.parts:
            alt = ROOT / "reports" / png.name
            png.replace(alt)
            png, size = alt, alt.stat().st_size
        png_note = f"Chart: `{png.relative_to(ROOT) if png.is_relative_to(ROOT) else png}` ({size // 1024} KB)."
    if args.json:
        jp = Path(args.json)
        jp.parent.mkdir(parents=True, exist_ok=True)
        slim = None if fifty is None else {k: v for k, v in fifty.items() if k != "policies"}
        jp.write_text(json.dumps({"rows": rows, "lazy": lazy, "machine": info0, "seconds": elapsed,
                                  "floors": floor_lines, "fifty": slim}, indent=1, default=str))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        kept = _earlier(out.read_text()) if out.exists() else ""    # earlier runs stay, below this one
        out.write_text(markdown(rows, checks, lazy, geoms, args, command, started, elapsed, info0, info1, png_note,
                                floors.table(floor_lines))
                       + "\n" + MARKER + "\n" + ("\n" + kept if kept else ""))
        if fifty is not None:
            from bench import fifty_turns
            fp = Path(args.out).parent / "fifty_turns.md"
            md = fifty_turns.markdown(fifty, [], command + "  # (its fifty-turn part)", started, elapsed)
            fp.write_text(md + "\n" + (_earlier(fp.read_text()) if fp.exists() else ""))
            print(f"wrote {fp}")
        print(f"wrote {args.out}")
    return rows


EARLIER = "## Earlier runs (kept as recorded; figures of the code as it was then)"
_SEPARATOR = re.compile(r"^#{2,} Earlier runs \(kept as recorded|^### Run of ")


def _earlier(text: str) -> str:
    """The file's previous content (its run, then the runs it kept) as one flat "Earlier runs" section:
    each run under "### Run of <its date>", its own headings at level 4. (Files written before this kept
    each older run one heading level further down, past Markdown's six; they are read the same way.)"""
    lines = text.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    runs, cur = [], []
    for line in lines:
        if _SEPARATOR.match(line):
            runs.append(cur)
            cur = []
        else:
            cur.append(line)
    runs.append(cur)
    out = ["---", "", EARLIER]
    for run in runs:
        body = _as_level4(run)
        if body:
            date = next((ln[len("- Date: "):].split(";")[0] for ln in body if ln.startswith("- Date: ")), "an unknown date")
            out += ["", f"### Run of {date}", "", *body]
    return "\n".join(out) + "\n"


def _as_level4(lines: list) -> list:
    """One run's lines: its shallowest heading at level 4, the rest kept below it; the marker and the
    trailing rule dropped; code blocks untouched."""
    depth, fence = {}, False                       # line index -> heading depth, outside code blocks
    for k, ln in enumerate(lines):
        fence ^= ln.startswith("```")
        if not fence and re.match(r"^#+ ", ln):
            depth[k] = len(ln) - len(ln.lstrip("#"))
    shift = 4 - min(depth.values()) if depth else 0
    out = ["#" * min(6, depth[k] + shift) + ln[depth[k]:] if k in depth else ln
           for k, ln in enumerate(lines) if ln.strip() != MARKER]
    while out and out[-1].strip() in ("", "---"):
        out.pop()
    while out and not out[0].strip():
        out.pop(0)
    return out


def markdown(rows, checks, lazy, geoms, args, command, started, elapsed, info0, info1, png_note, floor_table="") -> str:
    from bench import report, suite

    sizes = {m: suite.sizes_for(args.scale, m) for m in geoms}
    lines = [
        "# Prefix-cache benchmarks: ours vs mlx-lm's server prompt cache vs no cache vs the ideal",
        "",
        "Generated by `python -m bench` (bench/__main__.py); do not edit by hand — rerun it.",
        "",
        "```",
        command,
        "```",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M %Z}; wall time {elapsed / 60:.1f} min.",
        f"- Machine: {info0['nproc']} cores, {info0['memory']} RAM, {info0['platform']}; MLX device {info0['device']}; "
        f"mlx {info0['mlx']}, mlx-lm {info0['mlx_lm']}, Python {info0['python']}; BLAS: {info0['blas']}.",
        f"- Load average (1/5/15 min) at start {info0['load']}, at end {info1['load']}: the machine was shared, so "
        "absolute times are noise; only paired ratios measured in this run are reported.",
        f"- Settings: prefill chunk {args.chunk} tokens for every cache; our capture interval {suite.Settings.interval}, "
        f"near-end capture {suite.Settings.near_end} tokens before a prompt's end; greedy decoding, no EOS stop; "
        f"tight budget = {args.tight_fraction} x what the workload stores beyond one live cache: (distinct "
        "evaluated tokens x raw KV bytes/token + 2 checkpoints per request) - (longest context x raw KV "
        "bytes/token + 1 checkpoint). Each model's first workload runs once, discarded, before the measured "
        "runs (a warm-up: the GPU backends compile kernels on first use).",
        "",
        "## Table",
        "",
        report.markdown_table(rows),
        "",
    ]
    if png_note:
        lines += [png_note, ""]
    if floor_table:
        lines += ["## Floors (issue #16; bench/floors.py)", "", floor_table, ""]
    lines += [
        "## How to read it",
        "",
        "- **prefilled**: prompt tokens each cache evaluated over the workload, counting the decode seed "
        "(so *none* = the sum of prompt lengths). *ideal* = tokens not covered by any previously evaluated "
        "prefix (earlier prompts plus their generated tokens except the last, which a decoder never "
        "evaluates), one token always left for decode. *(@capt)*, hybrids only: the ideal when a resume "
        "can only land where our policy takes whole-state checkpoints (interval, near-end, divergence "
        "point, end of each request), with no budget.",
        "- mlx-lm's generate loop also evaluates the last sampled token (one extra decode forward per "
        "request), so LRUPromptCache's stored key covers it and it can prefill one token fewer than "
        "*ideal* on the next turn; that is a shifted token, not saved work.",
        "- **TTFT ratios**: median over requests of the paired per-request ratio (runners take turns on "
        "the same request, order rotated per request). < 1 means ours is faster.",
        "- **peak MB**: weights + the largest (peak − active before + own state before) over the cache's "
        "requests, i.e. its own state and temporaries; other runners' state is excluded.",
        "- **LRU** = mlx-lm's `LRUPromptCache` driven exactly as `mlx_lm.server` drives it "
        "(bench/server_lru.py): its batched path, a checkpoint at the end of the system segment and one "
        "before the last prompt token, the finished request's cache as an \"assistant\" entry, "
        "`--prompt-cache-bytes` applied through `trim_to` with in-flight caches counted.",
        "- **held**: bytes the cache holds after the workload — ours: paged-out snapshots + live layer "
        "caches (lazy views of the live buffer count 0; a live buffer's growth slack at rest is at most 1/16 of its rows, kv.py `fit`); "
        "LRU: its entries (`LRUPromptCache.nbytes`, deep copies of whole caches). **B/token**: held / "
        "distinct tokens covered (ours: trie edge tokens; LRU: distinct prefixes of its entries' keys).",
        "- **max matched-resume**: over our requests (ample budget row: ours at ample; tight: ours at "
        "tight), the largest gap between the trie match and where the restore landed (`Stats`).",
        "- **budgets**: ours applies the budget to paged-out bytes (live caches unbudgeted, as the "
        "reference design says); LRU gets `max_bytes` = the same budget + one live cache at the "
        "workload's longest context, because mlx-lm counts in-flight caches against "
        "`--prompt-cache-bytes` and an LRU entry is the previous request's live cache.",
        "- **bookkeeping / forward**: sum of `Result.bookkeeping_s` / sum of `Result.forward_s` over our "
        "requests (ample budget row: ours at ample; tight row: ours at tight). Bookkeeping = time in the "
        "prefix cache's verbs + copying out the lazy snapshots a forward overwrites (`before_write`, timed "
        "apart from the model's forward; docs/caches.md).",
        "- **lazy views step ratio**: bench/lazy_views.py — a decode step with 50 outstanding lazy KV "
        "views per layer over one with none (median of alternating steps; `--lazy-steps` of them on "
        "SmolLM2, 5x as many on qwen3next, whose steps are ~1 ms).",
        "",
        "## Per row details",
        "",
        "| workload | model | budget | TTFT median s ours / LRU / none | tokens = ours: LRU, ours tight, none 1st | "
        "paged-out KB ours | held max KB ours / LRU | bookkeeping ms median | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["ttft_median_s"]
        lines.append(
            f"| {r['workload']} | {r['model']} | {r['budget']} | {t['ours']:.3f} / {t['lru']:.3f} / {t['none']:.3f} | "
            f"{r['agree_lru']}/{r['requests']}, {r['agree_ours_tight']}/{r['requests']}, "
            f"{r['agree_none_first']}/{r['requests']} | {r['paged_out_ours'] / 1024:.1f} | "
            f"{r['held_max_ours'] / 1024:.1f} / {r['held_max_lru'] / 1024:.1f} | {r['bk_ms_median']:.2f} | "
            f"{r['seconds']:.0f} |")
    lines += ["", "## Workloads", ""]
    for m, g in geoms.items():
        lines.append(f"- {m}: layers {g.kinds}; raw KV {g.kv_bytes_per_token} B/token, whole-state checkpoint "
                     f"{g.checkpoint_bytes} B; sizes {sizes[m]}")
    seen = set()
    for r in rows:
        if (r["workload"], r["model"]) not in seen:
            seen.add((r["workload"], r["model"]))
            lines.append(f"- {r['workload']} on {r['model']}: {r['requests']} requests, {r['prompt_tokens']} prompt "
                         f"tokens — {r['notes']}")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    reexec_with_openblas("bench", guard="BENCH_NO_REEXEC", one_thread=False)
    main()
