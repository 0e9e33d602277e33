"""C1's oracle for the mlx-lm target: the same-schedule replay on fresh stock caches, and the
calibrated tolerance kept only where that replay is measured not to be exact.

Invariants: `replay` builds its caches with mlx-lm's own make_prompt_cache and feeds them the recorded
forwards, trims and --kv-bits conversions in order; it never reads the server's caches. A trim that a
stock layer cannot make in full makes the replay inexact (its second result), never silently wrong.
"""
from __future__ import annotations

import mlx.core as mx

from targets.mlx_lm.recorder import own_ops

TOL = 1e-3        # the logprob tolerance's floor (float32 on the CPU); see tolerance()
_TOLS: dict = {}


def tolerance(model) -> float:
    """C1's tolerance for `model` on this device: max(TOL, K x the cold path's own noise), the noise
    being one forward against the same probe prompts cut at several points (REFERENCE C1, calibrated;
    K as fuzz.calibrate: 16 when MLX runs float32 matmuls in TF32, else 8). On the CPU in float32 the
    noise is ~1e-6 and TOL stands; under TF32 it is ~1e-3 and a fixed TOL would cry wolf."""
    key = id(model)
    if key not in _TOLS:
        from mlx_lm.models.cache import make_prompt_cache
        from fuzz.calibrate import K, K_TF32, device_key
        noise = 0.0
        for n in (24, 64):
            toks = [(7 * i + 3) % 97 + 1 for i in range(n)]
            ref = cold_logprobs(model, toks)[-1]
            for cut in (1, n // 3, n // 2, n - 1):
                c = make_prompt_cache(model)
                model(mx.array([toks[:cut]]), cache=c)
                out = model(mx.array([toks[cut:]]), cache=c)[0, -1]
                noise = max(noise, float(mx.abs(out - mx.logsumexp(out) - ref).max()))
        _TOLS[key] = (model, max(TOL, (K_TF32 if "+tf32" in device_key() else K) * noise))
    return _TOLS[key][1]


def cold_logprobs(model, tokens):
    """Logprobs at every position of one cold forward over `tokens` (no cache reused)."""
    from mlx_lm.models.cache import make_prompt_cache
    logits = model(mx.array([list(tokens)]), cache=make_prompt_cache(model))[0]
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


# Layer kinds whose same-schedule replay is measured NOT bit-identical on the batched path (CPU, float32,
# mlx 0.32, mlx-lm 0.32.2; tests/targets/test_mlx_lm_exact.py): BatchRotatingKVCache keeps its ring in
# another order than RotatingKVCache, so attention sums the window's keys in another order (gemma3:
# 1.9e-6 after one resumed request). Every other kind the batched path takes replays with max |d| = 0.
INEXACT_BATCHED = {"RotatingKVCache": "the batched path's BatchRotatingKVCache orders the window otherwise "
                                      "(measured 1.9e-6 on gemma3, CPU float32)"}


def inexact_kinds(d, path: str = "batched") -> list:
    """Why C1 cannot be judged bit for bit on `d`'s model and `path` ([] when it can). The sequential
    path runs the stock caches themselves: its replay is exact for every kind."""
    from mlx_lm.models.cache import make_prompt_cache
    table = INEXACT_BATCHED if path == "batched" else {}
    kinds = set()
    for c in make_prompt_cache(d.model):
        kinds |= {type(x).__name__ for x in getattr(c, "caches", (c,))}
    return [table[k] for k in sorted(kinds) if k in table]


def replay(model, ops):
    """Fresh stock caches (make_prompt_cache) fed `ops` in order: ("fwd", tokens[, quantized layers])
    one forward (the listed layers first turned into QuantizedKVCache, as --kv-bits did in the server),
    ("trim", n) every layer back by n. (logprobs at every position of every forward, by position;
    exact) -- exact False when some layer could not go back by the full n (the result is then not
    the state the schedule describes)."""
    from mlx_lm.models.cache import make_prompt_cache
    cache, outs, pos, exact = make_prompt_cache(model), {}, 0, True
    for op in ops:
        kind, arg = op[0], op[1]
        if kind == "trim":
            if arg:
                for c in cache:
                    if not c.is_trimmable() or c.trim(arg) != arg:
                        exact = False
                pos -= arg
            continue
        for i, group_size, bits in (op[2] if len(op) > 2 else ()):
            if type(cache[i]).__name__ != "QuantizedKVCache":
                cache[i] = cache[i].to_quantized(group_size=group_size, bits=bits)
        logits = model(mx.array([list(arg)]), cache=cache)[0]
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        for j in range(len(arg)):
            outs[pos + j] = lp[j]
        pos += len(arg)
    return outs, exact


def cut_schedule(ops) -> list:
    """`ops` with every trim applied to the forwards themselves: the chunks that cover what is left."""
    chunks = []
    for op in ops:
        kind, arg = op[0], op[1]
        if kind == "fwd":
            chunks.append(list(arg))
            continue
        n = arg
        while n > 0 and chunks:
            k = min(n, len(chunks[-1]))
            chunks[-1] = chunks[-1][:len(chunks[-1]) - k]
            n -= k
            if not chunks[-1]:
                chunks.pop()
    return [("fwd", tuple(c)) for c in chunks]


def compare(res, ref):
    """(max |server - replay| over the generated steps, the step where it is largest, (greedy, replay's
    greedy) at the first step where they differ or None). One evaluation for all steps."""
    keys = [len(res.prompt) - 1 + i for i in range(len(res.logprobs))]
    missing = [i for i, k in enumerate(keys) if k not in ref]
    if missing:
        return float("inf"), missing[0], None
    if not keys:
        return 0.0, 0, None
    ours = mx.stack([x.reshape(-1) for x in res.logprobs])
    theirs = mx.stack([ref[k].reshape(-1) for k in keys])
    diffs, g_ours, g_ref = mx.abs(ours - theirs).max(axis=-1), mx.argmax(ours, axis=-1), mx.argmax(theirs, axis=-1)
    mx.eval(diffs, g_ours, g_ref)
    diff, step = 0.0, 0
    for i, dd in enumerate(diffs.tolist()):
        if dd > diff:
            diff, step = dd, i
    greedy = next(((a, b) for a, b in zip(g_ours.tolist(), g_ref.tolist()) if a != b), None)
    return diff, step, greedy


def _direct_ok(model, res, ops, bound) -> bool:
    """Is the fetched cache itself right? Its copy fed the request's own forwards on stock caches
    against the same-schedule replay (the same bound)."""
    import copy
    if res.fetched is None:
        return True
    cache, outs, pos = copy.deepcopy(res.fetched), {}, res.count
    for op in own_ops(res.count, res.own):
        if op[0] == "trim":
            for c in cache:
                c.trim(op[1])
            pos -= op[1]
            continue
        for i, group_size, bits in op[2]:
            if type(cache[i]).__name__ != "QuantizedKVCache":
                cache[i] = cache[i].to_quantized(group_size=group_size, bits=bits)
        logits = model(mx.array([list(op[1])]), cache=cache)[0, -1]
        pos += len(op[1])
        outs[pos - 1] = logits - mx.logsumexp(logits)
    ref, _ = replay(model, ops)
    return all(k in ref and float(mx.abs(v - ref[k]).max()) <= bound for k, v in outs.items())


def calibrate(model_name: str) -> dict:
    """The cold path's own noise (one forward vs a prompt split in two) and a planted wrong state
    (the prompt shifted by one position; one earlier token changed) on `model_name`: tolerance() must sit far
    between them. (On the small mamba2 a shift by one is invisible in the last logits: its state forgets
    the first tokens; a changed recent token is not.)"""
    from mlx_lm.models.cache import make_prompt_cache
    from targets.mlx_lm import models
    model = models.build(model_name)
    toks = [(7 * i + 3) % models.VOCAB for i in range(24)]
    ref = cold_logprobs(model, toks)[-1]
    c = make_prompt_cache(model)
    model(mx.array([toks[:11]]), cache=c)
    split = model(mx.array([toks[11:]]), cache=c)[0, -1]
    noise = float(mx.abs(split - mx.logsumexp(split) - ref).max())
    shifted = cold_logprobs(model, [1] + toks)[-1]
    changed = cold_logprobs(model, toks[:-2] + [99] + toks[-1:])[-1]
    return {"model": model_name, "noise": noise, "planted_shift": float(mx.abs(shifted - ref).max()),
            "planted_changed": float(mx.abs(changed - ref).max()), "tolerance": tolerance(model)}
