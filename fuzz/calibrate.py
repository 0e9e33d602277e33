"""The C1 tolerance, calibrated per (model, device, dtype) from the cold path's own noise: the oracle
wherever same-schedule replays are not bit-identical (fuzz/replay.py judges C1 exactly elsewhere).

REFERENCE C1: a restored state must give the same next logits as a cold prefill "to floating-point
tolerance", and that tolerance is a property of the model, the device and the dtype, not a constant:
on the CPU in float32 chunking moves logits by < 1e-4 (by an amount that depends on the BLAS kernels
the CPU selects), on MLX's CUDA backend with TF32 matmuls by up to 6e-2, in half precision by more.

Noise: for fixed probe prompts P (random token ids, fixed seeds; several lengths per device below),
the last-position logits of one forward of all of P (mlx-lm's stock caches: the fuzz oracle's cold
run) against the same prompt prefilled the ways the engine prefills it, on fresh caches (no trie,
no restore): chunk 16 cut at the capture interval 32 and 4 before the end (the fuzz defaults),
chunk 3, chunk 64 (the engine default), a single resume cut at n/2 and one at a seeded random cut,
each with the last token alone (the decode seed), through our layer caches (impl.caches), and
chunk 16 through mlx-lm's stock caches. Each (prompt, chunking) is one sample.

    noise = max over the N samples of max_i |logits_chunked_i - logits_one_forward_i|
    scale = max over probes of max_i |logits_one_forward_i|
    tol   = max(K * noise, FLOOR * eps(dtype) * scale)        K = 8 (16 under TF32), FLOOR = 2
    tie   = max(TIE_MIN, 2 * tol)                             TIE_MIN = 1e-3

Confidence: the largest of N samples exceeds the noise distribution's p-quantile with probability
1 - p^N (order statistics; N >= 30 gives 95 % confidence in the 0.9-quantile, `Calibration.
confidence`); K then covers the tail beyond it and the longer prompts and other cuts the fuzz
sees: on the CPU in float32 the largest difference the test suite and the campaign ever measured
was ~1.5x the calibrated noise. TF32's error is heavy-tailed: on the H200 (2026-12-03) SmolLM2's
probes showed 0.021 while the suite's conversation property once saw 0.283 (13.5x; 1,820 campaign
requests stayed under 8x), so K_TF32 = 16. The floor, two units in the last place of the largest
logit, covers models whose chunking is bit-exact (noise 0, e.g. half precision on the CPU). eps is
the activations' dtype (float32 for q4). A greedy token may differ from the cold run only where the
cold top-2 gap is below `tie`: noise of at most tol on each logit cannot swap a wider gap.

A new platform announces itself: `announce(cal)` names a calibration whose noise lies far outside
what docs/platform.md records for the known platforms (KNOWN_NOISE), in the fuzz report and as a
warning in the test output, instead of failing on it.

The planted wrong states of fuzz/planted.py must exceed tol by a wide margin;
`python -m fuzz.calibrate_report --report DIR` measures both and writes the table (docs/fuzz.md).
Calibrations are cached per (model, device, dtype) for the process.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import mlx.core as mx
import numpy as np

K = 8.0
K_TF32 = 16.0
FLOOR = 2
TIE_MIN = 1e-3
EPS = {"float32": 2.0 ** -23, "bfloat16": 2.0 ** -7, "float16": 2.0 ** -10, "q4": 2.0 ** -23}
# probe prompt lengths: SmolLM2 is ~50x slower than the small hybrids on the CPU; 6 samples a length
LENGTHS = {("cpu", "smollm2"): (24, 40, 57, 73, 96), ("cpu", None): (23, 48, 61, 96, 131, 160),
           ("gpu", None): (60, 96, 131, 256, 333, 480)}
QUANTILE = 0.9
# the largest C1 chunking noise docs/platform.md records per (backend, dtype) on the known platforms:
# CPU float32 (OpenBLAS Haswell/Zen/Cooperlake kernels and the reference BLAS), the H100/H200 with TF32
# on (up to 6e-2) and off (8.5e-5); a calibration 10x beyond (or a CPU noise of 0 where chunking is
# not exact) is a platform nobody has measured yet
KNOWN_NOISE = {("cpu", "float32"): 2e-4, ("cpu", "bfloat16"): 0.5, ("cpu", "float16"): 0.1,
               ("cpu", "q4"): 2e-4, ("gpu", "float32"): 6e-2, ("gpu", "bfloat16"): 1.0,
               ("gpu", "float16"): 0.2, ("gpu", "q4"): 0.2}
NEW_PLATFORM_FACTOR = 10.0


def device_key() -> str:
    """'cpu', or 'gpu:<name>' with '+tf32' when MLX's CUDA backend runs float32 matmuls in TF32
    (its default; MLX_ENABLE_TF32=0 turns it off)."""
    d = mx.default_device()
    if d.type == mx.cpu:
        return "cpu"
    try:
        name = str(mx.device_info().get("device_name", "gpu")).replace(" ", "-")
    except Exception:
        name = "gpu"
    cuda = False
    try:
        cuda = bool(mx.cuda.is_available())
    except Exception:
        pass
    tf32 = cuda and os.environ.get("MLX_ENABLE_TF32", "1") != "0"
    return f"gpu:{name}" + ("+tf32" if tf32 else "")


@dataclass
class Calibration:
    model: str
    device: str
    dtype: str
    noise: float
    scale: float
    tol: float
    tie: float
    k: float = K
    floor: float = 0.0
    seconds: float = 0.0
    probes: list = field(default_factory=list)     # [n, chunking, diff]

    @property
    def confidence(self) -> float:
        """The probability that the largest sample exceeds the noise's QUANTILE-quantile: 1 - q^N."""
        return 1.0 - QUANTILE ** len(self.probes)

    def as_dict(self) -> dict:
        return {**asdict(self), "samples": len(self.probes), "confidence": round(self.confidence, 4)}


