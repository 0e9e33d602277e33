"""Run workloads x models x budgets through every cache in lockstep and compute the figures.

Lockstep: for each request, every runner (ours at both budgets, LRU at both budgets, no cache) serves
the same prompt before the next request is built, in an order rotated per request, so machine-load
drift hits all of them alike and per-request time ratios are paired. The prompt of a later request
contains the tokens our ample-budget run generated (the reference); the other runners' outputs are
compared with it (``agree_*``), which doubles as a correctness check (greedy, float32).

"No cache" only needs its first token for TTFT, so it decodes ``none_tokens`` tokens (default 1).

Budgets: "ample" is unlimited. "tight" = ``tight_fraction`` x what the workload would store beyond one
live cache: (distinct tokens the workload evaluates x raw KV bytes per token + 2 whole-state
checkpoints per request) - (its longest context x raw KV bytes per token + 1 checkpoint), computed from
the workload before it runs (responses as placeholders of the right length). Ours applies it to paged-out bytes (its live
caches are not budgeted, as in the reference design); mlx-lm's server budget (``--prompt-cache-bytes``)
counts in-flight caches against the total, and an LRU entry *is* the last request's cache, so LRU gets
``max_bytes = tight + one live cache at the workload's longest context`` (exact rows: the server's
extracted caches hold no growth slack, our fitted live buffers at most 1/16 of their rows).

Iso-memory (tight rows, ``Settings.iso``): ours' budget searched until its bytes held equal mlx-lm's
at its tight budget, each trial a real run of the same requests (bench/iso_memory.py); the row's
``iso_*`` fields hold the witness run.

Peak MLX active memory per runner: around each request, ``peak - active_before + held_before`` (the
runner's own state and temporaries, excluding what other runners hold) plus the weights; the maximum
over requests.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field

import mlx.core as mx

from bench import iso_memory, workloads as W
from bench.runners import Ideal, NoCache, Ours, distinct_tokens, geometry
from bench.server_lru import ServerLRU

# Workload sizes per model (the hybrid is ~100x cheaper per token than SmolLM2 on this CPU).
SIZES = {
    "full": {
        # SmolLM2 is sized for a shared, loaded 2-core machine (prefill ~40 ms/token, decode ~0.5 s/step
        # there): every request runs through five caches, so answers are short and the agent context
        # stops at ~800 tokens.
        "smollm2": {
            "chat": dict(convs=3, turns=2, answer=4),
            "branching": dict(rounds=1, answer=4, system_tokens=160),
            "agent": dict(start_tokens=500, context_tokens=800, answer=4, tool_tokens=(60, 100)),
        },
        "hybrid": {
            "chat": dict(convs=4, turns=4, answer=16),
            "branching": dict(rounds=2, answer=16),
            "agent": dict(start_tokens=1200, context_tokens=2600, answer=16, tool_tokens=(60, 140)),
            # 2k-8k-token contexts (the hybrid only: SmolLM2 would take hours here through five caches)
            "chat_long": dict(convs=3, turns=4, answer=16, system_tokens=1500, doc_tokens=1400),
            "branching_long": dict(rounds=2, answer=16, system_tokens=1500, doc_tokens=1100),
            "agent_long": dict(start_tokens=2000, context_tokens=8000, answer=16, tool_tokens=(300, 600)),
            "fifty": dict(convs=1, turns=50, answer=24, question=(6, 10)),
        },
    },
    "quick": {
        "smollm2": {
            "chat": dict(convs=2, turns=2, answer=4, system_tokens=60),
            "branching": dict(rounds=1, answer=4, system_tokens=60),
            "agent": dict(start_tokens=200, context_tokens=360, answer=4, tool_tokens=(30, 50), system_tokens=60),
        },
        "hybrid": {
            "chat": dict(convs=2, turns=3, answer=8, system_tokens=120),
            "branching": dict(rounds=1, answer=8, system_tokens=120),
            "agent": dict(start_tokens=300, context_tokens=700, answer=8, tool_tokens=(40, 80), system_tokens=120),
            "chat_long": dict(convs=2, turns=3, answer=8, system_tokens=600, doc_tokens=500),
            "branching_long": dict(rounds=1, answer=8, system_tokens=600, doc_tokens=400),
            "agent_long": dict(start_tokens=800, context_tokens=2400, answer=8, tool_tokens=(200, 300)),
            "fifty": dict(convs=1, turns=12, answer=8, question=(6, 10)),
        },
    },
}


@dataclass
class Settings:
    chunk: int = 512
    interval: int = 256
    near_end: int = 4
    tight_fraction: float = 0.5
    none_tokens: int = 1
    seed: int = 0
    check_rules: bool = False
    iso: bool = True            # tight rows: the iso-memory search (bench/iso_memory.py)


@dataclass
class Track:
    prefilled: list = field(default_factory=list)
    ttft: list = field(default_factory=list)
    total: list = field(default_factory=list)
    forward: list = field(default_factory=list)
    bookkeeping: list = field(default_factory=list)
    evictions: int = 0
    peak_own: int = 0
    held_max: int = 0
    tokens: list = field(default_factory=list)
    gap: list = field(default_factory=list)       # ours: matched - resumed per request


def sizes_for(scale: str, model: str) -> dict:
    return SIZES[scale]["smollm2" if model == "smollm2" else "hybrid"]


def build_workload(name: str, lm, scale: str, seed: int = 0) -> W.Workload | None:
    """None when the workload has no size for this model (the long ones run on the hybrid only)."""
    sizes = sizes_for(scale, lm.name)
    return W.build(name, lm.tokenizer, seed=seed, **sizes[name]) if name in sizes else None


def budgets_for(wl: W.Workload, geom, s: Settings) -> dict:
    placeholders = {i: [-(i + 1) * 100_000 - k for k in range(r.max_tokens)] for i, r in enumerate(wl.requests)}
    seqs = [wl.prompt(i, placeholders) + placeholders[i][:-1] for i in range(len(wl))]
    distinct = distinct_tokens(seqs)
    everything = distinct * geom.kv_bytes_per_token + 2 * len(wl) * geom.checkpoint_bytes
    longest = max(len(q) + 1 for q in seqs)
    # what cannot sit in one live cache: the part of the workload a cache must page out to keep
    beyond_live = max(0, everything - longest * geom.kv_bytes_per_token - geom.checkpoint_bytes)
    tight = int(s.tight_fraction * beyond_live)
    live = longest * geom.kv_bytes_per_token + geom.checkpoint_bytes       # exact rows, as both hold at rest
    return {"ample": 1 << 62, "tight": tight, "lru_tight": tight + live, "everything": everything,
            "distinct": distinct, "live_reserve": live}


def _median_ratio(a: list, b: list) -> float:
    return statistics.median(x / y for x, y in zip(a, b) if y > 0)


def run_case(lm, geom, wl: W.Workload, s: Settings, log=print) -> dict:
    """One workload on one model: every runner in lockstep. Returns {"ample": row, "tight": row}."""
    b = budgets_for(wl, geom, s)
    runners = {
        "ours": Ours(lm, b["ample"], chunk=s.chunk, interval=s.interval, near_end=s.near_end, check=s.check_rules),
        "ours_tight": Ours(lm, b["tight"], chunk=s.chunk, interval=s.interval, near_end=s.near_end,
                           check=s.check_rules),
        "lru": ServerLRU(lm, None, chunk=s.chunk),
        "lru_tight": ServerLRU(lm, b["lru_tight"], chunk=s.chunk),
        "none": NoCache(lm, chunk=s.chunk),
    }
    tracks = {k: Track() for k in runners}
    ideal = Ideal(s.interval, s.near_end)
    ideal_pf, ideal_cp = [], []
    responses: dict = {}
    names = list(runners)
    t_case = time.perf_counter()
    for i, req in enumerate(wl.requests):
        prompt = wl.prompt(i, responses)
        meta = {"sys_end": wl.sys_end(i, responses), "boundaries": wl.boundaries(i, responses)}
        ideal_pf.append(ideal.prefill(prompt))
        ideal_cp.append(ideal.prefill_at_captures(prompt))
        k = i % len(names)
        for name in names[k:] + names[:k]:
            r, tr = runners[name], tracks[name]
            mt = s.none_tokens if name == "none" else req.max_tokens
            mx.synchronize()
            active0, own0 = mx.get_active_memory(), r.held()
            mx.reset_peak_memory()
            out = r.run(prompt, mt, **meta)
            mx.synchronize()
            tr.peak_own = max(tr.peak_own, mx.get_peak_memory() - active0 + own0)
            tr.held_max = max(tr.held_max, r.held())
            tr.prefilled.append(out.prefilled)
            tr.ttft.append(out.ttft_s)
            tr.total.append(out.total_s)
            tr.forward.append(out.forward_s)
            tr.bookkeeping.append(out.bookkeeping_s)
            tr.evictions += out.evictions
            tr.tokens.append(out.tokens)
            tr.gap.append(out.matched - out.resumed)
        responses[i] = tracks["ours"].tokens[-1]
        ideal.add(prompt, responses[i], meta["boundaries"] if runners["ours"].takes_boundaries else ())
        log(f"  {lm.name} {wl.name} {i + 1}/{len(wl)} {req.label}: prompt {len(prompt)}, prefilled "
            + " ".join(f"{n}={tracks[n].prefilled[-1]}" for n in names)
            + f" ideal={ideal_pf[-1]} ({time.perf_counter() - t_case:.0f}s)")

    ref = tracks["ours"].tokens
    rows = {}
    for budget, ours_k, lru_k in (("ample", "ours", "lru"), ("tight", "ours_tight", "lru_tight")):
        o, l_, n_ = tracks[ours_k], tracks[lru_k], tracks["none"]
        ro, rl = runners[ours_k], runners[lru_k]
        held_o, held_l = ro.held(), rl.held()
        dist_o, dist_l = ro.distinct(), rl.distinct()
        fwd, bk = sum(o.forward), sum(o.bookkeeping)
        rows[budget] = {
            "model": lm.name, "workload": wl.name, "budget": budget,
            "budget_bytes": None if budget == "ample" else b["tight"],
            "lru_max_bytes": None if budget == "ample" else b["lru_tight"],
            "requests": len(wl), "prompt_tokens": sum(n_.prefilled),
            "prefilled_ours": sum(o.prefilled), "prefilled_lru": sum(l_.prefilled),
            "prefilled_none": sum(n_.prefilled), "prefilled_ideal": sum(ideal_pf),
            "prefilled_ideal_cp": sum(ideal_cp) if geom.hybrid else None,
            "ours_below_ideal": sum(1 for x, y in zip(o.prefilled, ideal_pf) if x < y),
            "ours_above_none": sum(1 for x, y in zip(o.prefilled, n_.prefilled) if x > y),
            "ttft_ours_lru": _median_ratio(o.ttft, l_.ttft),
            "ttft_ours_none": _median_ratio(o.ttft, n_.ttft),
            "ttft_median_s": {"ours": statistics.median(o.ttft), "lru": statistics.median(l_.ttft),
                              "none": statistics.median(n_.ttft)},
            "peak_ours": lm.weight_bytes + o.peak_own, "peak_lru": lm.weight_bytes + l_.peak_own,
            "peak_none": lm.weight_bytes + n_.peak_own, "weights": lm.weight_bytes,
            "held_ours": held_o, "held_lru": held_l, "held_max_ours": o.held_max, "held_max_lru": l_.held_max,
            "paged_out_ours": ro.paged_out(),
            "distinct_ours": dist_o, "distinct_lru": dist_l,
            "bpt_ours": held_o / dist_o if dist_o else None, "bpt_lru": held_l / dist_l if dist_l else None,
            "raw_kv_per_token": geom.kv_bytes_per_token, "checkpoint_bytes": geom.checkpoint_bytes,
            "bk_frac": bk / fwd if fwd else None,
            "bk_frac_median": statistics.median(x / y for x, y in zip(o.bookkeeping, o.forward) if y > 0),
            "bk_ms_median": statistics.median(o.bookkeeping) * 1e3,
            "evictions_ours": o.evictions, "nodes_ours": ro.entries(), "entries_lru": rl.entries(),
            "evaluated_ours": sum(o.prefilled) + sum(max(0, len(t) - 1) for t in o.tokens),
            "evaluated_lru": sum(l_.prefilled) + sum(len(t) for t in l_.tokens),
            "gap_max_ours": max(o.gap), "interval": s.interval, "boundaries": runners["ours"].takes_boundaries,
            "checkpoints_lru": rl.checkpoints, "context_max": max(len(wl.prompt(j, responses)) for j in range(len(wl))),
            "agree_lru": sum(a == r for a, r in zip(l_.tokens, ref)),
            "agree_ours_tight": sum(a == r for a, r in zip(tracks["ours_tight"].tokens, ref)),
            "agree_none_first": sum(a[:1] == r[:1] for a, r in zip(n_.tokens, ref)),
            "seconds": time.perf_counter() - t_case,
        }
    for r in runners.values():
        r.close()
    del runners
    gc.collect()
    mx.clear_cache()
    if s.iso:
        t_iso = time.perf_counter()
        rows["tight"].update(iso_memory.row_fields(lm, geom, wl, responses, s, rows["tight"],
                                                   tracks["ours_tight"].tokens))
        rows["tight"]["iso_seconds"] = time.perf_counter() - t_iso
    return rows


# A qwen3next decode step takes ~1 ms here: its median over 16 steps moved from 0.92 to 1.10 in four
# runs, over 80 from 0.98 to 1.01 (2 s a run), so the cheap model takes 5x the steps.
LAZY_STEP_SCALE = {"qwen3next": 5}


def lazy_view_ratio(model: str, steps: int, log=print) -> float | None:
    """bench/lazy_views.py (decode step with 50 outstanding lazy KV views / with none); ``steps`` for
    SmolLM2, scaled by LAZY_STEP_SCALE for cheaper models."""
    try:
        from bench import lazy_views
    except ImportError:
        return None
    try:
        steps *= LAZY_STEP_SCALE.get(model, 1)
        return float(lazy_views.main(["--model", model, "--steps", str(steps)]))
    except Exception as e:  # noqa: BLE001 - report, do not abort the whole benchmark
        log(f"lazy_views failed on {model}: {e!r}")
        return None
