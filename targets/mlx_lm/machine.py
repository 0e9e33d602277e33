"""The Hypothesis machine over mlx-lm's server prompt cache, programs, replay and the search.

A program is JSON: {"model", "prompt_cache_size", "prompt_cache_bytes", "ops": [[prompt, gen, chat,
sys_len(, seed)], ...]} and, when set, the server flags "kv_bits", "quantized_kv_start" and "draft" --
each op one request served by adapter.ServerDriver, on the path mlx_lm.server chooses for it (a seed,
--kv-bits, a draft model or caches that cannot merge: the sequential path). `replay(program)` runs it with
every rule enabled and returns the findings.

Invariants:
- Prompts are drawn to share prefixes: a request extends or branches off a prefix of an earlier
  sequence (prompt + generated tokens) or of nothing, over a 6-token alphabet; so exact hits, strict
  prefixes, one-token entries and divergences inside entries are all reachable.
- The machine fails on the first violation whose (rule, cause) is not in `known`; policy differences
  never fail it (they are tallied in POLICY). Hypothesis only generates (no example database, no
  shrinking phase); the first failing program, kept in LAST, is shrunk by `shrink` -- delta debugging
  over requests and tokens, each candidate replayed with only that rule enabled -- because replays
  with real forwards make Hypothesis's own shrinking of a stateful run take minutes.
- Nothing is served after a crash (the server's generation thread is dead).
- The fast tier (`hollow=True`) runs all of the above on hollow models (targets/mlx_lm/hollow.py: the
  same cache calls and states, no arithmetic) with every rule but C1; a finding is shrunk there and
  reported only once its shrunk program fails the same way on the real models.
"""
from __future__ import annotations

import json
import time

from hypothesis import Phase, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from targets.mlx_lm import models
from targets.mlx_lm.adapter import ServerDriver
from targets.mlx_lm.rules import RULES, Checker

ALPHABET = st.integers(1, 6)
LAST: dict = {}
STATS = {"steps": 0, "seconds": 0.0}
E1_WORST: dict = {}               # path -> the largest excess over --prompt-cache-bytes seen at rest, with its model
PATHS: dict = {}                  # path -> requests served on it, over every run of the process
POLICY: dict = {}                 # cause -> [count, first example], over every run of the process
UNCONFIRMED: list = []            # the fast tier's findings its shrunk program did not reproduce on real models


def tier_checker(hollow: bool = False, enabled=None) -> Checker:
    """The checker of a tier: every rule on the real models; on hollow ones every rule but C1, whose
    logprobs mean nothing there (targets/mlx_lm/hollow.py)."""
    if hollow:
        enabled = (set(RULES) if enabled is None else set(enabled)) - {"C1"}
    return Checker(enabled=enabled)


def unit_bytes(model_name: str) -> int:
    """Bytes of one 8-token entry on `model_name` (the scale of the byte limits drawn)."""
    d = ServerDriver(model_name, prompt_cache_size=10, hollow=True)     # hollow: the same bytes (its tests)
    d.request([1, 2, 3, 4, 5, 6, 1], [2])
    return max(e.nbytes for e in d.entries().values())


_units: dict = {}