def announce(cal: Calibration) -> str | None:
    """A plain sentence when this calibration's noise is far outside the known platforms' (see
    KNOWN_NOISE), else None."""
    kind = "cpu" if cal.device == "cpu" else "gpu"
    known = KNOWN_NOISE.get((kind, cal.dtype))
    if known is None or cal.noise <= NEW_PLATFORM_FACTOR * known:
        return None
    return (f"new platform: {cal.model} {cal.dtype} on {cal.device} shows chunking noise {cal.noise:.3g}, "
            f"{cal.noise / known:.0f}x the largest docs/platform.md records for known {kind} platforms "
            f"({known:.3g}); C1 here is judged by a tolerance calibrated from this machine's own noise "
            f"({cal.tol:.3g}); please report the platform (python -m fuzz.calibrate_report)")


_CAL: dict = {}


def chunkings(n: int) -> dict:
    """name -> the forward boundaries [0, c1, ..., n-1, n] the engine would cut a prompt of n at."""
    def chunked(size, interval=0, near_end=0):
        cuts = set(range(0, n - 1, size)) | {n - 1, n}
        if interval:
            cuts |= set(range(interval, n - 1, interval))
        if near_end and n - 1 - near_end > 0:
            cuts.add(n - 1 - near_end)
        return sorted(cuts)
    cut = 1 + int(np.random.default_rng(n).integers(0, max(1, n - 2)))
    return {"chunk16+i32+e4": chunked(16, 32, 4), "chunk3": chunked(3), "chunk64+e4": chunked(64, 0, 4),
            "resume@n/2": sorted({0, n // 2, n - 1, n}), "resume@random": sorted({0, cut, n - 1, n})}


def probe_tokens(lm, n: int) -> list:
    rng = np.random.default_rng(1000 + n)
    return rng.integers(1, lm.vocab_size, n).tolist()


def one_forward(lm, tokens) -> mx.array:
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(lm.model)
    out = lm.model(mx.array([list(tokens)]), cache=cache)[0, -1].astype(mx.float32)
    mx.eval(out)
    return out


def cut_forward(lm, tokens, cuts, stock: bool = False) -> mx.array:
    """Forwards tokens[a:b] for consecutive cuts on fresh caches (ours, or mlx-lm's stock caches)."""
    if stock:
        from mlx_lm.models.cache import make_prompt_cache
        caches = make_prompt_cache(lm.model)
        run = lambda x: lm.model(x, cache=caches)
    else:
        from impl.caches.factory import forward
        caches = lm.make_caches()
        run = lambda x: forward(lm.model, x, caches)
    for a, b in zip(cuts, cuts[1:]):
        out = run(mx.array([list(tokens[a:b])]))
        mx.eval(out)
    res = out[0, -1].astype(mx.float32)
    mx.eval(res)
    if not stock:
        for c in caches:
            if c is not None:
                c.free()
    return res


def media_cut_forward(lm, tokens, media, cuts) -> mx.array:
    """cut_forward for a prompt with media items, which mlx-lm's stock caches cannot run (no
    features, no bidirectional mask): a fresh Engine's own forwards over tokens[a:b] for consecutive
    cuts (never strictly inside a non-causal item, M1), with no prefix cache; the last position's
    logits. With cuts [0, n-1, n] it is the oracle's cold run of a media prompt."""
    from impl.engine import Engine
    from impl.media import noncausal_spans

    e = Engine(lm, capture_interval=0, near_end=0)
    spans = noncausal_spans(media)
    for a, b in zip(cuts, cuts[1:]):
        out = e._forward(tokens[a:b], a, media, spans, logits=True, views=False)
    res = out[0, -1].astype(mx.float32)
    mx.eval(res)
    for c in e.caches:
        if c is not None:
            c.free()
    return res


def measure(lm, lengths=None) -> Calibration:
    t0 = time.perf_counter()
    dev = device_key()
    kind = "cpu" if dev == "cpu" else "gpu"
    lengths = lengths or LENGTHS.get((kind, lm.name)) or LENGTHS[(kind, None)]
    if kind == "cpu" and getattr(lm, "dtype", "float32") in ("bfloat16", "float16"):
        lengths = lengths[:2]      # half precision is slow on the CPU backend (PLATFORM.md)
    noise, scale, probes = 0.0, 0.0, []
    for n in lengths:
        toks = probe_tokens(lm, n)
        ref = one_forward(lm, toks)
        scale = max(scale, float(mx.abs(ref).max().item()))
        ways = [(name, cuts, False) for name, cuts in chunkings(n).items()]
        ways.append(("stock chunk16", chunkings(n)["chunk16+i32+e4"], True))
        for name, cuts, stock in ways:
            d = float(mx.abs(cut_forward(lm, toks, cuts, stock) - ref).max().item())
            probes.append([n, name, d])
            noise = max(noise, d)
    dtype = getattr(lm, "dtype", "float32")
    floor = FLOOR * EPS[dtype] * scale
    k = K_TF32 if "+tf32" in dev else K
    tol = max(k * noise, floor)
    return Calibration(lm.name, dev, dtype, noise, scale, tol, max(TIE_MIN, 2 * tol), k, floor,
                       round(time.perf_counter() - t0, 2), probes)


def calibration(lm) -> Calibration:
    key = (lm.name, device_key(), getattr(lm, "dtype", "float32"))
    if key not in _CAL:
        _CAL[key] = cal = measure(lm)
        note = announce(cal)
        if note:
            import warnings
            warnings.warn(note, stacklevel=2)
    return _CAL[key]


@contextmanager
def recheck_device():
    """The float32 reference device of the stronger oracle: the CPU when this device runs float32
    matmuls in TF32, else this device (half precision rechecks on the float32 model there)."""
    old = mx.default_device()
    mx.set_default_device(mx.cpu if "+tf32" in device_key() else old)
    try:
        yield mx.default_device()
    finally:
        mx.set_default_device(old)


def needs_recheck(lm) -> bool:
    return getattr(lm, "dtype", "float32") in ("bfloat16", "float16") or "+tf32" in device_key()


def tolerance(lm) -> float:
    return calibration(lm).tol


def tie_gap(lm) -> float:
    return calibration(lm).tie
