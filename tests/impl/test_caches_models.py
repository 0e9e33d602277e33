"""C1 on real models: whatever snapshots a restore uses, the next forward equals a cold prefill.

For random token streams, random capture offsets (interior to a forward for KV-only models, at
forward cuts where whole-state layers need them), random split/merge sequences over the captured
segments, optional divergent writes or a free() that materialise the lazy views, and a restore into
either the same or a fresh cache set, the logits of the next forward must equal those of a cold
prefill through mlx-lm's stock caches, and greedy continuations must match.

Exact where the same-schedule replay is (REFERENCE C1; fuzz/replay.py measures it per model, device
and dtype): the cold run forwards the same chunks the state was built by, on stock caches, trims to
the target and forwards the next token; the logits must be bit-identical and the greedy tokens equal.
Elsewhere a restored state built by other chunkings than a one-shot cold prefill differs in rounding,
and the bound is the C1 tolerance calibrated for the model on this device and dtype
(fuzz/calibrate.py); greedy tokens must then match unless the cold top-2 margin at the first
divergence is below the calibrated tie gap (a float tie, which no tolerance can order).
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz.calibrate import tie_gap, tolerance
from fuzz.replay import Fwd, Replayer, Source, Splice, Step, replay_is_exact
from impl.caches import forward, live_snapshots, make_layer_caches

# C1 bound and tie gap: calibrated per model, device and dtype (fuzz/calibrate.py)
MODELS = ["gemma3", "qwen3next", "mamba2", "mamba", "falcon_h1", "deepseek_v32", "llama4",
          pytest.param("smollm2", marks=pytest.mark.slow)]
MAX_DIFF: dict[str, float] = {}


def _examples(name):
    share = 0.05 if name == "smollm2" else 0.2
    return max(4, int(settings.default.max_examples * share))


def _close_all(snaps):
    for s in snaps:
        if s is not None and not s.closed:
            s.release()


def _greedy_match(ours, cold, cold_logits_seq, tie):
    for i, (a, b) in enumerate(zip(ours, cold)):
        if a != b:
            top2 = mx.topk(cold_logits_seq[i], 2)
            margin = float(mx.abs(top2[0] - top2[1]).item())
            assert margin < tie, f"greedy diverged at step {i}: {ours} vs {cold} (margin {margin})"
            return


def _as_restored_cold(replayer, stream, bounds, T):
    """(stock caches, logits of token T) for the same chunks `bounds` on stock caches, at T as a restore
    leaves the state: KV rows [0, T), whole-state layers as a snapshot restores them (a wrapped sliding
    window in temporal order: the ring's slot order is the order attention sums in)."""
    src = Source(tuple(stream), (), tuple(stream))
    built = Fwd(None, 0, tuple(Step(a, b, src) for a, b in zip(bounds, bounds[1:])))
    stock = replayer.state_at(Splice(((built, 0, T),), built, T, restored=True), T)
    return stock, replayer.step(stock, T, Step(T, T + 1, src))


def _greedy_stock_with_logits(model, cache, logits, k):
    toks, seq = [], []
    for _ in range(k):
        seq.append(logits)
        t = int(mx.argmax(logits).item())
        toks.append(t)
        logits = model(mx.array([[t]]), cache=cache)[0, -1]
    return toks, seq


@pytest.mark.parametrize("name", MODELS)
def test_restore_equals_cold_prefill(name, models, oracle):
    lm = models[name]
    model = lm.model
    whole_state = any(k in ("windowed", "recurrent") for k in lm.layer_kinds)
    exact = replay_is_exact(lm)
    replayer = Replayer(lm)
    max_len = 20 if name == "smollm2" else 40

    @settings(max_examples=_examples(name))
    @given(data=st.data())
    def run(data):
        base_live = live_snapshots()
        L = data.draw(st.integers(6, max_len), label="L")
        stream = data.draw(st.lists(st.integers(0, lm.vocab_size - 1), min_size=L + 1, max_size=L + 1), label="stream")
        offsets = sorted(data.draw(st.sets(st.integers(1, L - 1), min_size=1, max_size=4), label="captures"))
        cuts = set(data.draw(st.sets(st.integers(1, L - 1), max_size=4), label="cuts"))
        if whole_state:
            cuts |= set(offsets)
        bounds = [0] + sorted(cuts) + [L]

        caches = make_layer_caches(model)
        layers = [i for i, c in enumerate(caches) if c is not None]
        snaps = []
        try:
            for i in layers:
                caches[i].prepare_captures(offsets)
            for a, b in zip(bounds, bounds[1:]):
                forward(model, stream[a:b], caches)
            per_layer = {}
            for i in layers:
                caps = caches[i].take_captures()
                assert len(caps) == len(offsets)
                assert all(s is not None for s in caps), "every capture offset was crossed"
                caps.append(caches[i].snapshot(offsets[-1]))  # page-out of the last segment
                per_layer[i] = caps
                snaps += caps
            # segments: [start, end, {layer: snapshot}]
            ends = offsets + [L]
            segs = [[s, e, {i: per_layer[i][j] for i in layers}] for j, (s, e) in enumerate(zip([0] + offsets, ends))]
            for i in layers:
                for seg in segs:
                    snap = seg[2][i]
                    if snap.kind == "kv":
                        assert (snap.start, snap.end) == (seg[0], seg[1]) and snap.lazy  # S1
                    else:
                        assert snap.end == seg[1]  # S2

            # random split / merge sequence
            for _ in range(data.draw(st.integers(0, 4), label="n_ops")):
                j = data.draw(st.integers(0, len(segs) - 1))
                if data.draw(st.booleans(), label="split") and segs[j][1] - segs[j][0] >= 2:
                    s, e, m = segs[j]
                    at = data.draw(st.integers(s + 1, e - 1), label="at")
                    head, tail = {}, {}
                    for i in layers:
                        head[i], tail[i] = caches[i].split(m[i], at)
                        snaps += [head[i], tail[i]]
                    segs[j : j + 1] = [[s, at, head], [at, e, tail]]
                elif j + 1 < len(segs):
                    (s, _, ma), (_, e, mb) = segs[j], segs[j + 1]
                    merged = {i: caches[i].merge_snapshots(ma[i], mb[i]) for i in layers}
                    snaps += list(merged.values())
                    segs[j : j + 2] = [[s, e, merged]]

            # optionally overwrite the live slots (materialises overlapping views) or free them
            diverge = data.draw(st.sampled_from(["none", "rewrite", "free"]), label="diverge")
            if diverge == "rewrite":
                n = data.draw(st.integers(1, L), label="rewrite_len")
                for i in layers:
                    assert caches[i].restore(None, 0)
                forward(model, [(t * 7 + 3) % lm.vocab_size for t in stream[:n]], caches)
            elif diverge == "free":
                for i in layers:
                    caches[i].free()
                assert not any(s is not None and not s.closed and s.lazy for s in snaps)

            # pick a target and restore the path to it, into the same or a fresh cache set
            candidates = []
            for j, (s, e, m) in enumerate(segs):
                if not whole_state or all(m[i] is not None for i in layers if caches[i].kind != "kv"):
                    candidates.append((j, e))
                if not whole_state:
                    candidates += [(j, t) for t in range(s + 1, e)]
            j, T = data.draw(st.sampled_from(candidates), label="target")
            target = caches if data.draw(st.booleans(), label="same_caches") else make_layer_caches(model)
            for i in layers:
                c = target[i]
                if c.kind == "kv":
                    assert c.restore(None, 0)
                    for s, e, m in segs[: j + 1]:
                        assert c.restore(m[i], min(e, T)), (i, s, e, T)
                else:
                    assert c.restore(segs[j][2][i], T)
                assert c.offset == T

            ours = forward(model, stream[T : T + 1], target)[0, -1]
            k = 3
            if exact:            # the same chunks on stock caches, trimmed to T: bit-identical
                stock, cold = _as_restored_cold(replayer, stream, bounds, T)
                diff = float(mx.abs(ours.astype(mx.float32) - cold).max().item())
                MAX_DIFF[name] = max(MAX_DIFF.get(name, 0.0), diff)
                assert mx.array_equal(ours.astype(mx.float32), cold).item(), \
                    f"{name}: restored vs same-schedule cold logits differ by {diff} (exact C1)"
                cold_toks, _ = _greedy_stock_with_logits(model, stock, cold, k)
                assert oracle.greedy_ours(model, target, ours, k) == cold_toks, "greedy tokens (exact C1)"
            else:
                cold, stock = oracle.cold_logits(model, stream[: T + 1])
                diff = float(mx.abs(ours - cold).max().item())
                MAX_DIFF[name] = max(MAX_DIFF.get(name, 0.0), diff)
                assert diff <= tolerance(lm), f"{name}: restored vs cold logits differ by {diff}"
                cold_toks, cold_seq = _greedy_stock_with_logits(model, stock, cold, k)
                our_toks = oracle.greedy_ours(model, target, ours, k)
                _greedy_match(our_toks, cold_toks, cold_seq, tie_gap(lm))
        finally:
            _close_all(snaps)
            for c in caches:
                if c is not None:
                    c.free()
        assert live_snapshots() == base_live, "A2: snapshots leaked"

    run()
    print(f"\n{name}: largest restored-vs-cold logits difference {MAX_DIFF.get(name, 0.0):.3g}")


def test_a_wrapped_window_is_judged_as_its_restore_leaves_it(models):
    """The case the random test once judged against the wrong stock state (gemma3, window 8): forwards
    [0, 1), [1, 8), [8, 9) wrap the window with a one-token write, which rotates the ring in place; a
    restore from the snapshot at 9 holds the same rows in temporal order. Attention sums in slot order,
    so exact C1 compares with the stock state as a restore leaves it (Splice restored=True)."""
    lm = models["gemma3"]
    if not replay_is_exact(lm):
        pytest.skip("same-schedule replays are not bit-identical here: C1 is calibrated")
    model, L, stream = lm.model, 9, [0] * 10
    bounds = [0, 1, 8, L]
    caches = make_layer_caches(model)
    layers = [i for i, c in enumerate(caches) if c is not None]
    assert "windowed" in {caches[i].kind for i in layers}
    for i in layers:
        caches[i].prepare_captures([1])
    for a, b in zip(bounds, bounds[1:]):
        forward(model, stream[a:b], caches)
    segs = {i: caches[i].take_captures() + [caches[i].snapshot(1)] for i in layers}
    target = make_layer_caches(model)
    for i in layers:
        c = target[i]
        if c.kind == "kv":
            assert c.restore(None, 0) and c.restore(segs[i][0], 1) and c.restore(segs[i][1], L)
        else:
            assert c.restore(segs[i][1], L)
    ours = forward(model, stream[L:], target)[0, -1].astype(mx.float32)
    _, cold = _as_restored_cold(Replayer(lm), stream, bounds, L)
    assert mx.array_equal(ours, cold).item(), \
        f"restored vs as-restored same-schedule logits differ by {float(mx.abs(ours - cold).max().item())}"
    _close_all([s for i in layers for s in segs[i]])
    for c in caches + target:
        if c is not None:
            c.free()
