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
Candidates are tried newest first; the request passes when one replay's seed logits equal its own
exactly and its greedy tokens are that replay's argmax at every decode step (teacher-forced). Its
state is then that candidate plus its steps, the provenance later requests splice from. A request
with no seed forward (cancelled in prefill, max_tokens 0) is not judged: every candidate stays.

Replays run on mlx-lm's stock caches (independent of impl/caches). A Step (a, b, src) forwards src's
inputs [a, b) on caches resting at >= a, trimmed to a first; a cache that cannot trim (a recurrent
state, a wrapped window) makes the candidate unreplayable, as it makes such a restore impossible,
and so does a forward cut strictly inside a non-causal media item (M1: no legitimate schedule).
Media items enter as impl's engine feeds them (features through the model's embedding wrapper) and
non-causal spans through a mask stated here (REFERENCE M1: bidirectional inside one item).
States are memoised per (provenance, offset), copied on use.
"""
from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

MAX_CANDIDATES = 12     # candidate resumes tried per request
MAX_HISTORY = 4         # candidates kept for a request that cannot be judged
MEMO_BYTES = 512 << 20  # replayed states kept for reuse


class NotReplayable(Exception):
    """The schedule needs a trim that the stock caches refuse (a recurrent state, a wrapped window)."""


@dataclass(frozen=True, eq=False)
class Source:
    tokens: tuple            # token ids (decode tokens appended after the prompt)
    media: tuple             # impl.media.MediaItem, the prompt's items
    keys: tuple


@dataclass(frozen=True, eq=False)
class Step:
    a: int
    b: int
    src: Source

    def __repr__(self) -> str:
        return f"[{self.a},{self.b})"


@dataclass(eq=False)
class Fwd:
    """The state `parent` holds at `at` (None: fresh caches, at 0), then `steps` in order."""
    parent: object
    at: int
    steps: tuple

    @property
    def end(self) -> int:
        return self.steps[-1].b if self.steps else self.at


@dataclass(eq=False)
class Splice:
    """KVCache rows [a, b) from each (state, a, b) of `kv`; every other layer from `whole` at `end`,
    as a snapshot restores it when `restored` (a sliding window in temporal order, its newest rows)."""
    kv: tuple
    whole: object
    end: int
    restored: bool = True


def describe(p, depth: int = 0) -> str:
    if p is None:
        return "cold"
    if depth > 3:
        return "…"
    if isinstance(p, Splice):
        parts = " + ".join(f"rows [{a},{b}) of ({describe(q, depth + 1)})" for q, a, b in p.kv)
        return f"{parts}; state at {p.end} of ({describe(p.whole, depth + 1)})"
    steps = " ".join(map(repr, p.steps))
    return f"{describe(p.parent, depth + 1)}@{p.at} {steps}" if p.parent is not None else steps


# ------------------------------------------------------------------------------------ stock caches
class _Host:
    """An array kept in host memory (numpy), so that memoised states do not count as MLX memory (the
    fuzz's MEM oracle counts every MLX array of the process); bfloat16 travels as its bits."""
    __slots__ = ("data", "dtype")

    def __init__(self, a: mx.array):
        self.dtype = a.dtype
        self.data = np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)

    def thaw(self) -> mx.array:
        a = mx.array(self.data)
        return a.view(mx.bfloat16) if self.dtype == mx.bfloat16 else a


def _clone(c, how):
    """A deep copy of a stock cache (list) with every array mapped by `how`."""
    if isinstance(c, (mx.array, _Host)):
        return how(c)
    if isinstance(c, (list, tuple)):
        return type(c)(_clone(x, how) for x in c)
    if hasattr(c, "__dict__") and not isinstance(c, type):
        new = copy.copy(c)
        for k, v in vars(c).items():
            setattr(new, k, _clone(v, how))
        return new
    return c


def _freeze(caches):
    return _clone(caches, lambda a: _Host(a) if isinstance(a, mx.array) else a)


def _thaw(frozen):
    return _clone(frozen, lambda a: a.thaw() if isinstance(a, _Host) else mx.array(a))


def _layers(caches):
    """(path, cache) for every leaf stock cache; a CacheList's members are leaves."""
    for i, c in enumerate(caches):
        if hasattr(c, "caches") and isinstance(getattr(c, "caches"), (list, tuple)):
            for j, s in enumerate(c.caches):
                yield (i, j), s
        else:
            yield (i,), c


