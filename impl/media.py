"""Media items in a prompt: keys, features, and the bad-input checks.

Invariants kept here (REFERENCE section 1, M1-M3):
  - Every position of an item's placeholder run has the item's fold key: a
    hash of its bytes and preprocessing (dims, placeholder length, causality:
    everything that decides how it is evaluated) with FOLD_BIT set; token ids are below
    TOKEN_LIMIT < FOLD_BIT, so a fold never equals a token id.
  - An item's features are derived deterministically from its bytes: the
    same item always gets the same input embeddings.
  - A non-causal item never covers the prompt's last position (the decode
    seed, evaluated alone), and items never overlap or run past the prompt.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

TOKEN_LIMIT = 1 << 31
FOLD_BIT = 1 << 62


class BadRequest(ValueError):
    """A request rejected before anything changed; the message names the problem. The one class
    for bad input, from the engine's checks to the HTTP layer (serve/httpio.py), which answers
    with ``status`` (a 4xx; 503 while a runner is still loading)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class MediaItem:
    pos: int
    length: int
    data: bytes = b""
    dims: tuple = ()
    causal: bool = False

    @property
    def end(self) -> int:
        return self.pos + self.length

    @property
    def fold(self) -> int:
        preprocessing = (tuple(self.dims), self.length, self.causal)   # all that decides its evaluation
        digest = hashlib.sha256(bytes(self.data) + repr(preprocessing).encode()).digest()
        return FOLD_BIT | (int.from_bytes(digest[:8], "big") & (FOLD_BIT - 1))

    def features(self, hidden: int, scale: float) -> np.ndarray:
        """[length, hidden] float32 input embeddings, a function of the bytes only."""
        rng = np.random.default_rng(self.fold & ((1 << 63) - 1))
        return (rng.standard_normal((self.length, hidden)) * scale).astype(np.float32)


def validate_media(media, n_tokens: int) -> list:
    for m in media:
        if not isinstance(m, MediaItem):
            raise BadRequest(f"media item {m!r} is not a MediaItem")
        for name in ("pos", "length"):
            v = getattr(m, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise BadRequest(f"media item {name} {v!r} is not an int (position and length count tokens)")
    items = sorted(media, key=lambda m: m.pos)
    for m in items:
        if m.length <= 0:
            raise BadRequest(f"media item at position {m.pos} has length {m.length} <= 0")
        if m.pos < 0 or m.end > n_tokens:
            raise BadRequest(f"media item [{m.pos}, {m.end}) runs past the prompt of {n_tokens} tokens")
        if not m.causal and m.end >= n_tokens:
            raise BadRequest(f"non-causal media item [{m.pos}, {m.end}) covers the prompt's last position, "
                             "the decode seed (M1)")
    for a, b in zip(items, items[1:]):
        if b.pos < a.end:
            raise BadRequest(f"media items [{a.pos}, {a.end}) and [{b.pos}, {b.end}) overlap")
    return items


def keys_of(tokens, media) -> tuple:
    keys = list(tokens)
    for m in media:
        keys[m.pos:m.end] = [m.fold] * m.length
    return tuple(keys)


def noncausal_spans(media) -> list:
    """(pos, end) of the non-causal items."""
    return [(m.pos, m.end) for m in media if not m.causal]
