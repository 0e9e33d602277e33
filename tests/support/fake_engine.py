"""A deterministic stand-in for impl.engine.Engine, for process, scheduler and server tests.

Runner processes load it with ``--engine tests.support.fake_engine:load`` (``FAKE_ENGINE``); the
arguments the runner does not know go to ``load``, which reads these:

    --fake-weight-bytes N   what /memory reports as weights (default 1 MiB)
    --fake-token-delay S    seconds per generated token (streaming and cancellation tests)
    --fake-load-delay S     seconds the load takes (close-during-load tests)
    --fake-fail-load        the load fails (reported as {"event": "error"}; the runner exits 3)
    --fake-mlx              weights as MLX arrays built through a transform (A3 pool-release test)
    --ignore-signals        ignore SIGINT and SIGTERM from the load on (close must SIGKILL)
"""
from __future__ import annotations

import argparse
import dataclasses
import signal
import time
from typing import Any

from impl.prefix_cache import Stats

FAKE_ENGINE = "tests.support.fake_engine:load"


FakeStats = Stats          # the fake reports the same per-request figures as the real prefix cache


@dataclasses.dataclass
class FakeResult:
    tokens: list
    stats: FakeStats
    cancelled: bool = False


class FakeTokenizer:
    def decode(self, tokens, skip_special_tokens=False):
        return "".join(f" t{t}" for t in tokens)


class FakeEngine:
    """Its "prefix cache" remembers whole token streams and reports the longest common prefix as
    matched (leaving one prompt token to evaluate), so chat clients see plausible stats."""

    def __init__(self, weight_bytes: int, token_delay: float):
        self.weight_bytes = weight_bytes
        self.token_delay = token_delay
        self.stored: list[list[int]] = []
        self.tokenizer = FakeTokenizer()

    @staticmethod
    def _ids(prompt) -> list[int]:
        if prompt and isinstance(prompt[0], dict):
            out = []
            for m in prompt:
                out += [1] + [ord(c) % 997 + 3 for c in m["role"] + ":" + m["content"]] + [2]
            return out
        return list(prompt)

    def generate(self, prompt, max_tokens, media=(), cancel=None, on_token=None):
        ids = self._ids(prompt)
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
            out.append(tok)
            if on_token is not None:
                on_token(tok)
        self.stored.append(ids + out)
        del self.stored[:-8]
        stats = FakeStats(total=len(ids), matched=matched, resumed=matched,
                          prefilled=len(ids) - matched, captures=1)
        return FakeResult(tokens=out, stats=stats, cancelled=cancelled)

    def memory(self) -> dict:
        return {"weights": self.weight_bytes, "live_caches": 0, "paged_out": 0}

    def dump(self) -> str:
        return "\n".join(f"stream {i}: {len(s)} tokens" for i, s in enumerate(self.stored)) or "(empty)"

    def dump_json(self) -> dict:
        return {"streams": [len(s) for s in self.stored]}


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
    p.add_argument("--ignore-signals", action="store_true", help="ignore SIGINT and SIGTERM")
    return p


def load(runner_args, argv: list) -> tuple[Any, Any, dict]:
    """The runner's engine factory (impl/runner.py ``--engine MODULE:FACTORY``)."""
    args = _parser().parse_args(argv)
    if args.ignore_signals:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    info: dict = {}
    if args.fake_load_delay:
        time.sleep(args.fake_load_delay)
    if args.fake_fail_load:
        raise RuntimeError(f"fake load of {runner_args.model!r} failed as asked")
    engine = FakeEngine(args.fake_weight_bytes, args.fake_token_delay)
    if args.fake_mlx:
        from impl.memory import release_pool
        engine._weights = _mlx_weights(args.fake_weight_bytes)
        info["pool_released_bytes"] = release_pool()
    return engine, engine.tokenizer, info
