"""Campaign report: summary.json, summary.md and memory.png in the report directory.

Per model: requests, requests/min (wall time spent on that model, oracles included), tokens
prefilled vs reused vs the ideal vs no cache, checks, failures, ties, peak memory figures and the
memory series (paged-out bytes, MLX active memory, live caches, budget per operation).

Token accounting (per generate request, positions of the prompt before the decode seed, which every
request evaluates once and is not counted):
  prefilled  positions the engine evaluated (stats.prefilled)
  reused     the resume offset: positions restored from the cache
  ideal      positions not covered by any prefix evaluated earlier in the same case (the longest
             common prefix with any earlier evaluated key stream, at most n-1, never inside a
             non-causal item), up to where the request stopped
  no_cache   positions a cache-less engine would evaluate up to the same point
so ideal <= prefilled <= no_cache always (a check of the IDEAL oracle).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from impl.platform import coretype_mismatch, describe_blas, openblas_core

from .oracle import A3_MARGIN, MEM_MARGIN, TIE


def _device() -> str:
    from .calibrate import device_key
    return device_key()


def _blas() -> dict:
    """The BLAS kernels the CPU ran, as the loaded library reports them (not as OPENBLAS_CORETYPE asks)."""
    return {"openblas_core": openblas_core(), "coretype_mismatch": coretype_mismatch(os.environ)}


def _mib(x: int) -> str:
    return f"{x / (1 << 20):.2f} MiB"


def build(campaign) -> dict:
    args = campaign.args
    models = {}
    for m in campaign.models:
        s = asdict(m.stats)
        minutes = m.stats.seconds / 60 if m.stats.seconds else 0
        s["requests_per_min"] = round(m.stats.requests / minutes, 2) if minutes else 0.0
        s["settings"] = m.settings
        s["layer_kinds"] = sorted({k for k in m.loaded.layer_kinds if k})
        s["weights_bytes"] = m.loaded.weight_bytes
        s["series"] = m.series
        from .calibrate import announce, calibration
        from .replay import replay_is_exact
        s["c1_oracle"] = "exact" if replay_is_exact(m.loaded) else "calibrated"
        if s["c1_oracle"] == "calibrated":
            cal = calibration(m.loaded)
            s["calibration"] = {k: v for k, v in cal.as_dict().items() if k != "probes"}
            s["new_platform"] = announce(cal)
        models[m.name] = s
    return {
        "format": "prefix-trie-fuzz-report/1",
        "seed": args.seed, "models": list(models), "minutes": args.minutes, "requests": args.requests,
        "elapsed_s": round(getattr(campaign, "elapsed", 0.0), 1),
        "settings": {"budget": args.budget, "chunk": args.chunk, "interval": args.interval,
                     "near_end": args.near_end, "case_len": args.case_len, "shrink_seconds": args.shrink_seconds},
        "tolerance": {"logits_atol": {n: models[n]["calibration"]["tol"] for n in models if "calibration" in models[n]},
                      "tie_gap": {n: models[n]["calibration"]["tie"] for n in models if "calibration" in models[n]},
                      "tie_min": TIE,
                      "mem_margin": MEM_MARGIN, "a3_margin": A3_MARGIN},
        "device": _device(), "blas": _blas(), "dtype": getattr(args, "dtype", "float32"),
        "recheck": bool(getattr(args, "recheck", False)),
        "oracle": {"text_only": "mlx-lm stock caches (make_prompt_cache), one forward of the prompt, greedy steps",
                   "media": "a fresh Engine with an empty trie, one prefill chunk (stock caches cannot build "
                            "the bidirectional mask of a non-causal item)",
                   "cold_runs": campaign.oracle.misses, "cold_cache_hits": campaign.oracle.hits,
                   "cold_seconds": round(campaign.oracle.seconds, 1)},
        "totals": {k: sum(models[n][k] for n in models) for k in
                   ("requests", "ops", "checks", "failures", "ties", "prefilled", "reused", "ideal", "no_cache",
                    "cleared", "unjudged")},
        "per_model": models,
        "failures": campaign.failures,
        "not_run": [{"model": n, "why": why} for n, why in campaign.skipped],
        "cleared": campaign.cleared,
        "unjudged": campaign.unjudged,
    }


def markdown(rep: dict) -> str:
    t = rep["totals"]
    lines = [f"# Fuzz campaign, seed {rep['seed']}", "",
             f"{t['requests']} requests ({t['ops']} operations incl. budget changes) on {', '.join(rep['models'])} "
             f"in {rep['elapsed_s']} s; {t['checks']} checks, **{t['failures']} failures**, {t['ties']} ties"
             f"{'; ' + str(t['cleared']) + ' C1 suspects cleared by the float32 replay' if t['cleared'] else ''}"
             f"{'; ' + str(t['unjudged']) + ' C1 checks unjudged (the cold path disagrees with itself)' if t['unjudged'] else ''}.",
             "",
             *[f"Not run: {x['why']}." for x in rep.get("not_run", [])],
             *([""] if rep.get("not_run") else []),
             f"Settings: budget {rep['settings']['budget']}, chunk {rep['settings']['chunk']}, capture interval "
             f"{rep['settings']['interval']}, near end {rep['settings']['near_end']}, case length "
             f"{rep['settings']['case_len']} operations.", "",
             f"C1 oracle, device {rep.get('device')}, dtype {rep.get('dtype')}: **exact** for "
             f"{', '.join(n for n, s in rep['per_model'].items() if s.get('c1_oracle') == 'exact') or 'no model'} "
             f"(same-schedule replays are bit-identical here: the seed logits must equal a cold replay on "
             f"mlx-lm's stock caches of the forwards that wrote the restored state, bit for bit, and every greedy "
             f"token that replay's argmax; fuzz/replay.py); **calibrated** for "
             f"{', '.join(n for n, s in rep['per_model'].items() if s.get('c1_oracle') == 'calibrated') or 'no model'}: "
             f"text-only prompts against {rep['oracle']['text_only']}; media prompts against "
             f"{rep['oracle']['media']}; |logits - cold| <= the calibrated tolerance per model (fuzz/calibrate.py; "
             f"table below), greedy tokens exact, a mismatch with cold top-2 gap < the calibrated tie gap is a tie"
             f"{'; every passed case replayed on the float32 model (recheck)' if rep.get('recheck') else ''}. "
             f"Cold runs {rep['oracle']['cold_runs']} ({rep['oracle']['cold_seconds']} s), "
             f"served from the cold cache {rep['oracle']['cold_cache_hits']}.", "",
             "| model | requests | req/min | cases | checks | failures | ties | cancelled | squeezes | evictions "
             "| prefilled | reused | ideal | no cache | prefilled/ideal | max C1 diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in rep["per_model"].items():
        ratio = f"{s['prefilled'] / s['ideal']:.2f}" if s["ideal"] else "-"
        lines.append(f"| {name} | {s['requests']} | {s['requests_per_min']} | {s['cases']} | {s['checks']} | "
                     f"{s['failures']} | {s['ties']} | {s['cancelled']} | {s['squeezes']} | {s['evictions']} | "
                     f"{s['prefilled']} | {s['reused']} | {s['ideal']} | {s['no_cache']} | {ratio} | "
                     f"{s['max_c1_diff']:.2g} |")
    blas = rep.get("blas") or {}
    lines += ["", f"CPU BLAS: {describe_blas(blas.get('openblas_core'))}."]
    lines += [f"**{blas['coretype_mismatch']}**"] if blas.get("coretype_mismatch") else []
    lines += ["", *[f"**{s['new_platform']}**" for s in rep["per_model"].values() if s.get("new_platform")]]
    lines += ["", "Calibrated C1 tolerance (tol = max(K x noise, floor); tie = max(1e-3, 2 x tol)):", "",
              "| model | device | dtype | noise | K | floor | tol | tie | max C1 diff / tol | cases rechecked |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in rep["per_model"].items():
        c = s.get("calibration") or {}
        if c:
            lines.append(f"| {name} | {c['device']} | {c['dtype']} | {c['noise']:.3g} | {c['k']:g} | "
                         f"{c['floor']:.3g} | {c['tol']:.3g} | {c['tie']:.3g} | "
                         f"{s['max_c1_diff'] / c['tol']:.2f} | {s.get('rechecked', 0)} |")
    lines += ["", "Memory (budget = the model's budget in bytes; one checkpoint = whole-state of every "
              "windowed/recurrent layer + `interval` rows of every KV layer):", "",
              "| model | weights | ckpt | budget | max paged out | max live caches | max MLX active | "
              "max MEM slack | peak during a request | max squeeze peak above active |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in rep["per_model"].items():
        st = s["settings"]
        lines.append(f"| {name} | {_mib(s['weights_bytes'])} | {_mib(st['ckpt_bytes'])} | {_mib(st['budget'])} | "
                     f"{_mib(s['max_paged_out'])} | {_mib(s['max_live'])} | {_mib(s['max_active'])} | "
                     f"{_mib(s['max_mem_slack'])} | "
                     f"{_mib(s['peak_request'])} | {_mib(s['peak_squeeze_delta'])} |")
    lines += ["", "MLX active memory is process-wide: the weights of every loaded model and the caches of "
              "every live engine. MEM slack = active - (weights + live caches + paged-out of all live engines); "
              "the MEM check bounds it by the margin. Peaks are absolute MLX peaks (reset before each operation).",
              ""]
    if rep["failures"]:
        lines += ["## Failures", ""]
        for f in rep["failures"]:
            lines.append(f"- **{f['model']} {f['signature']}**: {f['message'].splitlines()[0][:300]} — case "
                         f"`{f['case']}` ({f['operations']} → {f['shrunk_to']} operations); replay with "
                         f"`python -m fuzz replay {f['case']}`")
    else:
        lines += ["No failures."]
    apart = {
        "cleared": ("C1 suspects cleared by the float32 replay", "recheck",
                    "A C1 failure on a noisy device (TF32 matmuls, half precision) is replayed, shrunk, in float32 "
                    "with TF32 off on the same device, in a fresh process (fuzz/campaign.py `suspect_recheck`). "
                    "These passed there: the noise, not the cache, moved the logits. Each case stays in cases/."),
        "unjudged": ("C1 unjudged: the cold path disagrees with itself on this device", "cold",
                     "mlx-lm's stock caches fed the failing prompt in the engine's chunks disagree with one forward "
                     "of it by more than the tolerance (fuzz/campaign.py `cold_disagrees`): no cache of ours is in "
                     "that comparison, so C1 has no single cold answer there. A platform finding, not a pass."),
    }
    for key, (title, why, intro) in apart.items():
        if rep.get(key):
            lines += ["", f"## {title}", "", intro, ""]
            lines += [f"- **{c['model']} {c['signature']}**: {c['message'].splitlines()[0][:300]} — case "
                      f"`{c['case']}`; {c[why]}" for c in rep[key]]
    lines += ["", "![memory](memory.png)", ""]
    return "\n".join(lines)


def plot(rep: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rep["per_model"])
    fig, axes = plt.subplots(len(names), 2, figsize=(13, 3.0 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        s = rep["per_model"][name]
        ser = s["series"]
        x = list(range(1, len(ser) + 1))
        mib = lambda v: v / (1 << 20)
        ax = axes[row][0]
        ax.plot(x, [mib(r[1]) for r in ser], label="paged out", lw=1.2)
        ax.step(x, [mib(r[4]) for r in ser], label="budget", where="post", color="red", lw=1)
        ax.set_title(f"{name}: paged-out bytes vs budget")
        ax.set_xlabel("operation")
        ax.set_ylabel("MiB")
        ax.legend(fontsize=8)
        ax = axes[row][1]
        ax.plot(x, [mib(r[2]) for r in ser], label="MLX active", lw=1.2)
        ax.plot(x, [mib(r[2] - r[6]) for r in ser], label="weights + live caches + paged out (all engines)", lw=1)
        ax2 = ax.twinx()
        ax2.plot(x, [mib(r[6]) for r in ser], color="green", lw=0.8, label="slack = active - that (MEM margin "
                 f"{rep['tolerance']['mem_margin'] >> 20} MiB)")
        ax2.set_ylabel("slack MiB", color="green")
        ax2.legend(fontsize=8, loc="lower right")
        ax.set_title(f"{name}: MLX active memory (process-wide)")
        ax.set_xlabel("operation")
        ax.set_ylabel("MiB")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(campaign, report_dir: Path) -> dict:
    report_dir.mkdir(parents=True, exist_ok=True)
    rep = build(campaign)
    (report_dir / "summary.json").write_text(json.dumps(rep, indent=1))
    (report_dir / "summary.md").write_text(markdown(rep))
    plot(rep, report_dir / "memory.png")
    return rep