def make_machine(model_name: str, known=frozenset(), lru_class=None, hollow: bool = False):
    if model_name not in _units:
        _units[model_name] = unit_bytes(model_name)
    unit = _units[model_name]

    class MlxLmServerMachine(RuleBasedStateMachine):
        @initialize(size=st.sampled_from([2, 3, 10]), mult=st.sampled_from([None, 1, 2, 4]), data=st.data())
        def setup(self, size, mult, data):
            self.checker = tier_checker(hollow)
            limit = None if mult is None else mult * unit
            flags = {}
            if model_name in QUANTIZABLE and data.draw(st.booleans(), label="kv_bits"):
                flags = {"kv_bits": data.draw(st.sampled_from([4, 8]), label="bits"), "quantized_kv_start":
                         data.draw(st.sampled_from([0, 4]), label="quantized_kv_start")}
            if model_name in models.DRAFTS and data.draw(st.booleans(), label="draft"):
                flags["draft"] = models.DRAFTS[model_name]
            self.driver = ServerDriver(model_name, prompt_cache_size=size, prompt_cache_bytes=limit,
                                       lru_class=lru_class, observer=self.checker, hollow=hollow, **flags)
            self.program = {"model": model_name, "prompt_cache_size": size, "prompt_cache_bytes": limit,
                            **flags, "ops": []}
            self.seqs = [()]
            self.seen = 0
            self.t0 = time.perf_counter()

        @rule(data=st.data())
        def request(self, data):
            if self.driver.dead:          # the server serves nothing after its thread died
                return
            base = data.draw(st.sampled_from(self.seqs), label="base")
            cut = data.draw(st.integers(0, len(base)), label="cut")
            suffix = data.draw(st.lists(ALPHABET, max_size=4), label="suffix")
            prompt = list(base[:cut]) + suffix
            if not prompt:
                prompt = [data.draw(ALPHABET, label="first")]
            gen = data.draw(st.lists(ALPHABET, min_size=1, max_size=3), label="gen")
            chat = data.draw(st.booleans(), label="chat")
            sys_len = data.draw(st.integers(0, 3), label="sys_len") if chat else 0
            seed = data.draw(st.sampled_from([None, None, 0]), label="seed") if self.driver.batchable else None
            op = [prompt, gen, chat, sys_len] + ([seed] if seed is not None else [])
            self.program["ops"].append(op)
            t = time.perf_counter()
            res = self.driver.request(prompt, gen, chat=chat, sys_len=sys_len, seed=seed)
            STATS["steps"] += 1
            STATS["seconds"] += time.perf_counter() - t
            PATHS[res.path] = PATHS.get(res.path, 0) + 1
            for path, w in self.checker.e1_worst.items():
                if path not in E1_WORST or w["held"] - w["limit"] > E1_WORST[path]["held"] - E1_WORST[path]["limit"]:
                    E1_WORST[path] = {**w, "model": model_name}
            self.seqs.append(tuple(prompt + (res.generated or gen)))
            for f in self.checker.findings[self.seen:]:
                if f.kind == "policy":
                    n, ex = POLICY.get(f.cause, [0, f"{model_name}: {f.message}"])
                    POLICY[f.cause] = [n + 1, ex]
            self.seen = len(self.checker.findings)
            new = [f for f in self.checker.violations() if (f.rule, f.cause) not in known]
            if new:
                f = new[0]
                LAST.setdefault("first_at", time.perf_counter())
                LAST.update(program=_copy(self.program), finding=f, at=time.perf_counter())
                raise AssertionError(f"{f.rule} ({f.cause}) at request {f.step}: {f.message}")

    MlxLmServerMachine.TestCase.settings = settings(deadline=None)
    return MlxLmServerMachine


QUANTIZABLE = ("llama_q",)       # models whose KV caches --kv-bits can quantize (head_dim a multiple of 64)
FLAGS = ("kv_bits", "quantized_kv_start", "draft")


def _copy(p):
    return {**p, "ops": [list(map(lambda x: list(x) if isinstance(x, list) else x, op)) for op in p["ops"]]}


def run_driver(program: dict, lru_class=None, checker=None, hollow: bool = False):
    checker = checker or tier_checker(hollow)
    d = ServerDriver(program["model"], program["prompt_cache_size"], program["prompt_cache_bytes"],
                     lru_class=lru_class, observer=checker, hollow=hollow,
                     **{k: program[k] for k in FLAGS if k in program})
    for op in program["ops"]:
        if d.dead:
            break
        prompt, gen, chat, sys_len = op[:4]
        d.request(prompt, gen, chat=chat, sys_len=sys_len, seed=op[4] if len(op) > 4 else None)
    return d, checker


