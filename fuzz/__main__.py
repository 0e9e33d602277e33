"""python -m fuzz [campaign options]  |  python -m fuzz replay CASE.json [...]

See docs/fuzz.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from impl.platform import apply_device_env, coretype_mismatch, reexec_with_openblas


def campaign_parser() -> argparse.ArgumentParser:
    from impl.models import MODEL_NAMES

    p = argparse.ArgumentParser(prog="python -m fuzz", description="Fuzz campaign over the prefix cache "
                                "(subcommand: replay CASE.json)")
    p.add_argument("--model", action="append", choices=MODEL_NAMES + ("all",),
                   help="model to fuzz (repeatable; default: all, round-robin)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--minutes", type=float, help="wall-time bound for the whole campaign")
    g.add_argument("--requests", type=int, help="generate requests per model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16", "q4"),
                   help="model dtype (default $PREFIX_TRIE_DTYPE or float32; q4: SmolLM2's quantised GGUF "
                        "weights, for accelerators; other models stay float32 under q4)")
    p.add_argument("--recheck", choices=("auto", "on", "off"), default="auto",
                   help="replay every passed case on the float32 model (on the CPU under TF32): the stronger "
                        "oracle where the calibrated tolerance cannot separate planted states; auto = on for "
                        "bfloat16/float16 and on a TF32 GPU")
    p.add_argument("--budget", default="8ckpt",
                   help="paged-out byte budget: bytes, '<x>MiB', or '<n>ckpt' = n x one checkpoint (default 8ckpt)")
    p.add_argument("--report", type=Path, help="report directory (default reports/<timestamp>)")
    p.add_argument("--chunk", type=int, default=16, help="prefill chunk size (default 16)")
    p.add_argument("--interval", type=int, default=32, help="periodic capture interval (default 32)")
    p.add_argument("--near-end", type=int, default=4, help="capture this many tokens before a prompt's end")
    p.add_argument("--case-len", type=int, default=30, help="operations per case (fresh engine per case)")
    p.add_argument("--shrink-seconds", type=float, default=300, help="time bound for shrinking one failure")
    p.add_argument("--save-to-corpus", action="store_true", help="also write found cases into fuzz/corpus/")
    p.add_argument("--no-progress", action="store_true")
    return p


def main_campaign(argv) -> int:
    args = campaign_parser().parse_args(argv)
    from impl.models import MODEL_NAMES

    models = args.model or ["all"]
    args.models = list(MODEL_NAMES) if "all" in models else list(dict.fromkeys(models))
    from impl.models import default_dtype

    from .calibrate import device_key
    args.dtype = args.dtype or default_dtype()
    args.recheck_all = args.recheck == "on"
    args.recheck = args.recheck == "on" or (args.recheck == "auto" and (args.dtype in ("bfloat16", "float16")
                                                                          or "+tf32" in device_key()))
    if args.minutes is None and args.requests is None:
        args.minutes = 10.0
    report_dir = args.report or Path("reports") / time.strftime("%Y%m%d-%H%M%S")
    report_dir.mkdir(parents=True, exist_ok=True)

    from . import report
    from .campaign import Campaign

    kernels = coretype_mismatch(os.environ)
    if kernels:
        print(f"warning: {kernels}", file=sys.stderr)
    c = Campaign(args, report_dir)
    for _, why in c.skipped:
        print(f"not run: {why}", file=sys.stderr)
    if not c.models:
        print("no model left to fuzz in this dtype on this backend", file=sys.stderr)
        return 2
    try:
        c.run(progress=not args.no_progress)
    finally:
        rep = report.write(c, report_dir)
    t = rep["totals"]
    print(f"report: {report_dir}/summary.md  requests {t['requests']}  checks {t['checks']}  "
          f"failures {t['failures']}  ties {t['ties']}")
    for name, s in rep["per_model"].items():
        print(f"  {name:10s} {s['requests']:5d} req  {s['requests_per_min']:7.1f} req/min  prefilled {s['prefilled']}"
              f"  reused {s['reused']}  ideal {s['ideal']}  no-cache {s['no_cache']}  failures {s['failures']}")
    for f in rep["failures"]:
        print(f"FAILURE {f['model']} {f['signature']}: case {f['case']}")
    return 1 if t["failures"] else 0


def main_replay(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m fuzz replay", description="Replay fuzz cases deterministically")
    p.add_argument("cases", nargs="+", type=Path)
    p.add_argument("-v", "--verbose", action="store_true", help="one line per operation")
    args = p.parse_args(argv)
    from .cases import run_case

    bad = 0
    for path in args.cases:
        case = json.loads(path.read_text())
        recorded = (case.get("failure") or {}).get("signature")

        def show(rec):
            if args.verbose:
                print(f"  #{rec.index:3d} {rec.op:10s} {rec.kind:13s} prompt {rec.prompt:4d} resumed {rec.resumed:4d} "
                      f"prefilled {rec.prefilled:4d} produced {rec.produced:2d} paged {rec.paged_out} "
                      f"diff {rec.max_diff:.2g}{' cancelled' if rec.cancelled else ''}")
        res = run_case(case, on_op=show)
        if res.failure is None:
            print(f"{path}: pass ({len(res.records)} operations, {sum(r.checks for r in res.records)} checks, "
                  f"{len(res.ties)} ties)" + (f"; recorded failure {recorded} no longer reproduces" if recorded else ""))
        else:
            bad += 1
            same = " (the recorded failure)" if recorded == res.failure.signature else ""
            print(f"{path}: FAIL at operation {res.failed_at}{same}\n{res.failure}")
    return 1 if bad else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    reexec_with_openblas("fuzz", guard="FUZZ_NO_REEXEC")
    apply_device_env()
    if argv and argv[0] == "replay":
        return main_replay(argv[1:])
    return main_campaign(argv)


if __name__ == "__main__":
    sys.exit(main())
