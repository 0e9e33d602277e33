"""Oracles run on every fuzz operation, and the runner that applies one case's operations.

Checks (REFERENCE rule ids; every failure message starts with its signature):
  rules   the engine runs with check_rules=True (impl.invariants after every prefix-cache
          operation) and impl.invariants.violations(pc) is re-run after every operation:
          T1-T3, S1-S3, M1-M3, P1-P2, A1 (counter == owned bytes), E1.
  A2      live snapshots process-wide (impl.caches.base.live_snapshots) == snapshots held by the
          trie nodes of every live engine, after every operation; and 0 leaked when a case's
          engine is torn down.
  E1      paged-out bytes <= budget unless no node is evictable (stated explicitly too).
  C1      first_logits within the calibrated tolerance (fuzz/calibrate.py: per model, device and
          dtype, from the cold path's own chunking noise) of a cold run, greedy tokens equal; a
          greedy mismatch where the cold top-2 logit gap is below the calibrated tie gap (2 x tol,
          at least 1e-3) is a tie (counted, reported, not a failure); so is a logits mismatch that
          the cold path, cut where the request's forwards were cut, reproduces within tol while it
          differs from the one-forward cold run (a chunking tie: chunking_tie, media prompts too).
          Cold run: text-only prompts -> mlx-lm's own stock caches (make_prompt_cache), one
          forward of the whole prompt, then greedy steps: an independent path. Prompts with media
          -> a fresh Engine with an empty trie and one prefill chunk (stock caches cannot build the
          bidirectional mask of a non-causal item). Cold results are cached per (model, prompt,
          media) keeping the longest greedy run, so repeats and smaller max_tokens are free.
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
from impl.trie import walk

from .workload import media_from_json

ATOL = None            # the C1 bound is calibrated per (model, device, dtype): fuzz.calibrate.tolerance
TIE = 1e-3             # the smallest tie gap (fuzz.calibrate.TIE_MIN); calibrated: max(TIE, 2 x tol)
MEM_MARGIN = 16 << 20  # allocator slack, small arrays (logits, masks); measured slack <= 0.5 MiB here
A3_MARGIN = 16 << 20


class Failure(Exception):
    def __init__(self, signature: str, message: str):
        super().__init__(f"{signature}: {message}")
        self.signature, self.message = signature, message


# --------------------------------------------------------------------- engines alive (A2, MEM)
ALIVE: list = []
_BASE = {"snapshots": 0}


def held_snapshots(pc) -> int:
    return sum(1 for n in walk(pc.root) for s in n.snaps if s is not None)


def register(engine) -> None:
    if not ALIVE:
        _BASE["snapshots"] = live_snapshots()
    ALIVE.append(engine)


def teardown(engine) -> int:
    """Close every snapshot the engine's trie holds and free its live caches; returns the number
    of snapshots still alive that no live engine holds (A2: 0). A non-zero count is absorbed into
    the baseline so that other engines' checks stay meaningful; the caller reports it."""
    pc = engine.pc
    for n in list(walk(pc.root)):
        for i, s in enumerate(n.snaps):
            if s is not None:
                pc.trie.disown(n, i).release()
    for c in engine.caches:
        if c is not None:
            c.free()
    if engine in ALIVE:
        ALIVE.remove(engine)
    leaked = live_snapshots() - _BASE["snapshots"] - sum(held_snapshots(e.pc) for e in ALIVE)
    _BASE["snapshots"] += leaked
    return leaked


def loaded_weight_bytes() -> int:
    from impl.models import _loaded
    return sum(lm.weight_bytes for lm in _loaded.values())


def engines_bytes() -> int:
    return sum(sum(c.nbytes for c in e.caches if c is not None) + e.pc.counter for e in ALIVE)


# --------------------------------------------------------------------- cold oracle
@dataclass
class Cold:
    logits: np.ndarray          # last prompt position, float32
    tokens: list                # greedy tokens (stops after eos)
    gaps: list                  # cold top-2 logit gap before each token
    eos: bool                   # the run ended at eos (so it covers any max_tokens)


def _top2_gap(logits: mx.array) -> float:
    t = mx.topk(logits.astype(mx.float32), 2)
    return float(mx.abs(t[0] - t[1]).item())