def replay(program: dict, lru_class=None, hollow: bool = False) -> list:
    """Every finding (violations and policy differences) of a program, all rules enabled (on hollow
    models: all but C1)."""
    return run_driver(program, lru_class, hollow=hollow)[1].findings


def reproduces(finding: dict, lru_class=None) -> bool:
    return any(f.kind == "violation" and (f.rule, f.cause) == (finding["rule"], finding["cause"])
               for f in replay(finding["program"], lru_class))


def replay_status(finding: dict, installed: str, lru_class=None) -> str:
    """"reproduces", "fixed upstream in <installed>" (a newer mlx-lm no longer shows it: reported,
    never a failure) or "does not reproduce" (on the version it was found on: a failure)."""
    if reproduces(finding, lru_class):
        return "reproduces"
    if installed != finding["mlx_lm_version"]:
        return f"fixed upstream in {installed}"
    return "does not reproduce"


def hunt(model_name: str, known=frozenset(), hyp_settings=None, lru_class=None, hollow: bool = False):
    """One Hypothesis run from scratch, generation only (no example database); the first failing
    program is then shrunk by `shrink`. (finding, shrunk program, time of the first failure) or None.
    `hollow`: on hollow models (every rule but C1), and the shrunk program is confirmed on the real
    models; one that does not fail there is no finding: ("unconfirmed", finding, program)."""
    LAST.clear()
    cls = make_machine(model_name, known, lru_class, hollow)
    s = hyp_settings or settings(max_examples=150, stateful_step_count=12)
    s = settings(s, deadline=None, database=None, phases=[Phase.generate])
    try:
        run_state_machine_as_test(cls, settings=s)
    except Exception:
        if not LAST:
            raise
    if not LAST:
        return None
    f = LAST["finding"]
    program = shrink(LAST["program"], f.rule, f.cause, lru_class, hollow=hollow)
    on_real = _violation(program, f.rule, f.cause, lru_class)       # the report's message, from the real models
    if hollow and on_real is None:
        return "unconfirmed", f, program
    return on_real or f, program, LAST["first_at"]


def _violation(program, rule, cause, lru_class, hollow: bool = False):
    """The program's first (rule, cause) violation with only that rule judged, or None (also when the
    replay itself raises)."""
    try:
        _, ch = run_driver(program, lru_class, tier_checker(hollow, {rule}), hollow)
    except Exception:
        return None
    return next((f for f in ch.findings if f.kind == "violation" and (f.rule, f.cause) == (rule, cause)), None)


def _fails(program, rule, cause, lru_class, hollow: bool = False) -> bool:
    return _violation(program, rule, cause, lru_class, hollow) is not None


