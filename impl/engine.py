"""The request pipeline: a model, its live layer caches and the prefix cache.

generate() runs REFERENCE section 2 end to end: validate, begin, prefill in
chunks (cut where whole-state captures need a forward boundary, never ending
inside a non-causal media item), decode, close.

Invariants kept here:
  - Bad input is rejected before anything changes: the trie, the live caches
    and the byte counter stay exactly as they were (BadRequest names it).
  - Every evaluated key is reported to the prefix cache right after its
    forward, so the caches never rest ahead of what the trie will store;
    the last produced token is never fed back (it is not in the cache).
  - A cancel between chunks (or decode steps) stops the request; close()
    still runs and keeps every capture the prefill crossed.
  - The lazy views a chunk (or decode step) will overwrite are copied out with
    the evaluation of the forward before it (copy_ahead), not in one of their
    own; they stay lazy until that write, so a cancel between leaves them so.
    Where rows are copied on the host (the CPU device: caches/host_rows.py) a
    copy needs no evaluation, and each is made right before its write.
  - Media features enter through the model's embedding layer and
    non-causal spans through the caches' masks, for this forward only.
  - One thread runs the requests: the first generate() binds the engine to its
    thread, and a call from another is refused before anything changes. With
    mlx >= 0.32 each thread has its own stream; cached state (lazy views
    included) made on one thread fails or aborts the process when another
    uses or frees it (docs/platform.md, 2026-12-04).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from impl.caches import host_rows
from impl.caches.evaluation import deferred_eval, evaluate
from impl.caches.factory import before_write, copying, forward
from impl.media import BadRequest, keys_of, noncausal_spans, validate_media
from impl.memory import mlx_memory
from impl.platform import settle_allocator
from impl.prefix_cache import PrefixCache
from impl.request import Stats

ROLES = ("system", "user", "assistant")


class EngineThreadError(RuntimeError):
    """A request from a thread other than the one the engine's cached state lives on."""


