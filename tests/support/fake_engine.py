"""A deterministic stand-in for impl.engine.Engine, for process, scheduler and server tests.

Runner processes load it with ``--engine tests.support.fake_engine:load`` (``FAKE_ENGINE``); the
arguments the runner does not know go to ``load``, which reads these:

    --fake-weight-bytes N   what /memory reports as weights (default 1 MiB)
    --fake-token-delay S    seconds per generated token (streaming and cancellation tests)
    --fake-load-delay S     seconds the load takes (close-during-load tests)
    --fake-fail-load        the load fails (reported as {"event": "error"}; the runner exits 3)
    --fake-mlx              weights as MLX arrays built through a transform (A3 pool-release test)
    --fake-context N        the context length: a longer prompt is refused like the engine does (default 4096)
    --ignore-signals        ignore SIGINT and SIGTERM from the load on (close must SIGKILL)
"""
from __future__ import annotations

import argparse
import dataclasses
import signal
import threading
import time
from typing import Any

from impl.media import BadRequest
from impl.request import Stats

FAKE_ENGINE = "tests.support.fake_engine:load"


FakeStats = Stats          # the fake reports the same per-request figures as the real prefix cache


@dataclasses.dataclass
class FakeResult:
    tokens: list
    stats: FakeStats
    cancelled: bool = False


class FakeTokenizer:
    eos_token_id = None        # the fake never ends a reply by itself

    def decode(self, tokens, skip_special_tokens=False):
        return "".join(f" t{t}" for t in tokens)

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 997 + 3 for c in text]


class FakeEngine:
    """Its "prefix cache" remembers whole token streams and reports the longest common prefix as
    matched (leaving one prompt token to evaluate), so chat clients see plausible stats."""

    def __init__(self, weight_bytes: int, token_delay: float, context_length: int = 4096):
        self.weight_bytes = weight_bytes
        self.token_delay = token_delay
        self.context_length = context_length
        self.budget = 1 << 62
        self.boundaries: list = []       # the last request's, as the runner passed them
        self.stored: list[list[int]] = []
        self.tokenizer = FakeTokenizer()
        self.threads = {threading.current_thread().name}    # every thread that called the engine

    def _called(self) -> None:
        self.threads.add(threading.current_thread().name)

    def set_budget(self, budget_bytes: int) -> None:
        self._called()
        self.budget = budget_bytes

    @staticmethod
    def _ids(prompt) -> list[int]:
        if prompt and isinstance(prompt[0], dict):
            out = []
            for m in prompt:
                out += [1] + [ord(c) % 997 + 3 for c in m["role"] + ":" + m["content"]] + [2]
            return out
        return list(prompt)

    def generate(self, prompt, max_tokens, media=(), cancel=None, on_token=None, sampler=None, boundaries=None):
        self._called()
        ids = self._ids(prompt)
        if len(ids) >= self.context_length:
            raise BadRequest(f"prompt of {len(ids)} tokens is at or over the context length {self.context_length}")
        self.boundaries = list(boundaries or [])
        matched = 0
        for s in self.stored:
            n = 0
            while n < min(len(s), len(ids)) and s[n] == ids[n]:
                n += 1
            matched = max(matched, n)
        matched = min(matched, len(ids) - 1)
        out, cancelled = [], False
        seed = sum(ids) % 1000
        for i in range(max_tokens):
            if cancel is not None and cancel():
                cancelled = True
                break
            if self.token_delay:
                time.sleep(self.token_delay)
            tok = (seed + 7 * i) % 1000
            if sampler is not None:     # logits that depend on the prompt and the step only
                import numpy as np
                tok = sampler(np.cos(np.arange(1000.0) * (seed + i + 1) / 7.0)[None, None, :] * 4.0)
            out.append(tok)
            if on_token is not None:
                on_token(tok)
        self.stored.append(ids + out)
        del self.stored[:-8]
        stats = FakeStats(total=len(ids), matched=matched, resumed=matched,
                          prefilled=len(ids) - matched, captures=1)
        return FakeResult(tokens=out, stats=stats, cancelled=cancelled)

    def memory(self) -> dict:
        self._called()
        return {"weights": self.weight_bytes, "live_caches": 0, "paged_out": 0, "budget": self.budget}

    def dump(self) -> str:
        self._called()
        return "\n".join(f"stream {i}: {len(s)} tokens" for i, s in enumerate(self.stored)) or "(empty)"

    def dump_json(self) -> dict:
        self._called()
        out = {"streams": [len(s) for s in self.stored], "threads": sorted(self.threads)}
        if self.boundaries:
            out["boundaries"] = self.boundaries
        return out


def _mlx_weights(nbytes: int):
    """Build weights through a transform, as real loaders do (dequantise, fuse), so the consumed
    buffers land in MLX's pool before the runner releases it."""
    import mlx.core as mx
    chunk = 1 << 16                 # 256 KiB tensors: sizes MLX's allocator pools
    raw = [mx.ones((chunk,), dtype=mx.float32) + i for i in range(max(1, nbytes // (4 * chunk)))]
    mx.eval(raw)
    w = [r * 2.0 + 1.0 for r in raw]
    mx.eval(w)
    del raw                         # their buffers go back to the pool, not to the system
    return w


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="--engine " + FAKE_ENGINE)
    p.add_argument("--fake-weight-bytes", type=int, default=1 << 20)
    p.add_argument("--fake-token-delay", type=float, default=0.0)
    p.add_argument("--fake-load-delay", type=float, default=0.0)
    p.add_argument("--fake-fail-load", action="store_true")
    p.add_argument("--fake-mlx", action="store_true", help="fake weights as MLX arrays built by a transform")
    p.add_argument("--fake-context", type=int, default=4096)
    p.add_argument("--ignore-signals", action="store_true", help="ignore SIGINT and SIGTERM")
    return p


def load(runner_args, argv: list) -> tuple[Any, Any, dict]:
    """The runner's engine factory (serve/runner.py ``--engine MODULE:FACTORY``)."""
    args = _parser().parse_args(argv)
    if args.ignore_signals:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    info: dict = {}
    if args.fake_load_delay:
        time.sleep(args.fake_load_delay)
    if args.fake_fail_load:
        raise RuntimeError(f"fake load of {runner_args.model!r} failed as asked")
    engine = FakeEngine(args.fake_weight_bytes, args.fake_token_delay, args.fake_context)
    if args.fake_mlx:
        from impl.memory import release_pool
        engine._weights = _mlx_weights(args.fake_weight_bytes)
        info["pool_released_bytes"] = release_pool()
    return engine, engine.tokenizer, info
