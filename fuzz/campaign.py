"""The fuzz campaign: models in turn, cases of generated operations, every oracle on every
operation, failures shrunk and saved as replayable cases, figures for the report.

A *case* is one fresh engine and a sequence of operations (fuzz.workload); the campaign keeps one
open case per model and gives the next operation to the model that has used the least wall time so
far (round-robin by time, so the slow SmolLM2 does not starve the hybrids under --minutes; under
--requests each model runs until it has served that many generate requests).
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from impl.models import DtypeUnsupported, load

from .cases import make_case, resolve_settings
from .oracle import ColdOracle, Failure, OpRecord, Runner
from .shrink import shrink
from .workload import Workload, strip_private


# --------------------------------------------------------------------------- per-model state
@dataclass
class ModelStats:
    requests: int = 0          # generate operations
    ops: int = 0               # generate + set_budget
    cases: int = 0
    checks: int = 0
    failures: int = 0
    ties: int = 0
    cancelled: int = 0
    prompt_tokens: int = 0
    prefilled: int = 0
    reused: int = 0
    ideal: int = 0
    no_cache: int = 0
    produced: int = 0
    evictions: int = 0
    squeezes: int = 0
    max_c1_diff: float = 0.0
    seconds: float = 0.0       # wall time spent on this model (engine + oracles + shrinking)
    peak_request: int = 0      # highest MLX peak during a request (absolute)
    peak_squeeze_delta: int = 0  # highest peak above the active memory during a budget squeeze
    max_paged_out: int = 0
    max_active: int = 0
    max_live: int = 0
    max_mem_slack: int = 0     # largest MLX active memory not explained by weights + engines' bytes
    rechecked: int = 0         # cases replayed in float32 (--recheck)
    cleared: int = 0           # C1 suspects of a noisy device that its float32 replay cleared
    unjudged: int = 0          # C1 failures where the device's own cold path disagrees with itself
    kinds: dict = field(default_factory=dict)


class ModelRun:
    def __init__(self, name: str, seed: int, args):
        self.name = name
        dtype = getattr(args, "dtype", None)
        self.loaded = load(name, "float32" if dtype == "q4" and name != "smollm2" else dtype)
        self.settings = resolve_settings(self.loaded, args.budget, args.chunk, args.interval, args.near_end)
        self.seed, self.args = seed, args
        self.stats = ModelStats()
        self.series: list = []       # per op: [global op, paged_out, active, live, budget, kind, MEM slack]
        self.runner: Runner | None = None
        self.workload: Workload | None = None
        self.ops: list = []
        self.case_seed = 0
        self.done = False

    def case_seed_for(self, k: int) -> int:
        return random.Random(f"{self.seed}:{self.name}:{k}").getrandbits(63)


class Campaign:
    def __init__(self, args, report_dir: Path):
        self.args = args
        self.report_dir = report_dir
        self.oracle = ColdOracle()
        self.recheck_oracle = ColdOracle()
        self.models, self.skipped = [], []      # skipped: (model, why) the backend cannot run in args.dtype
        for name in args.models:
            try:
                self.models.append(ModelRun(name, args.seed, args))
            except DtypeUnsupported as e:
                self.skipped.append((name, str(e)))
        self.cases_dir = report_dir / "cases"
        self.failures: list = []
        self.cleared: list = []      # C1 suspects the float32 replay on this device cleared (noise)
        self.unjudged: list = []     # C1 failures where the cold path disagrees with itself (platform)
        self.started = time.time()
        self.op_counter = 0

    # ------------------------------------------------------------- main loop
    def run(self, progress: bool = True) -> None:
        from tqdm import tqdm

        args = self.args
        deadline = time.perf_counter() + args.minutes * 60 if args.minutes else None
        total = args.requests * len(self.models) if args.requests else None
        bar = tqdm(total=total, unit="req", disable=not progress, dynamic_ncols=True,
                   bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} req [{elapsed}<{remaining}] {postfix}"
                   if total else "{desc} {n_fmt} req [{elapsed}, {rate_fmt}] {postfix}")
        t_start = time.perf_counter()
        try:
            while True:
                live = [m for m in self.models if not m.done]
                if not live or (deadline and time.perf_counter() >= deadline):
                    break
                m = min(live, key=lambda m: m.stats.seconds)
                before = m.stats.requests
                self.step(m)
                if m.stats.requests > before:
                    bar.update(1)
                if args.requests and m.stats.requests >= args.requests:
                    self.finish_case(m)
                    m.done = True
                checks = sum(x.stats.checks for x in self.models)
                fails = sum(x.stats.failures for x in self.models)
                bar.set_postfix_str(f"model={m.name} checks={checks} failures={fails} "
                                    f"elapsed={time.perf_counter() - t_start:.0f}s", refresh=False)
        finally:
            for m in self.models:
                self.finish_case(m)
            bar.close()
        self.elapsed = time.perf_counter() - t_start

    def step(self, m: ModelRun) -> None:
        t0 = time.perf_counter()
        try:
            if m.runner is None:
                m.stats.cases += 1
                m.case_seed = m.case_seed_for(m.stats.cases)
                m.workload = Workload(m.case_seed, m.loaded.tokenizer, m.name, m.settings["ckpt_bytes"],
                                      m.settings["budget"])
                m.runner = Runner(m.loaded, m.settings, self.oracle)
                m.ops = []
            op = m.workload.next_op(m.runner.engine.pc.counter)
            m.ops.append(op)
            try:
                rec, res = m.runner.run(op, len(m.ops) - 1)
            except Failure as f:
                self.failed(m, f)
                return
            except Exception as e:
                self.failed(m, Failure(f"exception:{type(e).__name__}", repr(e)))
                return
            if res is not None:
                m.workload.observe(op, res.tokens, res.text)
            self.account(m, rec)
            if len(m.ops) >= self.args.case_len:
                self.finish_case(m)
        finally:
            m.stats.seconds += time.perf_counter() - t0

    def account(self, m: ModelRun, rec: OpRecord) -> None:
        s = m.stats
        s.ops += 1
        s.checks += rec.checks
        s.ties += rec.ties
        s.evictions += rec.evictions
        s.kinds[rec.kind] = s.kinds.get(rec.kind, 0) + 1
        if rec.op == "generate":
            s.requests += 1
            s.cancelled += rec.cancelled
            s.prompt_tokens += rec.prompt
            s.prefilled += rec.prefilled
            s.reused += rec.resumed
            s.ideal += rec.ideal
            s.no_cache += rec.no_cache
            s.produced += rec.produced
            s.max_c1_diff = max(s.max_c1_diff, rec.max_diff)
            s.peak_request = max(s.peak_request, rec.peak)
        else:
            s.squeezes += rec.kind == "squeeze"
            s.peak_squeeze_delta = max(s.peak_squeeze_delta, rec.peak_delta)
        s.max_paged_out = max(s.max_paged_out, rec.paged_out)
        s.max_active = max(s.max_active, rec.active)
        s.max_live = max(s.max_live, rec.live)
        s.max_mem_slack = max(s.max_mem_slack, rec.slack)
        self.op_counter += 1
        m.series.append([self.op_counter, rec.paged_out, rec.active, rec.live, rec.budget, rec.kind, rec.slack])

    def finish_case(self, m: ModelRun) -> None:
        if m.runner is None:
            return
        runner, m.runner = m.runner, None
        leaked = runner.close()
        if leaked:
            self._record_failure(m, Failure("A2", f"{leaked} snapshots alive after the engine was torn down"),
                                 len(m.ops) - 1)
        elif getattr(self.args, "recheck", False) and m.ops and self.rechecks(m):
            self.recheck(m)

    def rechecks(self, m: ModelRun) -> bool:
        """--recheck auto on a TF32 device replays on the CPU: only the small hybrids there (SmolLM2's
        float32 forward on a CPU without a fast BLAS takes seconds a request); --recheck on: all."""
        from .calibrate import device_key
        return self.args.recheck_all or "+tf32" not in device_key() or m.loaded.weight_bytes < (64 << 20)

    def recheck(self, m: ModelRun) -> None:
        """The stronger oracle where the calibrated tolerance cannot separate every planted state
        (half precision, TF32): the case's concrete operations replayed on the float32 model, on the
        CPU when the device runs float32 matmuls in TF32; failures are saved unshrunk as float32
        cases (`python -m fuzz replay` runs them as recorded)."""
        from .calibrate import recheck_device
        from .cases import run_ops

        ops = [strip_private(op) for op in m.ops]
        with recheck_device() as dev:
            ref = load(m.name, "float32")
            settings = resolve_settings(ref, self.args.budget, self.args.chunk, self.args.interval,
                                        self.args.near_end)
            res = run_ops(ref, settings, ops, self.recheck_oracle)
        m.stats.rechecked += 1
        if res.failure is not None:
            f = res.failure
            m.stats.failures += 1
            self.cases_dir.mkdir(parents=True, exist_ok=True)
            k = len(self.failures) + 1
            path = self.cases_dir / f"{m.name}-recheck-{f.signature.replace(':', '_').replace(',', '_')}-{k}.json"
            case = make_case(m.name, settings, ops[:res.failed_at + 1], f, dtype="float32",
                             description=f"float32 recheck ({dev}) of a {m.loaded.dtype} case that passed "
                                         f"(seed {self.args.seed}, case seed {m.case_seed})", expect="pass")
            path.write_text(json.dumps(case, indent=1))
            self.failures.append({"model": m.name, "signature": "recheck-f32:" + f.signature,
                                  "message": f.message[:4000], "case": str(path), "operations": len(ops),
                                  "shrunk_to": res.failed_at + 1, "shrink_trials": 0, "shrink_s": 0.0})

    def suspect_recheck(self, m: ModelRun, f: Failure, case: dict, path: Path):
        """The stronger oracle for a C1 suspect on a noisy device (TF32 matmuls, half precision): the
        shrunk case replayed in float32 with TF32 off, on this same device, in a fresh process (MLX
        reads MLX_ENABLE_TF32 once). Rounding noise larger than the calibration saw disappears there;
        a cache bug does not, nor does a cold path that disagrees with itself on this device
        (docs/platform.md: deepseek_v32 on the H200). None: no recheck applies; (cleared, what the
        replay said)."""
        from .calibrate import needs_recheck
        if not f.signature.startswith("C1") or not needs_recheck(m.loaded):
            return None
        import os
        import subprocess
        import sys
        f32 = path.with_name(path.stem + "-f32-replay.json")
        f32.write_text(json.dumps(dict(case, dtype="float32"), indent=1))
        env = dict(os.environ, MLX_ENABLE_TF32="0", PREFIX_TRIE_DTYPE="float32")
        r = subprocess.run([sys.executable, "-m", "fuzz", "replay", str(f32)], env=env, capture_output=True,
                           text=True, timeout=600, cwd=Path(__file__).resolve().parent.parent)
        said = (r.stdout.strip().splitlines() or [r.stderr.strip()[-300:]])[-1][-400:]
        return r.returncode == 0, f"float32, MLX_ENABLE_TF32=0, same device: {said}"

    def cold_disagrees(self, m: ModelRun, f: Failure, case: dict):
        """C1 compares a restore with "a cold prefill"; where mlx-lm's stock caches, fed the failing
        prompt in the engine's chunks, disagree with one forward of it by more than the tolerance,
        the cold path is not one answer on this device and C1 cannot be judged there: a platform
        finding (no cache of ours is involved), reported apart. None when the cold path agrees."""
        req = case["requests"][-1] if case.get("requests") else None
        if not f.signature.startswith("C1") or req is None or req.get("op") != "generate" or req.get("media"):
            return None
        from .calibrate import cut_forward, one_forward, tolerance
        toks, size = list(req["tokens"]), m.settings["chunk_size"]
        cuts = sorted(set(range(0, len(toks) - 1, size)) | {len(toks) - 1, len(toks)})
        d = float(mx.abs(cut_forward(m.loaded, toks, cuts, stock=True) - one_forward(m.loaded, toks)).max().item())
        tol = tolerance(m.loaded)
        if d <= tol:
            return None
        return (f"mlx-lm's stock caches in chunks of {size} against one forward of the same {len(toks)} "
                f"tokens: max |diff| {d:.3g} > tolerance {tol:.3g}")

    # ------------------------------------------------------------- failures
    def failed(self, m: ModelRun, f: Failure) -> None:
        runner, m.runner = m.runner, None
        runner.close()
        self._record_failure(m, f, len(m.ops) - 1)

    def _record_failure(self, m: ModelRun, f: Failure, index: int) -> None:

        m.stats.failures += 1
        ops = [strip_private(op) for op in m.ops[:index + 1]]
        t0 = time.perf_counter()
        small, trials = shrink(m.loaded, m.settings, ops, f.signature, self.args.shrink_seconds, self.oracle)
        self.cases_dir.mkdir(parents=True, exist_ok=True)
        k = len(self.failures) + 1
        name = f"{m.name}-{f.signature.replace(':', '_').replace(',', '_')}-{k}.json"
        case = make_case(m.name, m.settings, small.ops, small.failure or f, dtype=m.loaded.dtype,
                         description=f"found by the campaign (seed {self.args.seed}, case seed {m.case_seed}); "
                                     f"shrunk from {len(ops)} to {len(small.ops)} operations in {trials} trials",
                         expect="pass")
        path = self.cases_dir / name
        path.write_text(json.dumps(case, indent=1))
        verdict = self.suspect_recheck(m, f, case, path)
        if verdict is not None and verdict[0]:
            m.stats.failures -= 1
            m.stats.cleared += 1
            self.cleared.append({"model": m.name, "signature": f.signature, "message": f.message[:4000],
                                 "case": str(path), "recheck": verdict[1]})
            return
        if verdict is not None:
            f = Failure(f.signature, f"{f.message} [confirmed by the float32 replay: {verdict[1]}]")
        split = self.cold_disagrees(m, f, case)
        if split is not None:
            m.stats.failures -= 1
            m.stats.unjudged += 1
            self.unjudged.append({"model": m.name, "signature": f.signature, "message": f.message[:4000],
                                  "case": str(path), "cold": split})
            return
        if getattr(self.args, "save_to_corpus", False):
            corpus = Path(__file__).parent / "corpus"
            corpus.mkdir(exist_ok=True)
            (corpus / name).write_text(json.dumps(case, indent=1))
        self.failures.append({"model": m.name, "signature": f.signature, "message": f.message[:4000],
                              "case": str(path), "operations": len(ops), "shrunk_to": len(small.ops),
                              "shrink_trials": trials, "shrink_s": round(time.perf_counter() - t0, 1)})
