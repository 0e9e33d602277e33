"""C1 judged exactly: a served state against a cold replay of the forwards that built it.

REFERENCE C1. Every state an engine serves was built by a known schedule of forwards: the prefill
chunks, decode seeds and decode steps of the requests that wrote it, then the resumed request's own
chunks. Where the kernels give equal results for equal shapes (measured per model, device and dtype
by `replay_is_exact`), a cold run of that same schedule on fresh caches gives the same logits bit for
bit, whatever the machine's rounding. C1 is then judged with no tolerance: a restored state passes
only when it is exactly a state that legitimate forwards produce, so a planted wrong state (a
position shifted by one, a stale window, a split media item) fails at any magnitude.

Provenance. A request's state is a `Fwd`: the state it resumed from, then its own steps (prefill
chunks, decode seed, decode steps). What it resumed from at r is one of a few candidates, each a
`Splice` of states that earlier requests left:
  - rows [0, c) of every sliceable (KVCache) layer from the live caches, i.e. the previous request's
    state, where c is where the prompt leaves the previous request's keys (begin rewinds to there);
  - rows [c, r) from an earlier request whose keys agree with the prompt on [0, r) (pages in);
  - every other layer (window, recurrent, chunked) from such a request's state at exactly r, as a
    restored snapshot holds it (a window's rows in temporal order) unless the live caches already
    rest at r.
Candidates are distinct replays (`replayer.origin`), those whose whole-state layers one of their
forwards left at exactly r first (a chunked or recurrent layer is restored only from a capture there;
an older request's capture is found though newer requests passed through r), then newest first. The
request passes when one replay's seed logits equal its own exactly and its greedy tokens are that
replay's argmax at every decode step (teacher-forced). Its state is then that candidate plus its
steps, the provenance later requests splice from. A request with no seed forward (cancelled in
prefill, max_tokens 0) is not judged: its candidates stay, up to MAX_HISTORY of them, those whose
replay computed the KV rows it left in the engine's live caches.

Replays run on mlx-lm's stock caches, independent of impl/caches (fuzz/replayer.py); a candidate
that needs a trim the stock caches refuse, or a forward cut inside a non-causal item, is no
legitimate schedule and is skipped.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from impl.trie import common_prefix

from .replayer import Fwd, NotReplayable, Replayer, Source, Splice, Step, at_boundary, describe, origin

MAX_CANDIDATES = 12     # candidate resumes tried per request
MAX_HISTORY = 4         # candidates kept for a request that cannot be judged
MAX_WRITERS = 24        # earlier requests searched for the writer of each restored KV row

__all__ = ["Replay", "Replayer", "Verdict", "Source", "Step", "Fwd", "Splice", "replay_is_exact"]


# ------------------------------------------------------------------------------------ the judge
@dataclass
class Verdict:
    judged: bool                 # a seed forward ran: logits and tokens were compared
    ok: bool
    signature: str = ""          # "C1-exact" (logits) | "C1-tokens"
    message: str = ""
    diff: float = 0.0            # |ours - the nearest candidate| (0.0 when ok)
    candidates: int = 0


@dataclass
class Stream:
    keys: tuple
    states: list                 # candidate provenances (one once judged)


def _ranges(xs) -> str:
    out, a = [], None
    for i, x in enumerate(xs):
        if a is None:
            a = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(f"[{a},{x + 1})")
            a = None
    return " ".join(out)


def _impl_rows(engine, r: int) -> dict:
    """{path: (keys, values)} rows [0, r) of the engine's live full-attention layers (paths as the
    stock caches', replayer._layers)."""
    out = {}
    for i, c in enumerate(engine.caches):
        if c is None:
            continue
        subs = getattr(c, "caches", None)
        leaves = [((i, j), x) for j, x in enumerate(subs)] if isinstance(subs, (list, tuple)) else [((i,), c)]
        for path, x in leaves:
            if getattr(x, "kind", None) == "kv" and x.keys is not None and x.offset >= r:
                out[path] = (x.keys[..., :r, :], x.values[..., :r, :])
    return out


