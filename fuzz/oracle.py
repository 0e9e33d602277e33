"""Oracles run on every fuzz operation, and the runner that applies one case's operations.

Checks (REFERENCE rule ids; every failure message starts with its signature):
  rules   the engine runs with check_rules=True (impl.invariants after every prefix-cache
          operation) and impl.invariants.violations(pc) is re-run after every operation:
          T1-T3, S1-S3, M1-M3, P1-P2, A1 (counter == owned bytes), E1.
  A2      live snapshots process-wide == snapshots held by the trie nodes of every live engine,
          after every operation; and 0 leaked when a case's engine is torn down (fuzz/alive.py).
  E1      paged-out bytes <= budget unless no node is evictable (stated explicitly too).
  C1      exact where same-schedule replays are bit-identical (fuzz/replay.py: measured per model,
          device and dtype): the seed logits must equal, bit for bit, a cold replay of a schedule
          that wrote the restored prefix followed by the request's own forwards, and every greedy
          token must be that replay's argmax (signatures C1-exact, C1-tokens). Elsewhere
          (fuzz/cold.py) first_logits within the calibrated tolerance (fuzz/calibrate.py) of a cold
          one-forward run, greedy tokens equal; a greedy mismatch where the cold top-2 logit gap is
          below the calibrated tie gap is a tie (counted, reported, not a failure); so is a logits
          mismatch that the cold path, cut where the request's forwards were cut, reproduces within
          tol while it differs from the one-forward cold run (a chunking tie).
  MEM     MLX active memory after an operation <= weights of the loaded models + live caches +
          paged-out bytes of every live engine + MEM_MARGIN.
  A3      peak MLX memory during a budget squeeze (set_budget, with mx.reset_peak_memory before)
          <= active before + one extra copy of what the squeeze could merge (paged-out + live
          cache bytes before) + A3_MARGIN: merges must not accumulate copies.
  IDEAL   resume <= the longest prefix of the prompt's keys evaluated earlier in the case (the
          trie can only hold what was evaluated), so prefilled >= ideal for every request.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from impl.caches.base import live_snapshots
from impl.engine import Engine
from impl.invariants import violations
from impl.trie import common_prefix

from .alive import ALIVE, _BASE, engines_bytes, held_snapshots, loaded_weight_bytes, register, teardown
from .cold import ColdOracle, chunking_tie
from .replay import Replay, replay_is_exact
from .workload import media_from_json

TIE = 1e-3             # the smallest tie gap (fuzz.calibrate.TIE_MIN); calibrated: max(TIE, 2 x tol)
MEM_MARGIN = 16 << 20  # allocator slack, small arrays (logits, masks); measured slack <= 0.5 MiB here
A3_MARGIN = 16 << 20


class Failure(Exception):
    def __init__(self, signature: str, message: str):
        super().__init__(f"{signature}: {message}")
        self.signature, self.message = signature, message


# --------------------------------------------------------------------- runner
@dataclass
class OpRecord:
    index: int
    op: str
    kind: str
    seconds: float
    prompt: int = 0
    resumed: int = 0
    prefilled: int = 0
    ideal: int = 0
    no_cache: int = 0
    produced: int = 0
    cancelled: bool = False
    max_diff: float = 0.0
    ties: int = 0
    checks: int = 0
    paged_out: int = 0
    active: int = 0
    live: int = 0
    budget: int = 0
    slack: int = 0             # active - weights of loaded models - bytes of every live engine (MEM)
    peak: int = 0
    peak_delta: int = 0
    evictions: int = 0


@dataclass
class Runner:
    """One engine running one case's operations with every oracle on."""
    loaded: object
    settings: dict
    oracle: ColdOracle
    c1: bool = True
    engine: Engine = None
    streams: list = field(default_factory=list)       # key streams evaluated so far in this case
    records: list = field(default_factory=list)
    tie_notes: list = field(default_factory=list)

    def __post_init__(self):
        s = self.settings
        self.exact = self.c1 and replay_is_exact(self.loaded)
        self.replay = Replay(self.loaded) if self.exact else None
        self.tol = self.tie = 0.0
        if self.c1 and not self.exact:
            from .calibrate import calibration
            cal = calibration(self.loaded)
            self.tol, self.tie = cal.tol, cal.tie
        self.engine = Engine(self.loaded, s["budget"], chunk_size=s["chunk_size"],
                             capture_interval=s["capture_interval"], near_end=s["near_end"], check_rules=True)
        register(self.engine)

    def close(self) -> int:
        """Tear the engine down; returns leaked snapshots (A2)."""
        leaked = 0
        if self.engine is not None:
            leaked = teardown(self.engine)
            self.engine = None
        return leaked

    # ---------------------------------------------------------- checks after any op
    def _quiet_checks(self, rec: OpRecord) -> None:
        pc = self.engine.pc
        v = violations(pc)
        if v:
            rules = sorted({x.split(" ", 1)[0] for x in v})    # "E3 at node (…) …": the rule id
            raise Failure("rule:" + ",".join(rules), "; ".join(v) + "\n" + pc.dump())
        held = sum(held_snapshots(e.pc) for e in ALIVE)
        live = live_snapshots() - _BASE["snapshots"]
        if live != held:
            raise Failure("A2", f"{live} snapshots alive but the tries of live engines hold {held}")
        active = mx.get_active_memory()
        accounted = loaded_weight_bytes() + engines_bytes()
        bound = accounted + MEM_MARGIN
        rec.slack = active - accounted
        if active > bound:
            raise Failure("MEM", f"MLX active {active} B > weights + live caches + paged-out + margin = {bound} B")
        rec.checks += 4
        rec.paged_out, rec.active, rec.budget = pc.counter, active, pc.budget
        rec.live = sum(c.nbytes for c in self.engine.caches if c is not None)

    # ---------------------------------------------------------- operations
    def run(self, op: dict, index: int) -> tuple[OpRecord, object]:
        t0 = time.perf_counter()
        if op["op"] == "set_budget":
            rec, res = self._set_budget(op, index), None
        elif op["op"] == "generate":
            rec, res = self._generate(op, index)
        else:
            raise ValueError(f"unknown op {op['op']!r}")
        rec.seconds = time.perf_counter() - t0
        self.records.append(rec)
        return rec, res

    def _set_budget(self, op: dict, index: int) -> OpRecord:
        rec = OpRecord(index, "set_budget", op.get("kind", ""), 0.0)
        eng = self.engine
        before_active = mx.get_active_memory()
        could_copy = eng.pc.counter + sum(c.nbytes for c in eng.caches if c is not None)
        evictions = eng.pc.evictions
        mx.reset_peak_memory()
        try:
            eng.set_budget(int(op["bytes"]))
        except AssertionError as e:
            raise Failure(_rule_sig(str(e)), str(e)) from e
        peak = mx.get_peak_memory()
        rec.peak, rec.peak_delta = peak, max(0, peak - before_active)
        rec.evictions = eng.pc.evictions - evictions
        if rec.peak_delta > could_copy + A3_MARGIN:
            raise Failure("A3", f"squeeze to {op['bytes']} B peaked {rec.peak_delta} B above the active "
                                f"{before_active} B; one copy of everything mergeable is {could_copy} B")
        rec.checks += 1
        self._quiet_checks(rec)
        return rec

    def _generate(self, op: dict, index: int):
        eng, pc = self.engine, self.engine.pc
        tokens, media_json = op["tokens"], op.get("media", [])
        media = [media_from_json(m) for m in media_json]
        calls = [0]
        cancel_after = op.get("cancel_after")

        def cancel():
            calls[0] += 1
            return cancel_after is not None and calls[0] > cancel_after

        evictions = pc.evictions
        mx.reset_peak_memory()
        try:
            r = eng.generate(list(tokens), max_tokens=int(op["max_tokens"]), media=media, cancel=cancel,
                             boundaries=[b for b in op.get("boundaries", ()) if b < len(tokens)] or None)
        except AssertionError as e:
            raise Failure(_rule_sig(str(e)), str(e)) from e
        except Exception as e:
            raise Failure(f"exception:{type(e).__name__}", repr(e)) from e
        rec = OpRecord(index, "generate", op.get("kind", ""), 0.0, prompt=len(tokens), resumed=r.stats.resumed,
                       prefilled=r.stats.prefilled, produced=len(r.tokens), cancelled=r.cancelled,
                       evictions=pc.evictions - evictions, peak=mx.get_peak_memory())
        first = None if r.first_logits is None else np.array(r.first_logits.astype(mx.float32))
        r.first_logits = None
        self._quiet_checks(rec)

        # IDEAL: what was evaluated before in this case bounds what may be reused.
        from impl.media import keys_of, noncausal_spans
        keys = keys_of(tokens, media)
        n = len(keys)
        lcp = max((common_prefix(keys, s) for s in self.streams), default=0)
        lcp = min(lcp, n - 1)
        for a, e in noncausal_spans(media):
            if a < lcp < e:
                lcp = a
        end = r.stats.resumed + r.stats.prefilled
        if r.stats.resumed > lcp:
            raise Failure("IDEAL", f"resumed at {r.stats.resumed} but only {lcp} keys of this prompt were "
                                   "ever evaluated in this case")
        rec.ideal, rec.no_cache = max(0, end - lcp), end
        stream = list(keys[:end])
        if first is not None:
            stream += [keys[-1]] + list(r.tokens[:-1])
        self.streams.append(stream)
        rec.checks += 1

        # C1
        if self.exact:
            v = self.replay.judge(tokens, media, r, first, engine=eng)
            if v.judged:
                rec.checks += 2
                rec.max_diff = v.diff
                if not v.ok:
                    raise Failure(v.signature, v.message)
                want = int(op["max_tokens"])
                if not r.cancelled and len(r.tokens) < want and r.tokens[-1] != eng.eos:
                    raise Failure("C1-tokens", f"{len(r.tokens)} of {want} tokens produced, the last "
                                               f"({r.tokens[-1]}) not eos, and no cancel")
        elif self.c1 and (first is not None or r.tokens):
            self._calibrated_c1(rec, r, index, tokens, media, media_json, first, op, n)
        return rec, r

    def _calibrated_c1(self, rec, r, index, tokens, media, media_json, first, op, n) -> None:
        """C1 against a cold one-forward run within the calibrated tolerance (fuzz/cold.py)."""
        cold = self.oracle.get(self.loaded, tokens, media_json, int(op["max_tokens"]))
        if first is not None:
            diff = float(np.abs(first - cold.logits).max())
            rec.max_diff = diff
            rec.checks += 1
            if not diff <= self.tol:
                tie = chunking_tie(self.loaded, tokens, media, r, first, self.tol)
                if tie is None:
                    raise Failure("C1-logits", f"first logits differ from the cold run by {diff:.3g} > "
                                               f"{self.tol:.3g} (calibrated) "
                                               f"(resumed at {r.stats.resumed} of {n})")
                rec.ties += 1
                self.tie_notes.append({"op": index, "kind": "chunking", "diff": diff, **tie})
                return                                   # the greedy tokens follow other logits
        for i, (a, b) in enumerate(zip(r.tokens, cold.tokens)):
            if a != b:
                if cold.gaps[i] < self.tie:
                    rec.ties += 1
                    self.tie_notes.append({"op": index, "step": i, "gap": cold.gaps[i]})
                    break
                raise Failure("C1-tokens", f"greedy token {i} is {a}, cold run gives {b} "
                                           f"(cold top-2 gap {cold.gaps[i]:.3g}); ours {r.tokens}, "
                                           f"cold {cold.tokens[:len(r.tokens)]}")
        else:
            if not r.cancelled and len(r.tokens) != min(int(op["max_tokens"]), len(cold.tokens)) \
                    and not cold.eos:
                raise Failure("C1-tokens", f"{len(r.tokens)} tokens produced, cold run gives {cold.tokens}")
        rec.checks += 1


def _rule_sig(msg: str) -> str:
    import re
    rules = sorted(set(re.findall(r"\b([TSMPGEAC][0-9])(?: at |:)", msg)))   # "E3 at node …", "G1: …"
    return "rule:" + (",".join(rules) if rules else "assert")
