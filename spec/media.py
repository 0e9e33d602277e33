"""Keys and media items (REFERENCE section 1, rules M1-M3).

Invariants kept here:
  - A position's key is its token id, or, across a media item's placeholder
    run, the item's fold value. Folds have FOLD_BIT set and token ids are
    below TOKEN_LIMIT < FOLD_BIT, so a fold never equals a token id.
  - A non-causal item is evaluated in one forward: no chunk ends, no capture
    lands and no resume starts strictly inside it (M1, M2, M3). Causal items
    carry no such restriction.

Every function here is pure; the contracts (pre:/post:) are checked
symbolically by CrossHair in the test suite.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

TOKEN_LIMIT = 1 << 31
FOLD_BIT = 1 << 62


def fold_key(data: bytes, dims: tuple[int, ...] = (), length: int = 0, causal: bool = False) -> int:
    """The key of every position of a media item: a hash of its bytes and
    preprocessing (dims, and the placeholder length and causality that the
    dims determine in a real model), with FOLD_BIT set so it never equals a
    token id. Two items share keys only if they are evaluated identically: a
    stored prefix of one item's run is never reused for a different item.

    post: __return__ & FOLD_BIT
    post: TOKEN_LIMIT <= __return__ < 2 * FOLD_BIT
    """
    digest = hashlib.sha256(bytes(data) + repr((tuple(dims), length, causal)).encode()).digest()
    return FOLD_BIT | (int.from_bytes(digest[:8], "big") & (FOLD_BIT - 1))


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
        return fold_key(self.data, self.dims, self.length, self.causal)


def validate_request(tokens, media=(), vocab_size: int = TOKEN_LIMIT, boundaries=()) -> None:
    """Reject bad input before anything changes (it loses nothing).

    Raises ValueError naming the problem."""
    if len(tokens) == 0:
        raise ValueError("empty prompt: a request needs at least one token")
    for i, t in enumerate(tokens):
        if not isinstance(t, int) or t < 0 or t >= vocab_size:
            raise ValueError(f"token id {t!r} at position {i} is outside the vocabulary [0, {vocab_size})")
    validate_media(media, len(tokens))
    for b in boundaries:
        if isinstance(b, bool) or not isinstance(b, int) or not 0 < b <= len(tokens):
            raise ValueError(f"message boundary {b!r} is not an offset in (0, {len(tokens)}]")


def validate_media(media, n_tokens: int) -> None:
    """M1's preconditions on a prompt of n_tokens: items inside it, not
    overlapping, a non-causal one never covering the decode seed."""
    items = sorted(media, key=lambda m: m.pos)
    for m in items:
        if m.length <= 0:
            raise ValueError(f"media item at position {m.pos} has length {m.length} <= 0")
        if m.pos < 0 or m.end > n_tokens:
            raise ValueError(f"media item [{m.pos}, {m.end}) runs past the prompt of {n_tokens} tokens")
        if not m.causal and m.end >= n_tokens:
            raise ValueError(
                f"non-causal media item [{m.pos}, {m.end}) covers the prompt's last position, "
                "which is the decode seed and must be evaluated alone (M1)")
    for a, b in zip(items, items[1:]):
        if b.pos < a.end:
            raise ValueError(f"media items [{a.pos}, {a.end}) and [{b.pos}, {b.end}) overlap")


def keys_of(tokens, media=()) -> tuple:
    """The key stream of a prompt: token ids, with each media item's run
    replaced by its fold value."""
    keys = list(tokens)
    for m in media:
        keys[m.pos:m.end] = [m.fold] * m.length
    return tuple(keys)


def strictly_inside(x: int, pos: int, end: int) -> bool:
    """post: __return__ == (pos < x < end)"""
    return pos < x < end


def resume_floor(x: int, spans: list[tuple[int, int]]) -> int:
    """M3: an offset strictly inside a non-causal span moves to its start.

    `spans` are the (pos, end) ranges of the non-causal items.
    pre: all(0 <= p < e for (p, e) in spans)
    pre: all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
    post: __return__ <= x
    post: not any(p < __return__ < e for (p, e) in spans)
    """
    for pos, end in spans:
        if pos < x < end:
            return pos
    return x


def capture_ceiling(x: int, spans: list[tuple[int, int]]) -> int:
    """M2: a capture scheduled strictly inside a non-causal span lands at its end.

    pre: all(0 <= p < e for (p, e) in spans)
    pre: all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
    post: __return__ >= x
    post: not any(p < __return__ < e for (p, e) in spans)
    """
    for pos, end in spans:
        if pos < x < end:
            return end
    return x


def extend_chunk(end: int, spans: list[tuple[int, int]]) -> int:
    """M1: a prefill chunk ending strictly inside a non-causal span is
    extended to the span's end, so the item is evaluated in one forward.

    pre: all(0 <= p < e for (p, e) in spans)
    pre: all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
    post: __return__ >= end
    post: not any(p < __return__ < e for (p, e) in spans)
    """
    return capture_ceiling(end, spans)


def noncausal_spans(media) -> list:
    return [(m.pos, m.end) for m in media if not m.causal]