class ColdOracle:
    def __init__(self):
        self.cache: dict = {}
        self.hits = self.misses = 0
        self.seconds = 0.0

    def get(self, loaded, tokens, media_json, max_tokens: int) -> Cold:
        key = (loaded.name, getattr(loaded, "dtype", "float32"), tuple(tokens), tuple(sorted((m["pos"], m["length"], m["data"], tuple(m["dims"]),
                                                          m["causal"]) for m in media_json)))
        have = self.cache.get(key)
        if have is not None and (have.eos or len(have.tokens) >= max_tokens):
            self.hits += 1
            return have
        self.misses += 1
        t0 = time.perf_counter()
        n = max(max_tokens, 1, len(have.tokens) if have else 0)
        cold = self._media(loaded, tokens, media_json, n) if media_json else self._stock(loaded, tokens, n)
        self.seconds += time.perf_counter() - t0
        self.cache[key] = cold
        if len(self.cache) > 4096:
            self.cache.pop(next(iter(self.cache)))
        return cold

    @staticmethod
    def _stock(loaded, tokens, n: int) -> Cold:
        from mlx_lm.models.cache import make_prompt_cache

        model, eos = loaded.model, loaded.tokenizer.eos_token_id
        cache = make_prompt_cache(model)
        logits = model(mx.array([list(tokens)]), cache=cache)[0, -1]
        mx.eval(logits)
        first = np.array(logits.astype(mx.float32))
        toks, gaps = [], []
        while True:
            gaps.append(_top2_gap(logits))
            t = int(mx.argmax(logits).item())
            toks.append(t)
            if t == eos or len(toks) >= n:
                break
            logits = model(mx.array([[t]]), cache=cache)[0, -1]
            mx.eval(logits)
        del cache, logits
        return Cold(first, toks, gaps, toks[-1] == eos)

    @staticmethod
    def _media(loaded, tokens, media_json, n: int) -> Cold:
        gaps = []

        def sampler(logits):
            gaps.append(_top2_gap(logits[0, -1]))
            return int(mx.argmax(logits[0, -1]).item())

        eng = Engine(loaded, 1 << 62, chunk_size=1 << 20, capture_interval=0, near_end=0)
        register(eng)
        try:
            r = eng.generate(list(tokens), max_tokens=n, media=[media_from_json(m) for m in media_json],
                             sampler=sampler)
            first = np.array(r.first_logits.astype(mx.float32))
            toks = list(r.tokens)
        finally:
            teardown(eng)
        eos = loaded.tokenizer.eos_token_id
        return Cold(first, toks, gaps, bool(toks) and toks[-1] == eos)


# --------------------------------------------------------------------- runner
def _lcp(a, b) -> int:
    n, m = 0, min(len(a), len(b))
    while n < m and a[n] == b[n]:
        n += 1
    return n


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
        from .calibrate import calibration
        s = self.settings
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
        lcp = max((_lcp(keys, s) for s in self.streams), default=0)
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
        if self.c1 and (first is not None or r.tokens):
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
                    return rec, r                            # the greedy tokens follow other logits
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
        return rec, r


def chunking_tie(lm, tokens, media, r, first, tol: float) -> dict | None:
    """A C1-logits mismatch the model's own instability explains: the cold path, cut where this
    request's forwards were cut (with or without the decode seed's own forward, or once at the
    resume), gives a result within tol of ours (`first`, float32) that itself differs by more than
    tol from the cold run's one forward (run here, not taken from a cold cache: a cold answer that
    is itself wrong, as test_calibration plants, must still fail). The cold path: mlx-lm's stock
    caches for text; for a prompt with media, a fresh Engine's own forwards (fuzz.calibrate.
    media_cut_forward), whose one-forward run is the media prompt's cold answer.
    deepseek_v32's indexer keeps the top-k keys by score, so float noise from where a forward is cut
    (1e-6) can swap a key at the top-k boundary and move the logits by 0.25 with stock caches alone
    (docs/fuzz.md); qwen3next (mixture-of-experts routing) moved one media prompt's logits by
    7.2e-5, over its tol of 6.7e-5, between one forward and chunks of 1 (the model machine's nightly
    run, stateful_tests/test_model_machine.py). For a model whose logits are continuous in that
    noise no cut differs from one forward by more than tol, so this never applies. None otherwise."""
    from .calibrate import cut_forward, media_cut_forward

    n, resume = len(tokens), r.stats.resumed
    if media:
        run = lambda cuts: np.array(media_cut_forward(lm, tokens, media, cuts))
        one = run([0, n - 1, n])
    else:
        run = lambda cuts: np.array(cut_forward(lm, tokens, cuts, stock=True))
        one = run([0, n])
    own = _cuts(r, n)
    ways = [own, [c for c in own if c != n - 1] if n - 1 > resume else own, sorted({0, resume, n})]
    for cuts in ways:
        cut = run(cuts)
        ours, model = float(np.abs(first - cut).max()), float(np.abs(one - cut).max())
        if ours <= tol < model:
            return {"cuts": cuts, "ours_vs_cut": ours, "one_forward_vs_cut": model}
    return None


def _cuts(r, n: int) -> list:
    """The forward boundaries of a request's own prefill: its resume, its chunks' ends, the seed."""
    return sorted({0, r.stats.resumed, n - 1, n} | {q for _, q in r.stats.chunks})


def _rule_sig(msg: str) -> str:
    import re
    rules = sorted(set(re.findall(r"\b([TSMPGEAC][0-9])(?: at |:)", msg)))   # "E3 at node …", "G1: …"
    return "rule:" + (",".join(rules) if rules else "assert")