def _as_snapshot(c) -> None:
    """A stock sliding window as a restored snapshot leaves it: its rows in temporal order, the first
    `keep` and the newest after them, min(offset, max_size) in all (impl/caches/windowed.py S2). The
    ring's slot order decides the order attention sums in, so it is part of the exact state."""
    from mlx_lm.models.cache import RotatingKVCache
    if type(c) is not RotatingKVCache or c.keys is None:
        return
    k, v = c._temporal_order(c.keys), c._temporal_order(c.values)
    rows = min(c.offset, c.max_size)
    if k.shape[2] > rows:
        tail = rows - c.keep
        k = mx.concatenate([k[..., :c.keep, :], k[..., k.shape[2] - tail:, :]], axis=2)
        v = mx.concatenate([v[..., :c.keep, :], v[..., v.shape[2] - tail:, :]], axis=2)
    c.keys, c.values, c._idx = k, v, rows


def _is_kv(c) -> bool:
    from mlx_lm.models.cache import KVCache
    return type(c) is KVCache


def _offset(caches) -> int:
    return max((c.offset for _, c in _layers(caches) if hasattr(c, "offset")), default=0)


def _trim(caches, n: int) -> None:
    for _, c in _layers(caches):
        if not c.is_trimmable():
            raise NotReplayable(f"{type(c).__name__} cannot trim {n} positions")
    for _, c in _layers(caches):
        c.trim(n)


def _nbytes(caches) -> int:
    total = 0
    for _, c in _layers(caches):
        for a in (getattr(c, "keys", None), getattr(c, "values", None)):
            total += a.nbytes if isinstance(a, mx.array) else 0
        for a in getattr(c, "cache", None) or ():
            total += a.nbytes if isinstance(a, mx.array) else 0
    return total


def _span_mask(offset: int, n: int, k0: int, spans, window=None) -> mx.array:
    """REFERENCE M1: a query sees earlier keys (within a window) and every key of its own item."""
    q = mx.arange(offset, offset + n)[:, None]
    k = mx.arange(k0, offset + n)[None]
    m = q >= k
    if window is not None:
        m = m & (q < k + window)
    for s, e in spans:
        m = m | (((q >= s) & (q < e)) & ((k >= s) & (k < e)))
    return m


# ------------------------------------------------------------------------------------ the replayer
class Replayer:
    """Runs provenance on stock caches, memoising states per (provenance, offset)."""

    def __init__(self, lm):
        self.lm, self.model = lm, lm.model
        self.memo: OrderedDict = OrderedDict()
        self.memo_bytes = 0
        self.forwards = 0
        self._media = None

    def fresh(self):
        from mlx_lm.models.cache import make_prompt_cache
        return make_prompt_cache(self.model)

    def state_at(self, p, r: int):
        """Fresh stock caches holding p's state at offset r (the caller owns them)."""
        key = (id(p), r)
        if key in self.memo:
            self.memo.move_to_end(key)
            return _thaw(self.memo[key][1])
        if p is None:
            if r:
                raise NotReplayable(f"a cold state at {r}")
            return self.fresh()
        if isinstance(p, Splice):
            caches = self._splice(p, r)
        elif p.parent is not None and r <= p.at:
            return self.state_at(p.parent, r)
        else:
            caches = self.state_at(p.parent, p.at) if p.parent is not None else self.fresh()
            off = p.at
            for s in p.steps:
                if s.a >= r:
                    break
                self.step(caches, off, s)
                off = s.b
            if off > r:
                _trim(caches, off - r)
            elif off < r:
                raise NotReplayable(f"state at {r} past its end {off}")
        self._keep(key, p, caches)
        return caches

    def _keep(self, key, p, caches) -> None:
        n = _nbytes(caches)
        self.memo[key] = (p, _freeze(caches), n)   # p is held so that id(p) stays unique
        self.memo_bytes += n
        while self.memo_bytes > MEMO_BYTES and len(self.memo) > 1:
            _, (_, _, m) = self.memo.popitem(last=False)
            self.memo_bytes -= m

    def _splice(self, p: Splice, r: int):
        if r > p.end:
            raise NotReplayable(f"a splice ending at {p.end} asked at {r}")
        caches = self.state_at(p.whole, r)
        if p.restored:
            for _, c in _layers(caches):
                _as_snapshot(c)
        parts = [(q, a, min(b, r)) for q, a, b in p.kv if a < r]
        if not parts:
            return caches
        rows = {}
        for q, a, b in parts:
            src = self.state_at(q, b)
            for path, c in _layers(src):
                if _is_kv(c):
                    rows.setdefault(path, []).append((c.keys[..., a:b, :], c.values[..., a:b, :]))
        for path, c in _layers(caches):
            if path in rows:
                ks, vs = zip(*rows[path])
                c.state = (mx.concatenate(ks, axis=2), mx.concatenate(vs, axis=2), r)
        return caches

    def step(self, caches, offset: int, s: Step) -> mx.array:
        if s.a > offset:
            raise NotReplayable(f"a gap: step {s!r} after offset {offset}")
        if s.a < offset:
            _trim(caches, offset - s.a)
        for m in s.src.media:
            if not m.causal and (m.pos < s.a < m.end or m.pos < s.b < m.end):
                raise NotReplayable(f"M1: forward {s!r} cuts the non-causal item [{m.pos},{m.end})")
        hits = [m for m in s.src.media if m.pos < s.b and s.a < m.end]
        undo = self._patch(caches, s, hits) if hits else None
        try:
            out = self.model(mx.array([list(s.src.tokens[s.a:s.b])]), cache=caches)[0, -1].astype(mx.float32)
            mx.eval(out)
        finally:
            if undo:
                undo()
        self.forwards += 1
        return out

    def _patch(self, caches, s: Step, hits):
        """Media features through the model's embedding wrapper; non-causal items through the mask."""
        if self._media is None:
            from impl.engine import Engine
            e = Engine(self.lm, capture_interval=0, near_end=0)
            self._media = (e.embedding, e.hidden, e.feature_scale)
            for c in e.caches:
                if c is not None:
                    c.free()
        emb, hidden, scale = self._media
        n = s.b - s.a
        mask = np.zeros((1, n, 1), dtype=bool)
        feats = np.zeros((1, n, hidden), dtype=np.float32)
        for m in hits:
            a, b = max(s.a, m.pos), min(s.b, m.end)
            mask[0, a - s.a:b - s.a] = True
            feats[0, a - s.a:b - s.a] = m.features(hidden, scale)[a - m.pos:b - m.pos]
        emb.patch = (mx.array(mask), mx.array(feats))
        spans = [(m.pos, m.end) for m in hits if not m.causal]
        patched = []
        if spans and n > 1:
            for _, c in _layers(caches):
                if hasattr(c, "make_mask") and hasattr(c, "keys"):
                    window = getattr(c, "max_size", None)
                    k0 = s.a - min(window - 1, s.a) if window else 0

                    def make_mask(N, *args, _k0=k0, _w=window, **kw):
                        return _span_mask(s.a, N, _k0, spans, kw.get("window_size") or _w)
                    c.make_mask = make_mask
                    patched.append(c)

        def undo():
            emb.patch = None
            for c in patched:
                del c.make_mask
        return undo


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


