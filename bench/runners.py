"""The caches the benchmark compares, behind one interface, plus the ideal.

- ``Ours``:   impl.engine.Engine (the prefix-cache trie), greedy, no EOS stop.
- mlx-lm's ``LRUPromptCache``, driven as ``mlx_lm.server`` drives it: ``bench/server_lru.ServerLRU``.
  One deviation there: on an exact hit the server would prefill an empty prompt; we trim one token (or
  drop an untrimmable cache) so one token is always evaluated.
- ``NoCache``: a fresh ``make_prompt_cache`` per request and ``generate_step`` (stock mlx-lm).
- ``Ideal``:  the lower bound. "Previously evaluated" = every earlier prompt plus its generated tokens
              except the last (a decoder never needs to evaluate the token it samples last); a request
              prefills ``n - min(covered, n - 1)`` tokens. ``ideal_at_captures`` restricts resumes to
              the offsets where our policy takes whole-state checkpoints (periodic interval, ``near_end``
              before a prompt's end, a request's divergence point, the end of what it evaluated), with
              no budget: the bound for a hybrid model under our capture policy.

Every runner reports ``prefilled`` the same way: prompt tokens evaluated, including the decode seed
(so "no cache" prefills exactly the prompt length).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

import mlx.core as mx


@dataclass
class Outcome:
    tokens: list
    prefilled: int
    ttft_s: float
    total_s: float
    forward_s: float = 0.0
    bookkeeping_s: float = 0.0
    evictions: int = 0
    matched: int = 0         # ours: Stats.matched (the trie match after the back-off)
    resumed: int = 0         # ours: Stats.resumed (where the restore landed)
    chunks: tuple = ()       # ours: Stats.chunks (the prefill's forwards [p, q), before the decode seed)
    ttft_forward_s: float = 0.0       # ours: of ttft_s, the forwards (Result.ttft_forward_s)
    ttft_bookkeeping_s: float = 0.0   # ours: of ttft_s, the bookkeeping (Result.ttft_bookkeeping_s)


def common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    # compare in blocks first (long shared prefixes are the common case)
    step = 64
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def distinct_tokens(seqs) -> int:
    """Number of distinct prefixes (= nodes of a token-level trie) over ``seqs``."""
    root: dict = {}
    count = 0
    for s in seqs:
        node = root
        for t in s:
            nxt = node.get(t)
            if nxt is None:
                nxt = node[t] = {}
                count += 1
            node = nxt
    return count


# --------------------------------------------------------------------------------------- geometry
@dataclass
class Geometry:
    kv_bytes_per_token: int          # raw K+V bytes per position over all full-attention layers
    checkpoint_bytes: int            # one whole-state checkpoint (all windowed/recurrent layers)
    kinds: list = field(default_factory=list)

    @property
    def hybrid(self) -> bool:
        return self.checkpoint_bytes > 0


def geometry(lm) -> Geometry:
    """Measured from our layer caches after a 2-token forward (exact for float32 weights)."""
    from impl.caches import forward

    caches = lm.make_caches()
    mx.eval(forward(lm.model, mx.array([[1, 2]]), caches))
    kv = ck = 0
    for c in caches:
        if c is None:
            continue
        if c.kind == "kv":
            kv += (c.keys.nbytes + c.values.nbytes) // c.keys.shape[2]
        else:
            snap = c.snapshot(0)
            ck += snap.size
            snap.release()
    return Geometry(kv, ck, [None if c is None else c.kind for c in caches])


# ------------------------------------------------------------------------------------------ ours
class Ours:
    def __init__(self, lm, budget: int, *, chunk: int, interval: int, near_end: int, check: bool = False):
        from impl.engine import Engine

        self.lm = lm
        self.engine = Engine(lm, budget, chunk_size=chunk, capture_interval=interval, near_end=near_end,
                             check_rules=check)

    def run(self, prompt, max_tokens: int, boundaries=(), **_) -> Outcome:
        """``boundaries``: the prompt's message ends, passed to Engine.generate (user captures there)
        when this Engine takes them."""
        kw = {"boundaries": list(boundaries)} if boundaries and self.takes_boundaries else {}
        r = self.engine.generate(list(prompt), max_tokens, stop_at_eos=False, **kw)
        return Outcome(r.tokens, r.stats.total - r.stats.resumed, r.ttft_s, r.total_s, r.forward_s,
                       r.bookkeeping_s, r.stats.evictions, r.stats.matched, r.stats.resumed, tuple(r.stats.chunks),
                       r.ttft_forward_s, r.ttft_bookkeeping_s)

    @property
    def takes_boundaries(self) -> bool:
        import inspect

        return "boundaries" in inspect.signature(self.engine.generate).parameters

    @property
    def pc(self):
        return self.engine.pc

    def held(self) -> int:
        m = self.engine.memory()
        return m["paged_out"] + m["live_caches"]

    def paged_out(self) -> int:
        return self.engine.pc.counter

    def distinct(self) -> int:
        return sum(len(n.edge) for n in self.engine.pc.trie.nodes() if n is not self.engine.pc.root)

    def entries(self) -> int:
        return len(self.engine.pc.trie.nodes()) - 1

    def close(self) -> None:
        """Release every snapshot the trie holds (A2 hygiene: the process-wide live-snapshot count
        returns to where it was), then drop the engine."""
        trie = self.engine.pc.trie
        for n in trie.nodes():
            for i, snap in enumerate(n.snaps):
                if snap is not None:
                    trie.disown(n, i).release()
        self.engine = None
        gc.collect()


# ---------------------------------------------------------------------------------------- none
class NoCache:
    def __init__(self, lm, *, chunk: int):
        self.lm, self.chunk = lm, chunk

    def run(self, prompt, max_tokens: int, **_) -> Outcome:
        from mlx_lm.generate import generate_step
        from mlx_lm.models.cache import make_prompt_cache

        prompt = list(prompt)
        t0 = time.perf_counter()
        cache = make_prompt_cache(self.lm.model)
        tokens, ttft = [], 0.0
        for tok, _ in generate_step(mx.array(prompt), self.lm.model, max_tokens=max_tokens, prompt_cache=cache,
                                    prefill_step_size=self.chunk):
            tokens.append(int(tok))
            if len(tokens) == 1:
                ttft = time.perf_counter() - t0
        total = time.perf_counter() - t0
        return Outcome(tokens, len(prompt), ttft or total, total)

    def held(self) -> int:
        return 0

    def distinct(self) -> int:
        return 0

    def entries(self) -> int:
        return 0

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------------------- ideal
class Ideal:
    def __init__(self, interval: int, near_end: int):
        self.interval, self.near_end = interval, near_end
        self.evaluated: list = []          # sequences
        self.checkpoints: list = []        # (sequence, sorted offsets)

    def covered(self, prompt) -> int:
        return max((common_prefix(prompt, s) for s in self.evaluated), default=0)

    def prefill(self, prompt) -> int:
        n = len(prompt)
        return n - min(self.covered(prompt), n - 1)

    def prefill_at_captures(self, prompt) -> int:
        n, best = len(prompt), 0
        for seq, offsets in self.checkpoints:
            reach = min(common_prefix(prompt, seq), n - 1)
            best = max([best] + [o for o in offsets if o <= reach])
        return n - best

    def add(self, prompt, generated, boundaries=()) -> None:
        """``boundaries``: message ends in the prompt, where our policy also takes checkpoints."""
        prompt = list(prompt)
        n = len(prompt)
        d = self.covered(prompt)
        seq = prompt + list(generated[:-1])
        offsets = {len(seq)}
        if n - self.near_end > 0:
            offsets.add(n - self.near_end)
        if self.interval > 0:
            offsets.update(range(self.interval, n, self.interval))
        if 0 < d < n - 1:
            offsets.add(d)
        offsets.update(b for b in boundaries if 0 < b < n)
        self.evaluated.append(seq)
        self.checkpoints.append((seq, sorted(offsets)))

