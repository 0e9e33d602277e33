"""python -m fuzz.merge DIR... --out OUT [--top K] [--skip-invalid]

Merges the reports of a sharded campaign into one summary. Each DIR is a report directory as
`python -m fuzz --report DIR` writes it (fuzz/report.py: summary.json of format
prefix-trie-fuzz-report/1, and cases/*.json for what it found); the nightly workflow downloads one
per shard (.github/workflows/nightly-fuzz.yml, docs/fuzz.md "Sharded nightly").

OUT gets summary.json (format prefix-trie-fuzz-merged/1), summary.md and cases/<shard>/*.json: the
case file of every failure, C1 suspect cleared and C1 check unjudged, copied so that OUT replays on
its own (`python -m fuzz replay OUT/cases/<shard>/<case>.json`). A shard is named by its directory
name (the artifact name in the workflow).

Merged per model: the counters summed over the shards, requests/min over the summed wall time, the
maxima (largest C1 difference, paged-out bytes, MEM slack, request peak) with the shard that set
them. Worst cases: every failure with its case file, then the (shard, model) pairs with the largest
C1 difference (with the calibrated tolerance where the model used one).

Standard library only: the merge job needs no MLX. Exit status: 0 merged, no failure; 1 merged, a
shard found failures; 2 bad input (a directory that is not a report, a report of another format).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

FORMAT = "prefix-trie-fuzz-report/1"
MERGED = "prefix-trie-fuzz-merged/1"
# Counters of fuzz.campaign.ModelStats summed over shards, and maxima kept with their shard.
SUMMED = ("requests", "ops", "cases", "checks", "failures", "ties", "cancelled", "prompt_tokens", "prefilled",
          "reused", "ideal", "no_cache", "produced", "evictions", "squeezes", "rechecked", "cleared", "unjudged",
          "seconds")
MAXED = ("max_c1_diff", "max_paged_out", "max_mem_slack", "peak_request")
FOUND = ("failures", "cleared", "unjudged")     # lists of {model, signature, message, case, ...}


class MergeError(Exception):
    """A directory that cannot be merged; the message names it and says why."""


def load_shard(path: Path) -> dict:
    """The summary.json of one report directory, checked for what the merge reads."""
    if not path.exists():
        raise MergeError(f"{path}: no such directory")
    if not path.is_dir():
        raise MergeError(f"{path}: not a directory (give the report directory of each shard)")
    summary = path / "summary.json"
    if not summary.is_file():
        raise MergeError(f"{path} is not a fuzz report: it has no summary.json "
                         f"(`python -m fuzz --report {path}` writes one)")
    try:
        rep = json.loads(summary.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MergeError(f"{summary}: not JSON ({e})") from None
    if not isinstance(rep, dict) or rep.get("format") != FORMAT:
        got = rep.get("format") if isinstance(rep, dict) else type(rep).__name__
        raise MergeError(f"{summary}: format {got!r}, expected {FORMAT!r} (a fuzz campaign report)")
    for key in ("seed", "device", "per_model", "failures"):
        if key not in rep:
            raise MergeError(f"{summary}: no {key!r} field")
    for name, s in rep["per_model"].items():
        missing = [k for k in SUMMED + MAXED if k not in s]
        if missing:
            raise MergeError(f"{summary}: per_model[{name!r}] lacks {', '.join(missing)}")
    return rep


def _labels(dirs: list[Path]) -> list[str]:
    """Directory names, made unique (a/r and b/r become r and r~2)."""
    seen: dict[str, int] = {}
    out = []
    for d in dirs:
        name = d.resolve().name or "shard"
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}~{seen[name]}")
    return out


def _copy_case(entry: dict, shard_dir: Path, label: str, out: Path) -> dict:
    """entry with `case` pointing at its copy under out/cases/<label>/ (the campaign wrote the path it
    was run with; the file is looked up by name in the shard's cases/), `shard_case` the original."""
    e = dict(entry, shard=label, shard_case=entry.get("case"))
    src = shard_dir / "cases" / Path(str(entry.get("case", ""))).name
    if entry.get("case") and src.is_file():
        dst = out / "cases" / label / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        e["case"] = str(dst.relative_to(out))
    else:
        e["case"] = None
    return e


def merge(dirs: list[Path], out: Path, top: int = 10, skip_invalid: bool = False) -> dict:
    """Merge the report directories `dirs` into out/ (summary.json, summary.md, cases/); returns the
    merged summary. Raises MergeError on a directory that is not a report (unless skip_invalid: then
    it is listed under not_merged, and MergeError only when none is left)."""
    shards, not_merged = [], []
    for d, label in zip(dirs, _labels(dirs)):
        try:
            shards.append((d, label, load_shard(d)))
        except MergeError as e:
            if not skip_invalid:
                raise
            not_merged.append({"dir": str(d), "why": str(e)})
    if not shards:
        raise MergeError("no shard report to merge" + (f" ({len(not_merged)} invalid)" if not_merged else ""))
    out.mkdir(parents=True, exist_ok=True)
    per_model: dict[str, dict] = {}
    found: dict[str, list] = {k: [] for k in FOUND}
    c1 = []
    rows = []
    for d, label, rep in shards:
        t = {k: sum(s[k] for s in rep["per_model"].values()) for k in ("requests", "checks", "failures")}
        rows.append({"shard": label, "dir": str(d), "seed": rep["seed"], "device": rep["device"],
                     "dtype": rep.get("dtype"), "cpu_blas": (rep.get("blas") or {}).get("openblas_core"),
                     "models": list(rep["per_model"]), "minutes": rep.get("minutes"),
                     "requests_per_model": rep.get("requests"), "elapsed_s": rep.get("elapsed_s"), **t,
                     "not_run": rep.get("not_run", [])})
        for name, s in rep["per_model"].items():
            m = per_model.setdefault(name, {**{k: 0 for k in SUMMED}, **{k: 0 for k in MAXED},
                                            **{k + "_shard": None for k in MAXED}, "shards": 0, "devices": [],
                                            "c1_oracle": []})
            m["shards"] += 1
            for k in SUMMED:
                m[k] += s[k]
            for k in MAXED:
                if s[k] > m[k] or m[k + "_shard"] is None:
                    m[k], m[k + "_shard"] = s[k], label
            for key, v in (("devices", rep["device"]), ("c1_oracle", s.get("c1_oracle"))):
                if v not in m[key]:
                    m[key].append(v)
            tol = (s.get("calibration") or {}).get("tol")
            c1.append({"shard": label, "model": name, "seed": rep["seed"], "device": rep["device"],
                       "max_c1_diff": s["max_c1_diff"], "tol": tol, "oracle": s.get("c1_oracle"),
                       "ratio": s["max_c1_diff"] / tol if tol else None})
        for key in FOUND:
            for entry in rep.get(key, []):
                found[key].append(dict(_copy_case(entry, d, label, out), seed=rep["seed"], device=rep["device"]))
    for m in per_model.values():
        m["seconds"] = round(m["seconds"], 1)
        m["requests_per_min"] = round(m["requests"] / (m["seconds"] / 60), 2) if m["seconds"] else 0.0
    c1.sort(key=lambda r: (-(r["ratio"] if r["ratio"] is not None else r["max_c1_diff"]), r["shard"], r["model"]))
    merged = {
        "format": MERGED, "shards": rows, "not_merged": not_merged,
        "totals": {k: sum(m[k] for m in per_model.values()) for k in
                   ("requests", "ops", "checks", "failures", "ties", "cleared", "unjudged", "prefilled", "reused",
                    "ideal", "no_cache")},
        "per_model": per_model,
        "failures": sorted(found["failures"], key=lambda f: (f["model"], f["shard"], f["signature"])),
        "cleared": found["cleared"], "unjudged": found["unjudged"],
        "largest_c1": [r for r in c1 if r["max_c1_diff"] > 0][:top],
    }
    (out / "summary.json").write_text(json.dumps(merged, indent=1))
    (out / "summary.md").write_text(markdown(merged))
    return merged


def _first_line(text: str, n: int = 300) -> str:
    return (text.splitlines() or [""])[0][:n]


def markdown(rep: dict) -> str:
    t, shards = rep["totals"], rep["shards"]
    devices = sorted({s["device"] for s in shards})
    lines = [f"# Fuzz campaign, {len(shards)} shards merged", "",
             f"{t['requests']} requests on {', '.join(rep['per_model'])} across {len(shards)} shards "
             f"({', '.join(devices)}); {t['checks']} checks, **{t['failures']} failures**, {t['ties']} ties"
             f"{'; ' + str(t['cleared']) + ' C1 suspects cleared by the float32 replay' if t['cleared'] else ''}"
             f"{'; ' + str(t['unjudged']) + ' C1 checks unjudged' if t['unjudged'] else ''}.", ""]
    if rep["not_merged"]:
        lines += ["**Not merged** (no usable report):", "",
                  *[f"- `{x['dir']}`: {x['why']}" for x in rep["not_merged"]], ""]
    lines += ["## Per model", "",
              "| model | shards | devices | C1 oracle | requests | req/min | checks | failures | ties | evictions "
              "| prefilled | ideal | no cache | max C1 diff (shard) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in rep["per_model"].items():
        lines.append(f"| {name} | {m['shards']} | {', '.join(m['devices'])} | "
                     f"{', '.join(str(o) for o in m['c1_oracle'])} | {m['requests']} | {m['requests_per_min']} | "
                     f"{m['checks']} | {m['failures']} | {m['ties']} | {m['evictions']} | {m['prefilled']} | "
                     f"{m['ideal']} | {m['no_cache']} | {m['max_c1_diff']:.2g} ({m['max_c1_diff_shard']}) |")
    lines += ["", "## Worst cases", ""]
    if rep["failures"]:
        lines += [f"{len(rep['failures'])} failures (replay: `python -m fuzz replay <case>`, the path relative to "
                  "this report):", ""]
        for f in rep["failures"]:
            case = f"`{f['case']}`" if f["case"] else f"**case file missing** (the shard named `{f['shard_case']}`)"
            lines.append(f"- **{f['model']} {f['signature']}** (shard {f['shard']}, seed {f['seed']}, "
                         f"{f['device']}): {_first_line(f['message'])} — case {case}, "
                         f"{f.get('operations', '?')} → {f.get('shrunk_to', '?')} operations")
    else:
        lines.append("No failures.")
    lines += [""]
    if rep["largest_c1"]:
        lines += ["Largest C1 differences (passed checks; an exact oracle passes only at 0):", "",
                  "| shard | model | seed | device | oracle | max C1 diff | tol | diff / tol |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['shard']} | {r['model']} | {r['seed']} | {r['device']} | {r['oracle']} | "
                  f"{r['max_c1_diff']:.3g} | {'-' if r['tol'] is None else format(r['tol'], '.3g')} | "
                  f"{'-' if r['ratio'] is None else format(r['ratio'], '.2f')} |" for r in rep["largest_c1"]]
    else:
        lines.append("Every passed C1 check matched its reference exactly (largest difference 0).")
    for key, title, why in (("cleared", "C1 suspects cleared by the float32 replay", "recheck"),
                            ("unjudged", "C1 unjudged: the cold path disagrees with itself", "cold")):
        if rep[key]:
            lines += ["", f"## {title}", ""]
            lines += [f"- **{c['model']} {c['signature']}** (shard {c['shard']}): {_first_line(c['message'])} — "
                      f"case `{c['case']}`; {c.get(why, '')}" for c in rep[key]]
    lines += ["", "## Shards", "",
              "| shard | seed | device | dtype | CPU BLAS | models | bound | elapsed s | requests | checks | failures |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in shards:
        bound = f"{s['minutes']} min" if s["minutes"] else f"{s['requests_per_model']} req/model"
        blas = f"OpenBLAS {s['cpu_blas']}" if s.get("cpu_blas") else "-"
        lines.append(f"| {s['shard']} | {s['seed']} | {s['device']} | {s['dtype']} | {blas} | {', '.join(s['models'])} | "
                     f"{bound} | {s['elapsed_s']} | {s['requests']} | {s['checks']} | {s['failures']} |")
    lines += [f"- {s['shard']}: not run: {x['why']}" for s in shards for x in s["not_run"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fuzz.merge", description="Merge the reports of fuzz campaign "
                                "shards into one summary (docs/fuzz.md)")
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="a shard's report directory")
    p.add_argument("--out", type=Path, required=True, help="directory for the merged summary and cases")
    p.add_argument("--top", type=int, default=10, help="(shard, model) pairs listed by largest C1 difference")
    p.add_argument("--skip-invalid", action="store_true",
                   help="list a directory that is not a report under 'not merged' instead of stopping")
    args = p.parse_args(argv)
    try:
        rep = merge(args.dirs, args.out, args.top, args.skip_invalid)
    except MergeError as e:
        print(f"fuzz.merge: {e}", file=sys.stderr)
        return 2
    t = rep["totals"]
    print(f"merged {len(rep['shards'])} shards into {args.out}/summary.md: requests {t['requests']}  "
          f"checks {t['checks']}  failures {t['failures']}" +
          (f"  not merged {len(rep['not_merged'])}" if rep["not_merged"] else ""))
    for f in rep["failures"]:
        print(f"FAILURE {f['model']} {f['signature']} (shard {f['shard']}): case {args.out / (f['case'] or '?')}")
    return 1 if t["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