def _lcp(a, b) -> int:
    n, m = 0, min(len(a), len(b))
    while n < m and a[n] == b[n]:
        n += 1
    return n


class Replay:
    """One engine's history and the exact C1 judge of each of its requests (see the header)."""

    def __init__(self, lm):
        self.lm = lm
        self.run = Replayer(lm)
        self.streams: list[Stream] = []

    def candidates(self, keys, r: int) -> list:
        if r == 0:
            return [None]
        writers = [s for s in reversed(self.streams) if len(s.keys) >= r and _lcp(s.keys[:r], keys[:r]) >= r]
        live = self.streams[-1] if self.streams else None
        c = min(_lcp(live.keys, keys), r) if live is not None else 0
        out = []
        for w in writers:
            # the live caches resting exactly at r are used as they are; else whole states are restored
            kept = w is live and len(live.keys) == r
            for ws in w.states:
                for restored in ((False, True) if kept else (True,)):
                    for ls in (live.states if live is not None and c > 0 and w is not live else ()):
                        out.append(Splice(((ls, 0, c), (ws, c, r)) if c < r else ((ls, 0, r),), ws, r, restored))
                    out.append(Splice(((ws, 0, r),), ws, r, restored))       # every row from one writer
                if len(out) >= MAX_CANDIDATES:
                    return out[:MAX_CANDIDATES]
        return out

    def judge(self, tokens, media, result, first: np.ndarray | None = None) -> Verdict:
        """Judge one Engine.generate result (greedy sampling) and record its stream; `first`: its
        seed logits as float32 (default: result.first_logits)."""
        from impl.media import keys_of

        if first is None and result.first_logits is not None:
            first = np.array(result.first_logits.astype(mx.float32))
        n, st = len(tokens), result.stats
        fed = list(result.tokens[:-1]) if first is not None else []
        keys = tuple(keys_of(list(tokens), list(media)))
        src = Source(tuple(tokens) + tuple(fed), tuple(media), keys + tuple(fed))
        own = [Step(a, b, src) for a, b in st.chunks]
        r = st.resumed
        cands = self.candidates(keys, r)
        if first is None:
            end = r + st.prefilled
            states = [Fwd(c, r, tuple(own)) for c in cands[:MAX_HISTORY]]
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
                if tok != want:
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
        _EXACT[key] = _measure_exact(lm)
    return _EXACT[key]


def _measure_exact(lm) -> bool:
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
        if not (np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], ours)):
            return False
    return True

