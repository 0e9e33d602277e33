"""Cold replays of provenance on mlx-lm's stock caches, for the exact C1 oracle (fuzz/replay.py).

A Step (a, b, src) forwards src's inputs [a, b) on caches resting at >= a, trimmed to a first; a cache
that cannot trim (a recurrent state, a wrapped window) makes the replay impossible (NotReplayable), as
it makes such a restore impossible, and so does a forward cut strictly inside a non-causal media item
(M1: no legitimate schedule). A `Fwd` is a state then steps; a `Splice` takes KVCache rows from
several states and every other layer from one, as a restored snapshot holds it. Media items enter as
impl's engine feeds them (features through the model's embedding wrapper) and non-causal spans
through a mask stated here (REFERENCE M1: bidirectional inside one item). States are memoised per
(provenance, offset) in host memory (the fuzz's MEM oracle counts every MLX array), copied on use.
"""
from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

MEMO_BYTES = 512 << 20  # replayed states kept for reuse (in host memory)


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


def _whole(p, r: int):
    """(the Fwd whose own forwards give p's whole-state layers at r, or None for cold caches; whether a
    splice on the way restores them as a snapshot)."""
    restored = False
    while True:
        if isinstance(p, Fwd) and p.parent is not None and r <= p.at:
            p = p.parent
        elif isinstance(p, Splice) and r <= p.end:
            restored, p = restored or p.restored, p.whole
        else:
            return p, restored


def _rows(p, r: int, a: int, b: int) -> list:
    """[(Fwd, a', b'), ...]: which Fwd's forwards computed each KV row [a, b) of p's state at r."""
    if a >= b or p is None:
        return []
    if isinstance(p, Splice) and r <= p.end:
        out, cur = [], a
        for q, pa, pb in sorted(p.kv, key=lambda x: x[1]):
            lo, hi = max(cur, pa), min(b, pb, r)
            if lo < hi:
                out += _rows(p.whole, r, cur, lo) + _rows(q, min(pb, r), lo, hi)
                cur = hi
        return out + _rows(p.whole, r, cur, b)
    if isinstance(p, Fwd):
        if p.parent is not None and r <= p.at:
            return _rows(p.parent, r, a, b)
        return _rows(p.parent, p.at, a, min(b, p.at)) + ([(p, max(a, p.at), b)] if b > p.at else [])
    return [(p, a, b)]


def origin(p, r: int) -> tuple:
    """A key of the state `Replayer.state_at(p, r)` replays: provenances with equal keys run the same
    forwards, so they replay the same state. The whole-state layers are those of the Fwd whose own
    forwards reach r (with its parent, fixed); each KV row is the row of the Fwd that computed it."""
    w, restored = _whole(p, r)
    runs = []
    for q, a, b in _rows(p, r, 0, r):
        if runs and runs[-1][0] == id(q) and runs[-1][2] == a:
            runs[-1] = (id(q), runs[-1][1], b)
        else:
            runs.append((id(q), a, b))
    return (id(w), restored, tuple(runs))


def at_boundary(p, r: int) -> bool:
    """Whether p's whole-state layers at r are where one of its forwards ended (a snapshot captured
    there), rather than a forward that passed r trimmed back (which impl only does to a window)."""
    w, _ = _whole(p, r)
    return w is None or any(s.b == r for s in w.steps)


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
def host_bits(a: mx.array) -> np.ndarray:
    """An exact numpy copy of `a`; bfloat16, which numpy lacks, as its uint16 bits."""
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)


class _Host:
    """An array kept in host memory (numpy), so that memoised states do not count as MLX memory (the
    fuzz's MEM oracle counts every MLX array of the process); bfloat16 travels as its bits."""
    __slots__ = ("data", "dtype")

    def __init__(self, a: mx.array):
        self.dtype = a.dtype
        self.data = host_bits(a)

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


def _full_window(c) -> bool:
    """A stock sliding window holding exactly max_size rows, not yet wrapped: still in temporal order,
    so a rewind inside it is exact (mlx-lm refuses it; impl's windowed cache, P1, does not)."""
    from mlx_lm.models.cache import RotatingKVCache
    return type(c) is RotatingKVCache and c.offset == c.max_size and c._idx == c.offset


def _trim(caches, n: int) -> None:
    for _, c in _layers(caches):
        if not (c.is_trimmable() or _full_window(c)):
            raise NotReplayable(f"{type(c).__name__} cannot trim {n} positions")
    for _, c in _layers(caches):
        if _full_window(c):
            c.offset -= n
            c._idx -= n
        else:
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

    def __init__(self, lm, max_kv_size: int | None = None):
        self.lm, self.model, self.max_kv_size = lm, lm.model, max_kv_size
        self.memo: OrderedDict = OrderedDict()
        self.memo_bytes = 0
        self._media = None

    def fresh(self):
        from mlx_lm.models.cache import make_prompt_cache
        return make_prompt_cache(self.model, self.max_kv_size)

    def kv_rows(self, p, m: int) -> dict:
        """{path: (keys, values)} of p's KVCache rows [0, m): its state at m, or, where the other
        layers cannot be brought back to m, at the end of the forward that wrote row m - 1."""
        caches = self.state_at(p, m, trim=False)
        return {path: (c.keys[..., :m, :], c.values[..., :m, :]) for path, c in _layers(caches)
                if _is_kv(c) and c.keys is not None and c.offset >= m}

    def state_at(self, p, r: int, trim: bool = True):
        """Fresh stock caches holding p's state at offset r (the caller owns them); trim=False: the
        state where the forward that wrote row r - 1 left it, whatever it holds beyond r."""
        key = (id(p), r, trim)
        if key in self.memo:
            self.memo.move_to_end(key)
            return _thaw(self.memo[key][1])
        if p is None:
            if r:
                raise NotReplayable(f"a cold state at {r}")
            return self.fresh()
        if isinstance(p, Splice):
            caches = self._splice(p, r, trim)
        elif p.parent is not None and r <= p.at:
            return self.state_at(p.parent, r, trim)
        else:
            caches = self.state_at(p.parent, p.at) if p.parent is not None else self.fresh()
            off = p.at
            for s in p.steps:
                if s.a >= r:
                    break
                self.step(caches, off, s)
                off = s.b
            if off > r and trim:
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

    def _splice(self, p: Splice, r: int, trim: bool = True):
        if r > p.end:
            raise NotReplayable(f"a splice ending at {p.end} asked at {r}")
        caches = self.state_at(p.whole, r, trim)
        if p.restored:
            for _, c in _layers(caches):
                _as_snapshot(c)
        parts = [(q, a, min(b, r)) for q, a, b in p.kv if a < r]
        if not parts:
            return caches
        rows = {}
        for q, a, b in parts:
            for path, (k, v) in self.kv_rows(q, b).items():
                rows.setdefault(path, []).append((k[..., a:b, :], v[..., a:b, :]))
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