class Replay:
    """One engine's history and the exact C1 judge of each of its requests (see the header)."""

    def __init__(self, lm):
        self.lm = lm
        self.run = Replayer(lm)
        self.streams: list[Stream] = []

    def candidates(self, keys, r: int, segments=None) -> list:
        """Resumes at r to try; `segments` ((state, a, b), ...): who wrote each KV row (row_writers).
        Distinct replays only (replayer.origin), those whose whole-state layers a forward left at r
        (where a snapshot is captured) first, else newest first."""
        if r == 0:
            return [None]
        live = self.streams[-1] if self.streams else None
        c = min(common_prefix(live.keys, keys), r) if live is not None else 0
        out, seen = [], set()
        for w in reversed(self.streams):
            if len(w.keys) < r or w.keys[:r] != keys[:r]:
                continue
            # the live caches resting exactly at r are used as they are; else whole states are restored
            kept = w is live and len(live.keys) == r
            for ws in w.states:
                for restored in ((False, True) if kept else (True,)):
                    if segments is not None:
                        splices = [Splice(tuple(segments), ws, r, restored)]
                    else:
                        splices = [Splice(((ls, 0, c), (ws, c, r)) if c < r else ((ls, 0, r),), ws, r, restored)
                                   for ls in (live.states if live is not None and c > 0 and w is not live else ())]
                        splices.append(Splice(((ws, 0, r),), ws, r, restored))   # every row from one writer
                    for sp in splices:
                        key = origin(sp, r)
                        if key not in seen:
                            seen.add(key)
                            out.append(sp)
        out.sort(key=lambda sp: not at_boundary(sp, r))
        return out[:MAX_CANDIDATES]

    def row_writers(self, keys, r: int, engine):
        """Who wrote each KV row [0, r) the engine restored (read from its live caches, which keep
        those rows through the request): for each row, the newest earlier request that agrees with the
        prompt up to that row and whose replay computed the same row, bit for bit, in every KV layer.
        Returns ((state, a, b), ...) runs, None where the model has no KV layer, or the rows no
        legitimate forward computed (a str: the C1 finding)."""
        ours = _impl_rows(engine, r)
        if not ours or r == 0:
            return None
        owner = [None] * r
        for st in list(reversed(self.streams))[:MAX_WRITERS]:
            m = min(common_prefix(st.keys, keys), r)
            for ws in (st.states if m > 0 else ()):
                try:
                    theirs = self.run.kv_rows(ws, m)
                except NotReplayable:
                    continue
                if set(theirs) != set(ours):
                    continue
                eq = None
                for path, (k, v) in ours.items():
                    tk, tv = theirs[path]
                    e = mx.all(k[..., :m, :] == tk, axis=(0, 1, 3)) & mx.all(v[..., :m, :] == tv, axis=(0, 1, 3))
                    eq = e if eq is None else eq & e
                for i, same in enumerate(np.array(eq).tolist()):
                    if same and owner[i] is None:
                        owner[i] = ws
            if all(o is not None for o in owner):
                break
        missing = [i for i, o in enumerate(owner) if o is None]
        if missing:
            return (f"KV rows {_ranges(missing)} of the state restored at {r} equal no row that an earlier request "
                    f"agreeing with this prompt up to it computed there")
        runs, a = [], 0
        for i in range(1, r + 1):
            if i == r or owner[i] is not owner[a]:
                runs.append((owner[a], a, i))
                a = i
        return tuple(runs)

    def _unjudged(self, engine, states: list, r: int, end: int) -> list:
        """The candidate states of a request with no seed forward (cancelled in prefill): those whose
        replay computed the KV rows [r, end) the engine's live caches hold after it, where there are
        more than MAX_HISTORY to keep (if none does, the first MAX_HISTORY: a later request restoring
        those rows is then flagged by row_writers)."""
        ours = _impl_rows(engine, end) if engine is not None and end > r and len(states) > MAX_HISTORY else {}
        agree = []
        for s in states if ours else ():
            try:
                theirs = self.run.kv_rows(s, end)
            except NotReplayable:
                continue
            if set(theirs) == set(ours) and all(
                    bool(mx.array_equal(k[..., r:, :], theirs[p][0][..., r:, :]))
                    and bool(mx.array_equal(v[..., r:, :], theirs[p][1][..., r:, :])) for p, (k, v) in ours.items()):
                agree.append(s)
                if len(agree) == MAX_HISTORY:
                    break
        return agree or states[:MAX_HISTORY]

    def judge(self, tokens, media, result, first: np.ndarray | None = None, greedy: bool = True,
              engine=None) -> Verdict:
        """Judge one Engine.generate result and record its stream; `first`: its seed logits as
        float32 (default: result.first_logits); greedy=False: another sampler chose the tokens (they
        are replayed as fed, not compared with the argmax)."""
        from impl.media import keys_of

        if first is None and result.first_logits is not None:
            first = np.array(result.first_logits.astype(mx.float32))
        tokens = [int(t) for t in tokens]
        n, st = len(tokens), result.stats
        fed = list(result.tokens[:-1]) if first is not None else []
        keys = tuple(keys_of(list(tokens), list(media)))
        src = Source(tuple(tokens) + tuple(fed), tuple(media), keys + tuple(fed))
        own = [Step(a, b, src) for a, b in st.chunks]
        r = st.resumed
        segments = self.row_writers(keys, r, engine) if engine is not None else None
        if isinstance(segments, str):
            self.streams.append(Stream(keys[:r + st.prefilled] if first is None else keys[:n] + tuple(fed), []))
            return Verdict(True, False, "C1-exact", segments)
        cands = self.candidates(keys, r, segments)
        if first is None:
            end = r + st.prefilled
            states = self._unjudged(engine, [Fwd(c, r, tuple(own)) for c in cands], r, end)
            self.streams.append(Stream(keys[:end], states or [Fwd(None, 0, tuple(own))]))
            return Verdict(False, True, candidates=len(cands))
        own.append(Step(n - 1, n, src))
        decode = [Step(n + i, n + i + 1, src) for i in range(len(fed))]
        if not cands:
            return Verdict(True, False, "C1-exact", f"resumed at {r}, but no earlier request of this engine "
                                                    f"agrees with the prompt's first {r} keys")
        best, tried = None, []
        for cand in cands:
            try:
                caches = self.run.state_at(cand, r)
                off = r
                for s in own:
                    out = self.run.step(caches, off, s)
                    off = s.b
            except NotReplayable as e:
                tried.append(f"({describe(cand)}): not replayable ({e})")
                continue
            theirs = np.array(out)
            d = float(np.abs(theirs - first).max()) if theirs.shape == first.shape else float("inf")
            tried.append(f"({describe(cand)}) + own {' '.join(map(repr, own))}: max |d| {d:.3g}")
            best = d if best is None else min(best, d)
            if not np.array_equal(theirs, first):
                continue
            for i, tok in enumerate(result.tokens):                 # greedy tokens, teacher-forced
                want = int(mx.argmax(mx.array(theirs)).item())
                if greedy and tok != want:
                    return Verdict(True, False, "C1-tokens", f"greedy token {i} is {tok}, the exact replay's "
                                                             f"argmax is {want}", 0.0, len(cands))
                if i < len(decode):
                    theirs = np.array(self.run.step(caches, off, decode[i]))
                    off = decode[i].b
            self.streams.append(Stream(keys[:n] + tuple(fed), [Fwd(cand, r, tuple(own + decode))]))
            return Verdict(True, True, candidates=len(cands))
        return Verdict(True, False, "C1-exact",
                       f"resumed at {r} of {n}: the seed logits equal no cold replay of forwards that could have "
                       f"written this prefix (nearest max |d| {best if best is not None else float('nan'):.3g}); "
                       "tried: " + "; ".join(tried), best or 0.0, len(cands))


