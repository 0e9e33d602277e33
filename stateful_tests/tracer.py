"""A synthetic "tracer" layer stack on impl's real MLX layer caches.

Instead of a model, each layer receives rows or state updates that encode
every position's content (its key, or Broken(key) when it was evaluated
without the rest of its non-causal media item) and its position, so the
content of any live cache or snapshot decodes back exactly:
  - KV and windowed layers get one K/V row per position: [code, position];
  - a recurrent layer's state is (count, h1, h2): two polynomial hashes of
    the codes of every position so far, which decode against an expected
    content (a mismatch decodes to a marker that equals nothing).
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from impl.caches.kv import KVCache
from impl.caches.recurrent import RecurrentCache
from impl.caches.windowed import WindowedCache
from spec.trie import KV, RECURRENT, WINDOWED, Broken

M1_, M2_ = 1_000_003, 998_244_353
MASK = (1 << 32) - 1


class Mismatch(tuple):
    """Decoded content that matches no expected content."""


class Tracer:
    def __init__(self, layers):
        self.layers = list(layers)
        self.caches = []
        for i, layer in enumerate(self.layers):
            if layer.kind == KV:
                self.caches.append(KVCache(layer=i))
            elif layer.kind == WINDOWED:
                self.caches.append(WindowedCache(layer.window, layer=i))
            elif layer.kind == RECURRENT:
                self.caches.append(RecurrentCache(1, layer=i))
            else:
                self.caches.append(None)
        self.ids: dict = {}
        self.keys_by_id: list = []
        self._np: dict = {}     # id(mx array) -> (array, numpy copy), for one decoding pass

    def fresh(self) -> None:
        """Start a decoding pass: forget the numpy copies of the previous one
        (each live buffer is copied out of MLX once per pass, not per view)."""
        self._np = {}

    def _numpy(self, a) -> np.ndarray:
        hit = self._np.get(id(a))
        if hit is None or hit[0] is not a:
            hit = self._np[id(a)] = (a, np.array(a))
        return hit[1]

    # --- encoding ---
    def code(self, content) -> int:
        broken = isinstance(content, Broken)
        key = content.key if broken else content
        if key not in self.ids:
            self.ids[key] = len(self.keys_by_id)
            self.keys_by_id.append(key)
        return 2 * self.ids[key] + int(broken)

    def content_of(self, code: int):
        key = self.keys_by_id[code // 2]
        return Broken(key) if code % 2 else key

    @staticmethod
    def hashed(codes, state=(0, 0, 0)) -> tuple:
        n, h1, h2 = state
        for c in codes:
            n, h1, h2 = n + 1, (h1 * M1_ + c + 1) & MASK, (h2 * M2_ + c + 7) & MASK
        return n, h1, h2

    # --- the forward ---
    def write_rows(self, cache, rows) -> None:
        """A KV or windowed layer's write of the forward's rows (keys and values alike)."""
        cache.update_and_fetch(rows, rows)

    def forward(self, offset: int, keys, spans=()) -> None:
        """Evaluate keys at [offset, offset + len(keys)) on every layer."""
        p, q = offset, offset + len(keys)
        whole = lambda pos: all(p <= a and e <= q for a, e in spans if a <= pos < e)
        codes = [self.code(k if whole(p + j) else Broken(k)) for j, k in enumerate(keys)]
        rows = np.array([[c, p + j] for j, c in enumerate(codes)], dtype=np.float32)[None, None]
        for layer, cache in zip(self.layers, self.caches):
            if cache is None:
                continue
            if layer.kind in (KV, WINDOWED):
                self.write_rows(cache, mx.array(rows))
            else:
                prev = (0, 0, 0) if cache[0] is None else tuple(int(v) for v in np.array(cache[0]))
                cache[0] = mx.array(np.array(self.hashed(codes, prev), dtype=np.uint32))
        for cache in self.caches:
            if cache is not None:
                cache.finish_forward(len(keys))

    # --- decoding ---
    def decode_rows(self, k, start: int) -> tuple:
        a = (k if isinstance(k, np.ndarray) else np.array(k))[0, 0]
        out = []
        for j, (code, pos) in enumerate(a):
            out.append(self.content_of(int(code)) if int(pos) == start + j else Mismatch(("pos", int(pos))))
        return tuple(out)

    def decode_state(self, arrays, expected: tuple) -> tuple:
        state = tuple(int(v) for v in np.array(arrays[0])) if arrays and arrays[0] is not None else (0, 0, 0)
        want = self.hashed([self.code(c) for c in expected])
        return tuple(expected) if state == want else Mismatch(("state", state))

    def live(self, i: int, seq: tuple) -> tuple:
        """Layer i's live content; recurrent state decodes against `seq`."""
        cache, layer = self.caches[i], self.layers[i]
        if cache.offset == 0:
            return ()
        if layer.kind == KV:
            return self.decode_rows(self._numpy(cache.keys)[..., :cache.offset, :], 0)
        if layer.kind == WINDOWED:
            k, _ = cache._window_rows()
            return self.decode_rows(k, cache.offset - k.shape[2])
        return self.decode_state(cache.cache, seq)

    def snap(self, i: int, s, expected: tuple) -> tuple:
        """A snapshot's content; a recurrent one decodes against `expected`."""
        if s.kind == KV:
            if s.lazy:      # a view of the issuer's live buffer: decode the shared copy
                return self.decode_rows(self._numpy(s._cache.keys)[..., s.start:s.end, :], s.start)
            k, _ = s._rows()
            return self.decode_rows(k, s.start)
        if s.kind == WINDOWED:
            return self.decode_rows(s.keys, s.end - s.keys.shape[2]) if s.keys is not None else ()
        return self.decode_state(s.arrays, expected)
