"""Planted wrong states: each is a restore bug a prefix cache could make, built directly on mlx-lm's
stock caches (or, for media, on the engine's forward), then carried to the end of the prompt; its
first logits and greedy tokens are compared with the cold run exactly as the C1 oracle does. The
calibrated tolerance (fuzz/calibrate.py) must flag every one by a wide margin.

Prompt P of n tokens, restore point r (the state is wrong at r, the rest of the prompt is then
evaluated on top of it, as after a resume):
  shift           full-attention K/V rows [0, r) hold rows [1, r+1): positions shifted by one (S1)
  other_conv      every layer's state at r comes from another conversation sharing P[:r/2] (a hit
                  on the wrong branch; KV from another conversation)
  stale_window    sliding-window layers hold their window from 3 tokens earlier (S2, the windowed
                  live-resume bug)
  recurrent_off   recurrent layers hold their state from r-1 (a whole-state snapshot from the wrong
                  offset, S2/S3)
  media_split     a non-causal media item evaluated in two forwards (M1), on the engine's forward
  one_row         one K/V row (the last before r) of the last full-attention layer written in another
                  conversation: the same token at that position, another first token (a node
                  boundary off by one onto a sibling branch); its effect on the logits is of the
                  order of the chunking noise, below the calibrated tolerance on some models
A plant that does not apply to a model (no layer of that kind; media_split without attention) is
skipped.

Where same-schedule replays are exact (fuzz/replay.py), C1 compares a plant with the unplanted
state built by the same forwards (`exact_reference`): any difference at all flags it. A split media
item has no legitimate schedule to replay (the replayer refuses a forward cut inside a non-causal
item, M1), so the exact oracle flags it whatever its effect.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

PLANTS = ("shift", "other_conv", "stale_window", "recurrent_off", "media_split", "one_row")
GREEDY = 4


@dataclass
class Run:
    logits: mx.array        # first logits, float32
    tokens: list
    gaps: list              # top-2 gap before each greedy token


def _kind(c) -> str:
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache
    return {KVCache: "kv", RotatingKVCache: "windowed", ArraysCache: "recurrent"}.get(type(c), type(c).__name__)


def state_at(lm, toks, r):
    from mlx_lm.models.cache import make_prompt_cache
    caches = make_prompt_cache(lm.model)
    if r:
        mx.eval(lm.model(mx.array([list(toks[:r])]), cache=caches))
    return caches


def _copy(a):
    return None if a is None else mx.array(a)


def finish(step, toks, r, k: int = GREEDY) -> Run:
    """Evaluate toks[r:n-1], then the last token, then k greedy tokens; step(list) -> logits."""
    n = len(toks)
    if r < n - 1:
        mx.eval(step(toks[r:n - 1]))
    logits = step(toks[n - 1:])[0, -1].astype(mx.float32)
    first, out, gaps = logits, [], []
    for i in range(k):
        t2 = mx.topk(logits, 2)
        gaps.append(float(mx.abs(t2[0] - t2[1]).item()))
        out.append(int(mx.argmax(logits).item()))
        if i + 1 < k:
            logits = step([out[-1]])[0, -1].astype(mx.float32)
    mx.eval(first)
    return Run(first, out, gaps)


def _stock_step(lm, caches):
    return lambda t: lm.model(mx.array([list(t)]), cache=caches)


def cold(lm, toks, k: int = GREEDY) -> Run:
    return finish(_stock_step(lm, state_at(lm, toks, 0)), toks, 0, k)


def plant(lm, name: str, toks, r: int, k: int = GREEDY) -> Run | None:
    """The run of toks from a wrong state planted at r; None when the plant does not apply."""
    if name == "media_split":     # only attention reads a bidirectional mask: no plant on a pure SSM
        if not {"kv", "windowed"} & set(lm.layer_kinds):
            return None
        return _media(lm, toks, r, k, split=True)
    caches = state_at(lm, toks, r)
    kinds = [_kind(c) for c in caches]
    if name == "shift":
        if "kv" not in kinds:
            return None
        ahead = state_at(lm, toks, r + 1)
        for c, a, kind in zip(caches, ahead, kinds):
            if kind == "kv":
                c.state = (_copy(a.keys[..., 1:r + 1, :]), _copy(a.values[..., 1:r + 1, :]), r)
    elif name == "other_conv":
        rng = np.random.default_rng(7)
        other = list(toks[:r // 2]) + rng.integers(1, lm.vocab_size, len(toks) - r // 2).tolist()
        caches = state_at(lm, other, r)
    elif name == "stale_window":
        if "windowed" not in kinds:
            return None
        stale = state_at(lm, toks, r - 3)
        for c, s, kind in zip(caches, stale, kinds):
            if kind == "windowed":
                keys, values, _, keep, size, idx = s.state
                c.state = (_copy(keys), _copy(values), r, keep, size, idx)
    elif name == "recurrent_off":
        if "recurrent" not in kinds:
            return None
        stale = state_at(lm, toks, r - 1)
        for c, s, kind in zip(caches, stale, kinds):
            if kind == "recurrent":
                c.cache = [_copy(a) for a in s.cache]
    elif name == "one_row":
        if "kv" not in kinds:
            return None
        other = [toks[0] % (lm.vocab_size - 1) + 1] + list(toks[1:r])
        theirs = state_at(lm, other, r)
        i = len(kinds) - 1 - kinds[::-1].index("kv")     # the last: its rows depend on the context
        c, t = caches[i], theirs[i]
        keys, values = _copy(c.keys[..., :r, :]), _copy(c.values[..., :r, :])
        keys[..., r - 1:r, :] = t.keys[..., r - 1:r, :]
        values[..., r - 1:r, :] = t.values[..., r - 1:r, :]
        c.state = (keys, values, r)
    else:
        raise KeyError(name)
    return finish(_stock_step(lm, caches), toks, r, k)


def exact_reference(lm, name: str, toks, r: int, k: int = GREEDY) -> Run | None:
    """The unplanted state built by the plant's own forwards (toks[:r] in one, then the rest as the
    plant runs them); None for media_split, whose split schedule no legitimate replay runs (M1)."""
    if name == "media_split":
        return None
    return finish(_stock_step(lm, state_at(lm, toks, r)), toks, r, k)


def _media(lm, toks, r, k, split: bool) -> Run:
    """A non-causal item of 9 positions starting at r-4, through the engine's forward; cold = one
    forward of the prompt, planted = the item cut in two forwards at r."""
    from impl.engine import Engine
    from impl.media import MediaItem, noncausal_spans, validate_media

    e = Engine(lm, capture_interval=0, near_end=0)
    media = validate_media([MediaItem(r - 4, 9, b"planted", (3, 3), False)], len(toks))
    sp = noncausal_spans(media)
    n = len(toks)
    cuts = [0] + ([r] if split else []) + [n - 1]
    for a, b in zip(cuts, cuts[1:]):
        mx.eval(e._forward(toks[a:b], a, media, sp))
    pos = [n - 1]

    def step(t):
        out = e._forward(list(t), pos[0], media if pos[0] < n else (), sp if pos[0] < n else [])
        pos[0] += len(t)
        return out
    try:
        return finish(step, toks, n - 1, k)
    finally:
        for c in e.caches:
            if c is not None:
                c.free()


def reference(lm, name: str, toks, r: int, k: int = GREEDY) -> Run:
    """The cold run the planted run is judged against (the oracle's: one forward of the prompt)."""
    return _media(lm, toks, r, k, split=False) if name == "media_split" else cold(lm, toks, k)


def divergence(a: Run, b: Run) -> dict:
    d = mx.abs(a.logits - b.logits)
    first = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), None)
    return {"max": float(d.max().item()), "rms": float(mx.sqrt(mx.mean(d * d)).item()),
            "token_step": first, "gap": None if first is None else b.gaps[first]}