class MediaEmbedding(nn.Module):
    """Wraps a model's token embedding; for one forward, positions covered by
    media items take the items' features instead."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.patch = None        # (mask [1, n, 1], features [1, n, hidden]) or None

    def __call__(self, x):
        h = self.inner(x)
        if self.patch is not None:
            mask, feats = self.patch
            h = mx.where(mask, feats.astype(h.dtype), h)
        return h

    def as_linear(self, x):
        return self.inner.as_linear(x)


def _install_media_embedding(model) -> MediaEmbedding:
    for owner_name in ("model", "backbone", "language_model", "language_model.model"):   # the last: llama4
        owner = model
        for part in owner_name.split("."):
            owner = getattr(owner, part, None)
        if owner is None:
            continue
        for attr in ("embed_tokens", "embeddings"):
            emb = getattr(owner, attr, None)
            if isinstance(emb, MediaEmbedding):
                return emb
            if emb is not None:
                wrapped = MediaEmbedding(emb)
                setattr(owner, attr, wrapped)
                return wrapped
    raise TypeError(f"cannot find the token embedding of {type(model).__module__}")


def greedy(logits: mx.array) -> int:
    return int(mx.argmax(logits[0, -1]).item())


@dataclass
class Result:
    tokens: list
    text: str
    stats: Stats
    first_logits: mx.array | None = None
    cancelled: bool = False
    prompt_tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    forward_s: float = 0.0        # model forwards, without the snapshot copies below
    bookkeeping_s: float = 0.0    # PrefixCache's verbs + copying out the lazy snapshots forwards overwrite
    ttft_forward_s: float = 0.0      # of ttft_s: the forwards up to the first token (the prefill's and the seed's)
    ttft_bookkeeping_s: float = 0.0  # of ttft_s: the bookkeeping up to it (the rest: checks, sampling, steps)


class Engine:
    copy_ahead = None       # False: each write's copies are made before it (bench.pagein_split --apart); None:
                            # where MLX's stream copies (a GPU), not where rows are copied on the host (host_rows.py)

    def __init__(self, loaded, budget_bytes: int = 1 << 62, *, chunk_size: int = 64, capture_interval: int = 256,
                 near_end: int = 4, check_rules: bool = False):
        if budget_bytes < 0:
            raise BadRequest(f"budget {budget_bytes} < 0")
        if chunk_size <= 0:
            raise BadRequest(f"chunk size {chunk_size} <= 0")
        self.loaded = loaded
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.chunk_size = chunk_size
        self.caches = loaded.make_caches()
        self._copying = copying(self.caches)     # the caches before_write asks (kinds with lazy snapshots)
        self.pc = PrefixCache(self.caches, budget=budget_bytes, interval=capture_interval, near_end=near_end,
                              check=check_rules)
        self.thread: int | None = None       # the thread of the first request (see the header)
        self.copies_s = 0.0                  # time in before_write: cache bookkeeping, not the model's forward
        if self.copy_ahead is None:          # a host copy needs no evaluation to share: made at the write
            self.copy_ahead = not host_rows.enabled()
        self.embedding = _install_media_embedding(self.model)
        w = self.embedding.inner.weight
        bits = getattr(self.embedding.inner, "bits", None)       # a quantised embedding packs its rows
        self.hidden = w.shape[-1] * 32 // bits if w.dtype == mx.uint32 and bits else w.shape[-1]
        self.feature_scale = float(mx.std(w[:256].astype(mx.float32)).item()) if w.dtype != mx.uint32 else 0.02

    # ------------------------------------------------------------ input
    def tokens_of(self, prompt) -> list:
        if isinstance(prompt, str):
            raise BadRequest("prompt must be token ids or chat messages, not a bare string")
        prompt = list(prompt)
        if prompt and all(isinstance(m, dict) for m in prompt):
            for i, m in enumerate(prompt):
                if m.get("role") not in ROLES:
                    raise BadRequest(f"message {i} has unknown role {m.get('role')!r}; known: {ROLES}")
                if not isinstance(m.get("content"), str):
                    raise BadRequest(f"message {i} has no text content")
            return list(self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True))
        return prompt

    def boundaries_of(self, prompt, tokens, boundaries=None) -> tuple:
        """Message boundaries (REFERENCE section 2 step 2) as token offsets: the offsets a token-id
        prompt names itself, or, for chat messages, where each message ends and where each message's
        content starts (after its role header, where two conversations sharing a history diverge).
        Each becomes a user capture, so a conversation diverging after the system prompt or after any
        earlier turn resumes exactly there."""
        out = set()
        if boundaries is not None:
            if isinstance(boundaries, (str, bytes)) or not hasattr(boundaries, "__iter__"):
                raise BadRequest(f"boundaries must be a list of token offsets, got {boundaries!r}")
            for b in boundaries:
                if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 < b <= len(tokens):
                    raise BadRequest(f"message boundary {b!r} is not an offset in (0, {len(tokens)}]")
                out.add(int(b))
        messages = [] if isinstance(prompt, str) else list(prompt)
        if messages and all(isinstance(m, dict) for m in messages):
            out.update(self._message_offsets(messages, tokens))
        return tuple(sorted(out))

    def _message_offsets(self, messages, tokens) -> set:
        """Character offsets of message ends (the template of the first k messages is a prefix of the
        whole) and content starts, mapped to the tokens that start exactly there (one tokenisation)."""
        tok, render = self.tokenizer, self.tokenizer.apply_chat_template
        text = render(messages, add_generation_prompt=True, tokenize=False)
        ids, offsets = tok.encode_offsets(text)
        if list(ids) != list(tokens):
            return set()
        at = {start: i for i, (start, _end) in enumerate(offsets)}
        chars, pos = set(), 0
        for k, m in enumerate(messages, 1):
            c = text.find(m["content"], pos) if m["content"] else -1
            if c >= 0:
                chars.add(c)
            head = render(messages[:k], add_generation_prompt=False, tokenize=False)
            if text.startswith(head):
                chars.add(len(head))
                pos = len(head)
        return {at[c] for c in chars if c in at and 0 < at[c] < len(tokens)}

    def validate(self, tokens, media, max_tokens) -> list:
        if len(tokens) == 0:
            raise BadRequest("empty prompt: a request needs at least one token")
        if len(tokens) >= self.loaded.context_length:
            raise BadRequest(f"prompt of {len(tokens)} tokens is at or over the context length "
                             f"{self.loaded.context_length}")
        vocab = self.loaded.vocab_size
        if not (set(map(type, tokens)) <= {int} and 0 <= min(tokens) and max(tokens) < vocab):
            for i, t in enumerate(tokens):           # (plain ints in range pass above at C speed)
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab:
                    raise BadRequest(f"token id {t!r} at position {i} is outside the vocabulary [0, {vocab})")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise BadRequest(f"max_tokens {max_tokens!r} must be an int >= 0")
        return validate_media(media, len(tokens))

    # ---------------------------------------------------------- forward
    def _forward(self, tokens, p: int, media, request_spans, logits: bool = True, views: bool = True,
                 ahead: int = 0) -> mx.array | None:
        """One model forward at offset p. A prefill chunk (logits=False) evaluates only the caches:
        the vocabulary projection of its positions is never computed. views=False: the caller knows
        that no lazy snapshot lies in the rows written (no check). ahead: the rows the next forward
        writes; the views it overwrites are copied out with this forward's evaluation."""
        q = p + len(tokens)
        if views:
            w0 = time.perf_counter()
            before_write(self._copying, q - p)             # lazy snapshots this write overwrites: copied out
            self.copies_s += time.perf_counter() - w0
        hits = [m for m in media if m.pos < q and p < m.end]
        if hits:
            mask = np.zeros((1, q - p, 1), dtype=bool)
            feats = np.zeros((1, q - p, self.hidden), dtype=np.float32)
            for m in hits:
                a, b = max(p, m.pos), min(q, m.end)
                mask[0, a - p:b - p] = True
                feats[0, a - p:b - p] = m.features(self.hidden, self.feature_scale)[a - m.pos:b - m.pos]
            self.embedding.patch = (mx.array(mask), mx.array(feats))
        for c in self.caches:
            if c is not None:
                c.attention_spans = request_spans
        try:
            with deferred_eval():       # one MLX evaluation: the forward and the captures its caches took
                out = forward(self.model, mx.array([list(map(int, tokens))]), self.caches, views_copied=True)
                if ahead and self.copy_ahead:
                    w0 = time.perf_counter()
                    for c in self._copying:
                        c.copy_ahead(ahead)
                    self.copies_s += time.perf_counter() - w0
                evaluate(*([out] if logits else []), *[a for c in self.caches if c is not None for a in _arrays(c)])
            settle_allocator()          # the frees of this forward's graph, paid here (impl/platform.py)
        finally:
            self.embedding.patch = None
            for c in self.caches:
                if c is not None:
                    c.attention_spans = []
        return out if logits else None

    # --------------------------------------------------------- generate
    def generate(self, prompt, max_tokens: int = 16, media=(), sampler=greedy, cancel=None, on_token=None,
                 stop_at_eos: bool = True, boundaries=None) -> Result:
        t0 = time.perf_counter()
        self._on_own_thread("generate")
        for name, fn in (("sampler", sampler), ("cancel", cancel), ("on_token", on_token)):
            if fn is not None and not callable(fn):
                raise BadRequest(f"{name} must be callable, got {fn!r}")
        tokens = self.tokens_of(prompt)
        media = self.validate(tokens, media, max_tokens)
        marks = self.boundaries_of(prompt, tokens, boundaries)
        keys, spans = keys_of(tokens, media), noncausal_spans(media)
        cancel = cancel or (lambda: False)
        book0, copies0 = self.pc.bookkeeping_s, self.copies_s
        self._reserve(len(tokens) - 1 + max_tokens, len(tokens))    # the rows it writes if it runs to the end; its prompt's
        produced, first_logits, cancelled, ttft, fwd, opened, decoded = [], None, False, 0.0, 0.0, False, []
        ttft_split = None

        def times() -> tuple:        # (forwards, bookkeeping) so far; before_write runs inside fwd, the page-in not
            copies = self.copies_s - copies0
            return fwd - copies, self.pc.bookkeeping_s - book0 + copies + pagein

        try:
            w0 = time.perf_counter()
            with deferred_eval():                            # one MLX evaluation: the page-in and the copies
                self.pc.begin(keys, spans, marks)            # of the views the first write overwrites
                opened = True
                chunk = self.pc.next_chunk(self.chunk_size)
                cancelled = chunk is not None and cancel()
                first = chunk or ((len(tokens) - 1, len(tokens)) if max_tokens > 0 else None)   # (the seed's)
                if first is not None and not cancelled:      # certain now: a cancel leaves views lazy (spec)
                    before_write(self._copying, first[1] - first[0])
            pagein = time.perf_counter() - w0 - (self.pc.bookkeeping_s - book0)
            while chunk is not None and not cancelled:
                p, q = chunk
                after = self.pc.chunk_at(q, self.chunk_size)       # the next write: a chunk or the seed
                ahead = after[1] - after[0] if after else (1 if max_tokens > 0 else 0)
                f0 = time.perf_counter()
                self._forward(tokens[p:q], p, media, spans, logits=False, ahead=ahead)
                fwd += time.perf_counter() - f0
                self.pc.evaluated(keys[p:q])
                chunk = after                                      # (next_chunk's answer at offset q)
                cancelled = chunk is not None and cancel()
            if not cancelled:
                self.pc.prefilled()
                n = len(tokens)
                if max_tokens > 0:
                    f0 = time.perf_counter()         # the seed and decode write rows [n-1, n-1+max_tokens) and
                    views = any(c.would_copy(max_tokens) for c in self._copying)    # make no view: one check
                    self.copies_s += time.perf_counter() - f0                       # when none lies there
                    logits = self._forward(tokens[n - 1:], n - 1, media, spans, views=views, ahead=int(views))
                    fwd += time.perf_counter() - f0
                    decoded = [keys[n - 1]]          # keys evaluated since prefill: reported in one call at the end
                    first_logits = logits[0, -1]
                    while True:
                        tok = sampler(logits)
                        produced.append(tok)
                        if len(produced) == 1:
                            ttft = time.perf_counter() - t0
                            ttft_split = times()
                        if on_token is not None:
                            on_token(tok)
                        if len(produced) >= max_tokens or (stop_at_eos and tok == self.eos) or cancel():
                            cancelled = cancelled or (len(produced) < max_tokens and tok != self.eos)
                            break
                        f0 = time.perf_counter()
                        logits = self._forward([tok], self.pc.offset, (), [], views=views, ahead=int(views))
                        fwd += time.perf_counter() - f0
                        decoded.append(tok)
        finally:
            for c in self._copying:
                c.drop_ahead()
            if opened:
                if decoded:
                    self.pc.evaluated(decoded)
                stats = self.pc.close()
        forward_s, bookkeeping_s = times()
        self.copies_s += pagein
        text = self.tokenizer.decode(produced) if produced else ""
        total = time.perf_counter() - t0
        ttft_forward_s, ttft_bookkeeping_s = ttft_split or (forward_s, bookkeeping_s)   # no token: all of it
        return Result(tokens=produced, text=text, stats=stats, first_logits=first_logits, cancelled=cancelled,
                      prompt_tokens=len(tokens), ttft_s=ttft or total, total_s=total, forward_s=forward_s,
                      bookkeeping_s=bookkeeping_s, ttft_forward_s=ttft_forward_s,
                      ttft_bookkeeping_s=ttft_bookkeeping_s)

    def _on_own_thread(self, what: str) -> None:
        me = threading.current_thread()
        if self.thread is None:
            self.thread = me.ident
        elif self.thread != me.ident:
            raise EngineThreadError(
                f"Engine.{what} called on thread {me.name!r}, but this engine's cached state lives on thread "
                f"{self.thread} (its first request's): with mlx >= 0.32 each thread has its own stream, and "
                "another thread cannot use or free those arrays safely. Make every call from one thread "
                "(serve/runner.py hands them to its main thread).")

    def _reserve(self, rows: int, certain: int) -> None:
        """Each layer cache's reserve hint (caches/base.py): a KV buffer grows once to the prompt's rows
        (the prefill's chunks then write in place) and its last growth stops at the request's rows, so
        close has little or no growth slack to copy away (kv.py fit)."""
        for c in self.caches:
            if c is not None:
                c.reserve(rows, certain)

    @property
    def eos(self) -> int | None:
        return getattr(self.tokenizer, "eos_token_id", None)

    # ------------------------------------------------------------ state
    def set_budget(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise BadRequest(f"budget {budget_bytes} < 0")
        if self.thread is not None:                   # evicting frees cached arrays
            self._on_own_thread("set_budget")
        self.pc.set_budget(budget_bytes)

    def memory(self) -> dict:
        live = sum(c.nbytes for c in self.caches if c is not None)
        return {"weights": self.loaded.weight_bytes, "live_caches": live, "paged_out": self.pc.counter,
                "budget": self.pc.budget, **{f"mlx_{k}": v for k, v in mlx_memory().items()}}

    def dump(self) -> str:
        return self.pc.dump()

    def dump_json(self) -> dict:
        return self.pc.dump_json()


def _arrays(cache):
    for name in ("keys", "values"):
        a = getattr(cache, name, None)
        if isinstance(a, mx.array):
            yield a
    for a in getattr(cache, "cache", None) or ():
        if isinstance(a, mx.array):
            yield a