# ------------------------------------------------------------------------------------ is it exact here?
_EXACT: dict = {}


def replay_is_exact(lm) -> bool:
    """Whether same-schedule replays are bit-identical here, for this model, device and dtype: the
    same chunk schedule twice on stock caches, and once through impl's caches, at two lengths.
    Measured once per process; PREFIX_TRIE_C1=calibrated forces the tolerance oracle, =exact the
    exact one."""
    import os

    from .calibrate import device_key

    forced = os.environ.get("PREFIX_TRIE_C1", "")
    if forced in ("exact", "calibrated"):
        return forced == "exact"
    key = (lm.name, device_key(), getattr(lm, "dtype", "float32"))
    if key not in _EXACT:
        _EXACT[key] = ok = _measure_exact(lm)
        if ok is not True:
            import warnings
            warnings.warn(f"{lm.name} {key[2]} on {key[1]}: {ok}; C1 is judged by the calibrated tolerance here "
                          "(fuzz/calibrate.py)", stacklevel=2)
    return _EXACT[key] is True


def _measure_exact(lm) -> bool | str:
    """True, or why not: the backend's own kernels (stock twice) or impl's caches (impl = stock)."""
    from impl.caches.factory import forward

    from .calibrate import probe_tokens

    for n in (23, 61):
        toks = probe_tokens(lm, n)
        src = Source(tuple(toks), (), tuple(toks))
        cuts = sorted({0, 5, n // 2, n - 1, n} | set(range(0, n - 1, 16)))
        sched = tuple(Step(a, b, src) for a, b in zip(cuts, cuts[1:]))
        outs = []
        for _ in range(2):
            rp = Replayer(lm)
            caches, off = rp.fresh(), 0
            for s in sched:
                out = rp.step(caches, off, s)
                off = s.b
            outs.append(np.array(out))
        caches = lm.make_caches()
        try:
            for s in sched:
                got = forward(lm.model, list(toks[s.a:s.b]), caches)
            ours = np.array(got[0, -1].astype(mx.float32))
        finally:
            for c in caches:
                if c is not None:
                    c.free()
        if not np.array_equal(outs[0], outs[1]):
            return (f"new platform: the same forwards twice on mlx-lm's stock caches differ by "
                    f"{float(np.abs(outs[0] - outs[1]).max()):.3g} (kernels not deterministic for equal shapes)")
        if not np.array_equal(outs[0], ours):
            return (f"impl's caches differ from mlx-lm's stock caches on the same forwards by "
                    f"{float(np.abs(outs[0] - ours).max()):.3g} (a bug of ours, or a backend where they diverge)")
    return True

