"""Shared helpers of the Engine tests (tests/impl/test_engine_*.py): cold oracles, C1 checks,
state fingerprints, example budgets. Also the oracle's own sanity tests.

C1 oracles (REFERENCE C1: whatever `begin` restores, the next forward and greedy decoding equal a run
with no cache at all):
  - text-only prompts: mlx-lm's OWN stock caches (`make_prompt_cache(model)`), one forward of the
    whole prompt, then greedy single-token steps. Nothing of impl/caches or the prefix cache is used.
  - prompts with media items: the stock caches cannot build the bidirectional mask of a non-causal
    item and the model's embedding does not know the item's features, so the oracle is our own layer
    caches with NO prefix cache (a fresh Engine whose trie is never used): one forward of the whole
    prompt through `Engine._forward` (features patched into the embedding, spans into the masks),
    then greedy single-token steps. Its one-forward, no-restore path is exactly what C1 calls a cold
    prefill; `test_oracle_media_matches_stock_without_media` ties it to the stock oracle.

Exact where it can be: an engine wrapped by `judged(engine)` has every request judged by the exact
oracle (fuzz/replay.py) as it runs, against a cold replay on stock caches of the forwards that built
its restored state; where same-schedule replays are bit-identical on this backend, `assert_c1` then
asserts that verdict (bit-identical logits, greedy tokens equal to the replay's argmax) and nothing
else. Elsewhere, and for engines not wrapped, the cold oracles above with the tolerance below.

Tolerance: TOL[name] is the C1 tolerance calibrated for the model as the tests load it, on this
device and dtype (fuzz/calibrate.py: 8 x the cold path's own chunking noise, floored at 2 ulp of
the largest logit; on the CPU in float32 about 1.5e-4 gemma3, 6e-5 qwen3next, 2.5e-5 mamba2, 4e-4
SmolLM2). Measured here over the conversation property before calibration (float32, CPU, OpenBLAS):
SmolLM2 ~5e-5, gemma3 ~5e-5, qwen3next ~4e-5, mamba2 ~5e-6; every real restore error seen here is
>= 1e-2 (a split non-causal item: 0.1-3.9, the windowed live-resume bug: ~3.5, the same-fold gap:
0.1-3.5), and tests/test_calibration.py shows each planted wrong state beyond 5 x TOL. Greedy tokens
must be identical; the only excuse is a float tie: the oracle's top-2 margin at the first divergence
below the calibrated tie gap (max(1e-3, 2 x TOL)).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from hypothesis import settings

from fuzz.calibrate import tie_gap, tolerance
from fuzz.replayer import host_bits
from impl.engine import Engine, _arrays
from impl.media import noncausal_spans, validate_media
from impl.trie import walk

class _Calibrated:
    """TOL[name]: the calibrated C1 tolerance of `name` as the tests load it (impl.models.load)."""

    def __getitem__(self, name: str) -> float:
        from impl.models import load
        return tolerance(load(name))


TOL = _Calibrated()
TIE = 1e-3              # the smallest tie gap; the calibrated one is tie_gap(lm)
UNLIMITED = 1 << 62


def examples(share: float, floor: int = 2) -> int:
    """A share of the active Hypothesis profile's max_examples (ci 60, dev 100, nightly 5000)."""
    return max(floor, int(settings.default.max_examples * share))


