"""What a runner does with tokens on their way out: sampling, detokenisation, stop strings.

- ``make_sampler(temperature, seed)``: temperature 0 or None is greedy (argmax, the engine's
  default); otherwise softmax(logits / temperature) sampled with numpy's PCG64 generator seeded
  by ``seed`` (a random seed when None), so one seed gives one token sequence on every platform.
  A sampler takes the engine's logits ``[1, L, vocab]`` (MLX or numpy) and returns a token id.
- ``TextStream``: incremental detokenisation that emits only final text (no trailing partial
  UTF-8 character) and drops control tokens (an end-of-turn token is not text).
- ``StopMatcher``: Ollama's ``stop`` strings. Text is held back while it could still be the
  start of a stop string; once one appears, everything from it on is dropped and the request
  ends with done_reason "stop".
"""
from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

import numpy as np


def make_sampler(temperature: Optional[float] = None, seed: Optional[int] = None) -> Optional[Callable]:
    """None for greedy decoding (the engine's own default), else a seeded sampler."""
    if temperature is None or temperature <= 0:
        return None
    rng = np.random.default_rng(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
    inv_t = 1.0 / float(temperature)

    def sample(logits) -> int:
        row = np.asarray(logits[0, -1], dtype=np.float64) * inv_t
        row -= row.max()
        p = np.exp(row)
        p /= p.sum()
        return int(rng.choice(p.shape[0], p=p))

    return sample


class TextStream:
    """Incremental detokenisation: emits only text that is final (no trailing partial UTF-8)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.sent = ""

    def _decode(self) -> str:
        if self.tokenizer is None or not hasattr(self.tokenizer, "decode"):
            return ""
        try:   # control tokens (end of turn) are not text: a chat must not echo them back
            return self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        except TypeError:
            try:
                return self.tokenizer.decode(self.tokens)
            except Exception:
                return ""
        except Exception:
            return ""

    def push(self, tok: int) -> str:
        self.tokens.append(tok)
        text = self._decode()
        if text.endswith("\ufffd") or not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece

    def flush(self) -> str:
        text = self._decode()
        piece = text[len(self.sent):] if text.startswith(self.sent) else ""
        self.sent = text
        return piece


class StopMatcher:
    """Feed text pieces; get back what may be shown. ``stopped`` once a stop string appeared."""

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.text = ""          # everything released so far
        self.stopped = False

    def _holdback(self) -> int:
        """Length of the longest tail of ``pending`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(s[:k]):
                    best = k
                    break
        return best

    def push(self, piece: str) -> str:
        if self.stopped:
            return ""
        self.pending += piece
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.pending, self.stopped = self.pending[:cut], "", True
        else:
            keep = self._holdback()
            out = self.pending[:len(self.pending) - keep]
            self.pending = self.pending[len(self.pending) - keep:]
        self.text += out
        return out

    def flush(self) -> str:
        """At the end of generation: what was held back was no stop string after all."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        self.text += out
        return out
