"""The exact C1 oracle (fuzz/replay.py): bit-identical where it must be, and blind to nothing.

- Same-schedule replays are bit-identical on this backend, and impl's caches compute exactly what
  mlx-lm's stock caches do for the same forwards (the property the exact oracle rests on; a backend
  whose own kernels are not deterministic for equal shapes is skipped with the reason, and C1 falls
  back to the calibrated tolerance there).
- A restored state one unit in the last place away from the legitimate one fails C1, and so does one
  row of one layer taken from a sibling branch: magnitudes no tolerance separates from noise.
- A state spliced from several requests' forwards, as begin builds it (the live rows up to where the
  prompt leaves the previous request, paged-in rows and a restored window after), is judged exact.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import fuzz.replay as replay_mod
from fuzz.calibrate import device_key, tolerance
from fuzz.replay import Replay, Replayer, Source, Splice, Step, _impl_rows, _measure_exact
from fuzz.replayer import _whole
from impl.engine import Engine
from impl.models import load

CHEAP = ["gemma3", "qwen3next", "mamba2", "falcon_h1", "deepseek_v32", "llama4"]


def _stock_twice_equal(lm) -> bool:
    toks = list(range(200, 261))
    src = Source(tuple(toks), (), tuple(toks))
    sched = (Step(0, 7, src), Step(7, 40, src), Step(40, 60, src), Step(60, 61, src))
    logits = []
    for rp in (Replayer(lm), Replayer(lm)):
        caches, off = rp.fresh(), 0
        for s in sched:
            out = rp.step(caches, off, s)
            off = s.b
        logits.append(np.array(out))
    return np.array_equal(logits[0], logits[1])


@pytest.mark.parametrize("name", CHEAP)
def test_same_schedule_replays_are_exact_and_impl_matches_stock(name):
    lm = load(name)
    if not _stock_twice_equal(lm):
        pytest.skip(f"{name}: mlx-lm's stock caches give different logits for the same forwards twice on "
                    "this backend; C1 is judged by the calibrated tolerance here (fuzz/calibrate.py)")
    assert _measure_exact(lm) is True, f"{name}: {_measure_exact(lm)}"


def _engine(lm):
    return Engine(lm, 1 << 40, chunk_size=16, capture_interval=32, near_end=4, check_rules=True)


def test_one_ulp_in_one_restored_row_fails_exact_c1():
    lm = load("qwen3next")
    eng, judge = _engine(lm), Replay(lm)
    rng = np.random.default_rng(11)
    first = rng.integers(1, lm.vocab_size, 40).tolist()
    r = eng.generate(first, max_tokens=3, stop_at_eos=False)
    assert judge.judge(first, [], r).ok
    follow = first + r.tokens[:-1] + rng.integers(1, lm.vocab_size, 12).tolist()
    # one K row of the first full-attention layer, one ulp away, in the live cache the next request resumes
    # on. Under TF32 (MLX's CUDA default) a matmul reads float32 inputs with a 10-bit mantissa, so no
    # logit can show a change below 2^13 float32 ulps: the plant is one TF32 ulp there, the arithmetic's own
    # resolution (the engine's rows below show the single float32 ulp all the same).
    # In bfloat16 (7 mantissa bits) the plant is one bfloat16 ulp, the stored precision.
    kv = next(c for c in eng.caches if c is not None and c.kind == "kv")
    stored = kv.keys.dtype
    row = np.array(kv.keys[:, :, 20:21, :].astype(mx.float32))
    tf32 = device_key().endswith("+tf32")
    mantissa = {mx.bfloat16: 7, mx.float16: 10}.get(stored, 10 if tf32 else 23)
    ulp = np.spacing(np.abs(row)) * 2 ** (23 - mantissa)
    kv.keys[:, :, 20:21, :] = mx.array(row + ulp).astype(stored)
    r2 = eng.generate(follow, max_tokens=2, stop_at_eos=False)
    assert r2.stats.resumed > 20
    by_logits = Replay(lm)            # the same history, judged from the logits alone (no engine rows)
    by_logits.streams = list(judge.streams)
    v = by_logits.judge(follow, [], r2)
    assert v.judged and not v.ok and v.signature == "C1-exact", v
    # far below any tolerance (under TF32, chunking alone moves logits by 1e-3 to 6e-2): only the exact
    # oracle sees it. In half precision a logit moves by whole ulps of its own (0.03 near 5 in bfloat16),
    # still below the tolerance calibrated for the model in that dtype.
    assert 0 < v.diff < (tolerance(lm) if stored != mx.float32 else 1e-2 if tf32 else 1e-3)
    v = judge.judge(follow, [], r2, engine=eng)       # reading the restored rows names the one planted
    assert not v.ok and "KV rows [20,21)" in v.message, v.message
    for c in eng.caches:
        if c is not None:
            c.free()


def test_a_state_spliced_from_three_requests_is_exact():
    """qwen3next (recurrent + attention): A writes [0, 39) with a boundary at 35; B shares A's first
    24 keys, resumes at 0 (no recurrent state at 24), rewrites [0, 32) in other chunks and is
    cancelled; C shares A's first 39 keys and resumes at A's checkpoint 35: its attention rows
    [0, 24) are B's (the live caches rewound to where C leaves B), [24, 35) and the recurrent state
    are A's (paged in). No single request's forwards built that state; the splice of them did."""
    lm = load("qwen3next")
    eng, judge = _engine(lm), Replay(lm)
    rng = np.random.default_rng(5)
    a = rng.integers(1, lm.vocab_size, 39).tolist()
    ra = eng.generate(a, max_tokens=6, boundaries=[35], stop_at_eos=False)
    assert judge.judge(a, [], ra).ok
    b = a[:24] + rng.integers(1, lm.vocab_size, 64).tolist()
    calls = [0]

    def cancel():
        calls[0] += 1
        return calls[0] > 3
    rb = eng.generate(b, max_tokens=0, cancel=cancel)
    vb = judge.judge(b, [], rb)
    assert not vb.judged and rb.stats.resumed == 0
    c = a + rng.integers(1, lm.vocab_size, 31).tolist()
    rc = eng.generate(c, max_tokens=2, stop_at_eos=False)
    assert rc.stats.resumed == 35
    rows = Replay(lm)                 # the same history, the writers of the rows read from the engine
    rows.streams = list(judge.streams)
    vc = judge.judge(c, [], rc)
    assert vc.ok, vc.message
    resumed_from = judge.streams[-1].states[0].parent
    assert isinstance(resumed_from, Splice) and [(a, b) for _, a, b in resumed_from.kv] == [(0, 24), (24, 35)]
    vr = rows.judge(c, [], rc, engine=eng)
    assert vr.ok, vr.message
    assert [(a, b) for _, a, b in rows.streams[-1].states[0].parent.kv] == [(0, 24), (24, 35)]
    for x in eng.caches:
        if x is not None:
            x.free()


def test_a_cancelled_request_keeps_the_old_writer_of_its_chunked_state(monkeypatch):
    """llama4 (chunked attention, chunk 8, + full KV). The chunked layers can be restored only where a
    forward ended. A writes [0, 40) in one forward from 0; B diverges from A at 6, so its forward is cut
    there and the state at 6 is captured; five turns continue A (their state at 6 replays as A's forward
    trimmed back, other bits); D diverges at 6 too, resumes on B's capture, prefills [6, 22) and is
    cancelled (no logits: its provenance stays a list of candidates); E extends D and resumes at 22,
    its KV rows [6, 8) attending to B's chunked state. B must be among D's candidates, though five
    newer requests passed through 6 (fuzz/corpus/found-llama4-cancelled-resume-on-old-chunked-capture.json).
    With more candidates than MAX_HISTORY, those whose replay computed the rows D left are kept."""
    lm = load("llama4")
    eng, judge = _engine(lm), Replay(lm)
    rng = np.random.default_rng(47)
    fresh = lambda n: rng.integers(1, lm.vocab_size, n).tolist()      # noqa: E731
    s = fresh(6)
    a = s + fresh(34)

    def run(toks, max_tokens=2, cancel=None):
        r = eng.generate(toks, max_tokens=max_tokens, cancel=cancel, stop_at_eos=False)
        v = judge.judge(toks, [], r, engine=eng)
        assert v.ok, v.message
        return r
    ra = run(a)
    rb = run(s + fresh(20))
    assert rb.stats.resumed == 0 and rb.stats.chunks[0] == (0, 6)
    turn, reply = a, ra.tokens[:-1]
    for _ in range(5):
        turn = turn + reply + fresh(5)
        reply = run(turn).tokens[:-1]
    calls = [0]

    def cancel():
        calls[0] += 1
        return calls[0] > 1
    d = s + fresh(30)
    rd = run(d, max_tokens=1, cancel=cancel)
    assert rd.cancelled and rd.stats.resumed == 6 and rd.stats.chunks == ((6, 22),)
    b_state = judge.streams[1].states[0]
    kept = judge.streams[-1].states
    assert any(_whole(st.parent, 6)[0] is b_state for st in kept)
    # more candidates than MAX_HISTORY, B's last: those whose replay computed the rows D left are kept
    ours = _impl_rows(eng, 22)
    monkeypatch.setattr(replay_mod, "MAX_HISTORY", 1)
    for st in judge._unjudged(eng, list(reversed(kept)), 6, 22):
        theirs = judge.run.kv_rows(st, 22)
        assert all(mx.array_equal(k, theirs[p][0]) and mx.array_equal(v, theirs[p][1]) for p, (k, v) in ours.items())
    monkeypatch.undo()
    re_ = run(d + fresh(4))
    assert re_.stats.resumed == 22
    for x in eng.caches:
        if x is not None:
            x.free()