def _log(kind: str, **fields) -> None:
    """Append measured figures to $ENGINE_TEST_LOG (JSON lines), for the report; no-op otherwise."""
    path = os.environ.get("ENGINE_TEST_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"kind": kind, **fields}) + "\n")


# ----------------------------------------------------------------------------------- oracles
@dataclass
class Cold:
    first_logits: mx.array
    tokens: list
    step_logits: list       # the logits each greedy token was taken from


def cold_stock(lm, tokens, k: int) -> Cold:
    """mlx-lm stock caches: one forward of the whole prompt, then k greedy tokens."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(lm.model)
    logits = lm.model(mx.array([list(map(int, tokens))]), cache=cache)[0, -1]
    mx.eval(logits)
    first, out, seq = logits, [], []
    for i in range(k):
        seq.append(logits)
        t = int(mx.argmax(logits).item())
        out.append(t)
        if i + 1 < k:
            logits = lm.model(mx.array([[t]]), cache=cache)[0, -1]
            mx.eval(logits)
    return Cold(first, out, seq)


def cold_ours(lm, tokens, media, k: int, split_at: int | None = None) -> Cold:
    """Our layer caches with no prefix cache: one forward of the whole prompt (or two, cut at
    `split_at`, to show what a split media item does), then k greedy tokens."""
    e = Engine(lm, capture_interval=0, near_end=0)
    media = validate_media(media, len(tokens))
    sp = noncausal_spans(media)
    cuts = [0] + ([split_at] if split_at else []) + [len(tokens)]
    for a, b in zip(cuts, cuts[1:]):
        logits = e._forward(tokens[a:b], a, media, sp)
    logits = logits[0, -1]
    first, out, seq = logits, [], []
    for i in range(k):
        seq.append(logits)
        t = int(mx.argmax(logits).item())
        out.append(t)
        if i + 1 < k:
            logits = e._forward([t], len(tokens) + i, (), [])[0, -1]
    return Cold(first, out, seq)


def cold(lm, tokens, media, k: int) -> Cold:
    return cold_ours(lm, tokens, media, k) if media else cold_stock(lm, tokens, k)


def max_abs(a, b) -> float:
    return float(mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item())


def greedy_agrees(ours: list, oracle: Cold, tie: float = TIE) -> tuple[bool, str]:
    """Identical token for token, or diverging only at a float tie of the oracle (top-2 margin < tie)."""
    for i, (a, b) in enumerate(zip(ours, oracle.tokens)):
        if a != b:
            top2 = mx.topk(oracle.step_logits[i], 2)
            margin = float(mx.abs(top2[0] - top2[1]).item())
            _log("tie", step=i, margin=margin)
            return margin < tie, f"greedy diverged at step {i}: {ours} vs {oracle.tokens} (margin {margin:.3g})"
    if len(ours) != len(oracle.tokens):
        return False, f"{len(ours)} tokens vs the oracle's {len(oracle.tokens)}"
    return True, ""


def judged(engine: Engine) -> Engine:
    """Judge every request of `engine` by the exact C1 oracle as it runs, where same-schedule replays
    are exact here: each Result gets `c1`, the Verdict (fuzz/replay.py). Returns the engine."""
    from fuzz.replay import Replay, replay_is_exact

    if not replay_is_exact(engine.loaded):
        return engine
    replay, generate = Replay(engine.loaded), engine.generate

    def run(prompt, max_tokens=16, media=(), sampler=None, **kw):
        r = generate(prompt, max_tokens, media, **({"sampler": sampler} if sampler else {}), **kw)
        r.c1 = replay.judge(engine.tokens_of(prompt), list(media), r, greedy=sampler is None, engine=engine)
        return r
    engine.generate = run
    return engine


def assert_c1(lm, tokens, media, result, tol: float | None = None, what: str = "") -> float:
    """C1 for one finished request: exactly (bit-identical to the same-schedule cold replay) when its
    engine is `judged`, else first decode logits within tol of the cold oracle's, greedy tokens
    identical. Returns the measured max |Δ|."""
    v = getattr(result, "c1", None)
    if v is not None and v.judged and tol is None:
        assert v.ok, f"C1 {what}: {v.signature}: {v.message}"
        _log("c1", model=lm.name, diff=0.0, media=bool(media), resumed=result.stats.resumed, exact=True)
        return 0.0
    tol = TOL[lm.name] if tol is None else tol
    assert result.first_logits is not None, f"{what}: no first logits"
    oracle = cold(lm, tokens, media, len(result.tokens))
    d = max_abs(result.first_logits, oracle.first_logits)
    _log("c1", model=lm.name, diff=d, media=bool(media), resumed=result.stats.resumed)
    assert d <= tol, (f"C1 {what}: first logits differ from the cold run by {d:.3g} > {tol:g} "
                      f"(resumed at {result.stats.resumed} of {len(tokens)})")
    ok, why = greedy_agrees(result.tokens, oracle, tie_gap(lm))
    assert ok, f"C1 {what}: {why}"
    return d


def assert_stats_consistent(result, n_prompt: int) -> None:
    s = result.stats
    assert s.total == n_prompt
    assert 0 <= s.resumed <= s.matched <= n_prompt - 1, s
    if not result.cancelled:
        assert s.resumed + s.prefilled == n_prompt - 1, s     # everything but the decode seed


# ------------------------------------------------------------------------- state fingerprints
def strip_ages(d):
    """dump_json() without wall-clock ages (they change between two calls)."""
    if isinstance(d, dict):
        return {k: strip_ages(v) for k, v in d.items() if k != "age_s"}
    if isinstance(d, list):
        return [strip_ages(x) for x in d]
    return d


def engine_state(e: Engine) -> dict:
    """Everything a rejected request must leave untouched: the trie (dump_json), the byte counter,
    the live caches (offsets, buffer objects and their contents), the active path and the snapshots."""
    caches = []
    for c in e.caches:
        if c is None:
            caches.append(None)
            continue
        arrays = list(_arrays(c))
        mx.eval(*arrays)
        caches.append({"offset": c.offset, "idx": getattr(c, "_idx", None), "ids": [id(a) for a in arrays],
                       "data": [host_bits(a) for a in arrays]})
    snaps = [(id(n), i, id(s), s.lazy, s.size) for n in walk(e.pc.root) for i, s in enumerate(n.snaps)
             if s is not None]
    return {"dump": strip_ages(e.dump_json()), "counter": e.pc.counter, "paged_out": e.memory()["paged_out"],
            "budget": e.pc.budget, "seq": list(e.pc.seq), "path": [id(n) for n in e.pc.path],
            "clock": e.pc.clock, "request": e.pc.request, "snaps": snaps, "caches": caches}


def assert_same_state(before: dict, after: dict) -> None:
    for k in before:
        if k == "caches":
            continue
        assert before[k] == after[k], f"{k} changed: {before[k]!r} -> {after[k]!r}"
    for i, (a, b) in enumerate(zip(before["caches"], after["caches"])):
        if a is None:
            assert b is None
            continue
        assert (a["offset"], a["idx"], a["ids"]) == (b["offset"], b["idx"], b["ids"]), f"layer {i} cache changed"
        assert all(np.array_equal(x, y) for x, y in zip(a["data"], b["data"])), f"layer {i} cache contents changed"


# --------------------------------------------------------------------------------- trie views
def nodes(e: Engine) -> list:
    """Flattened dump_json nodes (root excluded), depth first: (start, end, user, active, kinds)."""
    out = []

    def visit(n):
        for c in n["children"]:
            kinds = "".join("-" if s is None else s["kind"][0] for s in c["snapshots"])
            out.append((c["start"], c["end"], c["user"], c["active"], kinds))
            visit(c)
    visit(e.dump_json()["root"])
    return out


def node_ends(e: Engine) -> list:
    return sorted({n[1] for n in nodes(e)})


class ForwardSpy:
    """Records every Engine forward as (start, end)."""

    def __init__(self, engine: Engine):
        self.calls = []
        inner = engine._forward

        def spy(tokens, p, media, spans, **kw):
            self.calls.append((p, p + len(tokens)))
            return inner(tokens, p, media, spans, **kw)
        engine._forward = spy


# ------------------------------------------------------------------------- the oracle's tests
def test_oracle_media_matches_stock_without_media(models):
    """Without media, the media oracle (our caches, no prefix cache) equals the stock oracle."""
    for name in ("gemma3", "qwen3next", "mamba2"):
        lm = models[name]
        toks = np.random.default_rng(1).integers(0, lm.vocab_size, 30).tolist()
        a, b = cold_stock(lm, toks, 4), cold_ours(lm, toks, [], 4)
        assert max_abs(a.first_logits, b.first_logits) <= TOL[name] / 10
        assert a.tokens == b.tokens


def test_oracle_sees_fresh_engine_equal(models):
    """A fresh Engine (empty trie, chunked prefill) passes C1 against both oracles."""
    lm = models["qwen3next"]
    toks = np.random.default_rng(2).integers(0, lm.vocab_size, 50).tolist()
    r = Engine(lm, chunk_size=7, capture_interval=16, check_rules=True).generate(toks, 5, stop_at_eos=False)
    assert_c1(lm, toks, [], r)
