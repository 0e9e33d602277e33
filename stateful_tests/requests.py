"""What the conformance machines send: the layer mixes (one machine each),
the small vocabulary, the configuration values `configure` draws, media
items placed in a prompt (`Media`, turned into spec's and impl's own media
items), conversations (`Conv`) and the open request (`Open`), and the
strategies of the rules' arguments. Printed programs use `Media(...)` as is.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

import impl.media
from spec.media import MediaItem
from spec.trie import Layer

# Byte costs of the tracer's layers (stateful_tests/tracer.py): a KV or windowed row is
# [code, pos] float32 for K and for V = 16 bytes per position; a recurrent state is 3 x uint32.
ROW, STATE = 16, 12


def kv() -> Layer:
    return Layer("kv", ROW)


def windowed(w: int) -> Layer:
    return Layer("windowed", ROW, window=w)


def recurrent() -> Layer:
    return Layer("recurrent", STATE)


NONE = Layer(None)

# name -> layer stack. Stateless layers (Layer(None)) sit between stateful ones.
MIXES = {
    "kv": (kv(),),
    "kv_kv": (kv(), NONE, kv()),
    "kv_recurrent": (NONE, kv(), NONE, recurrent()),
    "recurrent": (recurrent(),),
    "kv_windowed": (kv(), windowed(5)),
    "windowed": (NONE, windowed(4)),
    "hybrid": (kv(), windowed(6), NONE, recurrent()),
}

VOCAB = 4              # token ids 1..VOCAB: a tiny vocabulary, so prefixes are shared everywhere
PLACEHOLDER = 0        # the token id under a media item's run (the fold replaces it)
CHUNKS = (1, 2, 3, 5, 8)
INTERVALS = (0, 1, 2, 3, 4, 6, 10)
NEAR_ENDS = (0, 2, 4)
BUDGETS = (0, 60, 150, 400, 1 << 40)   # bytes; a 10-token KV edge is 160 B
CLOCKS = ("touch", "operation")        # the clock ticks at every touch, or once per operation


@dataclass(frozen=True)
class Media:
    """A media item placed relative to the new text of a prompt: it starts
    `at` keys into the new text, runs `length` keys (clipped to the prompt;
    a non-causal item never covers the prompt's last key, the decode seed,
    which spec.media.validate_request forbids), and folds `data`.
    `bytes_only`: its fold is a function of the bytes alone (REFERENCE
    section 1's words: bytes and dims), not of its run length and causality,
    as an older caller folds: the same bytes sent causal, or longer, share
    keys, so a stored path can end strictly inside a later non-causal item
    (the M3 floor and the S1 clip of attach, which no other shape reaches)."""
    at: int
    length: int
    data: bytes
    causal: bool
    bytes_only: bool = False


@dataclass(frozen=True)
class BytesOnlyItem(MediaItem):
    """spec's MediaItem whose fold ignores run length and causality."""
    @property
    def fold(self) -> int:
        return MediaItem(0, 0, self.data, self.dims).fold


@dataclass(frozen=True)
class BytesOnlyMedia(impl.media.MediaItem):
    """impl's Media whose fold ignores run length and causality."""
    @property
    def fold(self) -> int:
        return impl.media.MediaItem(0, 0, self.data, self.dims).fold


def impl_item(it: MediaItem) -> impl.media.MediaItem:
    """The spec item `it` as impl's media item (impl folds it with its own code)."""
    cls = BytesOnlyMedia if isinstance(it, BytesOnlyItem) else impl.media.MediaItem
    return cls(pos=it.pos, length=it.length, data=it.data, dims=it.dims, causal=it.causal)


@dataclass(frozen=True)
class Conv:
    """A conversation so far: its transcript (the last prompt followed by the
    response), the media items of that prompt, where the prompt ends, and the
    ends of its turns (every turn's transcript is a prefix of this one)."""
    tokens: tuple
    media: tuple
    prompt_len: int
    turns: tuple

    def prefix(self, n: int) -> tuple:
        """The first n tokens and the media items that lie inside them."""
        return self.tokens[:n], tuple(m for m in self.media if m.end <= n)

    def __repr__(self) -> str:
        return f"Conv({len(self.tokens)} tokens, prompt {self.prompt_len}, turns {self.turns})"


@dataclass
class Open:
    """The open request: its prompt and what decoding has produced so far."""
    tokens: tuple
    media: tuple
    keys: tuple
    spans: list
    turns: tuple
    produced: list = field(default_factory=list)
    prefilled: bool = False
    evictions: int = 0         # the spec's eviction count before begin


def compose(base_tokens, base_media, text, media) -> tuple:
    """The prompt base + text, with `media` placed inside the new text."""
    tokens = list(base_tokens) + list(text)
    if not tokens:
        tokens = [1]
    items = list(base_media)
    for m in sorted(media, key=lambda m: m.at):
        pos = len(base_tokens) + m.at
        room = len(tokens) - pos - (0 if m.causal else 1)
        length = min(m.length, room)
        if length < 1 or any(pos < it.end and it.pos < pos + length for it in items):
            continue
        cls = BytesOnlyItem if m.bytes_only else MediaItem
        items.append(cls(pos=pos, length=length, data=m.data, causal=m.causal))
    for it in items:
        tokens[it.pos:it.end] = [PLACEHOLDER] * it.length
    # a shortened prompt may leave a non-causal item covering its last key (the decode seed)
    items = [it for it in items if it.causal or it.end < len(tokens)]
    return tuple(tokens), tuple(sorted(items, key=lambda it: it.pos))


# ------------------------------------------------------------- strategies
text_st = st.lists(st.integers(1, VOCAB), max_size=8)
nonempty_text_st = st.lists(st.integers(1, VOCAB), min_size=1, max_size=12)
media_st = st.lists(st.builds(Media, at=st.integers(0, 8), length=st.integers(1, 5),
                              data=st.sampled_from([b"a", b"b"]), causal=st.booleans(),
                              bytes_only=st.booleans()), max_size=3)