def shrink(program: dict, rule: str, cause: str, lru_class=None, passes: int = 4, hollow: bool = False) -> dict:
    """Greedy delta debugging until a pass changes nothing (at most `passes`): simpler flags, drop
    requests, replace a token value by 1 everywhere, plain text instead of chat, drop or lower single
    prompt and generated tokens. Every accepted candidate still fails with the same (rule, cause)."""
    best = _copy(program)
    n = _last_needed(best, rule, cause, lru_class, hollow)
    if n < len(best["ops"]) and _fails({**best, "ops": best["ops"][:n]}, rule, cause, lru_class, hollow):
        best["ops"] = best["ops"][:n]

    def attempt(c):
        nonlocal best
        if _fails(c, rule, cause, lru_class, hollow):
            best = _copy(c)
            return True
        return False

    for _ in range(passes):
        before = json.dumps(best)
        for flag, v in (("prompt_cache_bytes", None), ("prompt_cache_size", 10)):
            if best[flag] != v:
                attempt({**best, flag: v})
        for i in range(len(best["ops"]) - 1, -1, -1):
            if i < len(best["ops"]):
                attempt({**best, "ops": best["ops"][:i] + best["ops"][i + 1:]})
        for flag in FLAGS:
            if flag in best:
                attempt({k: v for k, v in best.items() if k != flag})
        values = sorted({t for op in best["ops"] for t in op[0] + op[1] if t > 1}, reverse=True)
        for v in values:
            attempt({**best, "ops": [[[1 if t == v else t for t in op[0]], [1 if t == v else t for t in op[1]],
                                      op[2], op[3]] + op[4:] for op in best["ops"]]})
        for i in range(len(best["ops"])):
            def put(op, i=i):
                return {**best, "ops": best["ops"][:i] + [op] + best["ops"][i + 1:]}
            prompt, gen, chat, sys_len = best["ops"][i][:4]
            extra = best["ops"][i][4:]
            if extra and attempt(put([prompt, gen, chat, sys_len])):
                extra = []
            if chat and attempt(put([prompt, gen, False, 0] + extra)):
                prompt, gen, chat, sys_len = best["ops"][i][:4]
            if sys_len and attempt(put([prompt, gen, chat, 0] + extra)):
                prompt, gen, chat, sys_len = best["ops"][i][:4]
            for field in (0, 1):
                j = len(best["ops"][i][field]) - 1
                while j >= 0:
                    op = [list(x) if isinstance(x, list) else x for x in best["ops"][i]]
                    seq = op[field]
                    if len(seq) > 1:
                        op[field] = seq[:j] + seq[j + 1:]
                        if attempt(put(op)):
                            j = min(j, len(best["ops"][i][field])) - 1
                            continue
                    if seq[j] > 1:
                        op = [list(x) if isinstance(x, list) else x for x in best["ops"][i]]
                        op[field] = seq[:j] + [1] + seq[j + 1:]
                        attempt(put(op))
                    j -= 1
        if json.dumps(best) == before:
            break
    return best


def _last_needed(program, rule, cause, lru_class, hollow: bool = False) -> int:
    """Requests up to and including the first failing one."""
    _, ch = run_driver(program, lru_class, tier_checker(hollow, {rule}), hollow)
    steps = [f.step for f in ch.findings if f.kind == "violation" and (f.rule, f.cause) == (rule, cause)]
    return (min(steps) + 1) if steps else len(program["ops"])


def search(models, minutes: float, known=frozenset(), log=print, lru_class=None, hollow: bool = False):
    """Look for distinct (rule, cause) violations for `minutes`, model after model; every hunt
    starts from scratch (no example database, a fresh random seed) and stops at its first new
    violation, shrunk. Runs the whole time given, whatever it finds. `hollow`: the fast tier (hunt)."""
    found, start = [], time.perf_counter()
    known = set(known)
    i = 0
    while time.perf_counter() - start < minutes * 60:
        m = models[i % len(models)]
        i += 1
        t = time.perf_counter()
        got = hunt(m, frozenset(known), lru_class=lru_class,     # a fresh random seed per hunt
                   hyp_settings=settings(max_examples=150, stateful_step_count=12, derandomize=False),
                   hollow=hollow)
        if got is None:
            log(f"[{time.perf_counter() - start:6.1f}s] {m}: nothing new in {time.perf_counter() - t:.1f}s")
            continue
        if got[0] == "unconfirmed":
            _, f, program = got
            UNCONFIRMED.append({"rule": f.rule, "cause": f.cause, "model": m, "program": program})
            known.add((f.rule, f.cause))          # the tier cannot tell it apart: later hunts look elsewhere
            log(f"[{time.perf_counter() - start:6.1f}s] {m}: {f.rule} ({f.cause}) on hollow models only: "
                "not reproduced on the real ones, not reported")
            continue
        f, program, first_at = got
        known.add((f.rule, f.cause))
        found.append({"rule": f.rule, "cause": f.cause, "message": f.message, "model": m, "program": program,
                      "steps": len(program["ops"]), "seconds_to_detect": round(first_at - start, 1),
                      "hunt_seconds": round(time.perf_counter() - t, 1)})
        log(f"[{time.perf_counter() - start:6.1f}s] {m}: {f.rule} ({f.cause}) in {len(program['ops'])} steps")
    return found
