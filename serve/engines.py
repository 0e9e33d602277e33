"""A runner's engine: loading the real one, or a test double named on the command line.

``--engine real`` (the default) loads ``impl.models.load(model)`` into ``impl.engine.Engine``.
``--engine MODULE:FACTORY`` imports MODULE and calls ``FACTORY(args, argv)`` instead, where ``args``
are the runner's parsed arguments and ``argv`` the arguments the runner does not know; it returns
``(engine, tokenizer, info)`` like ``load_engine``. Tests use it to run a fake engine
(tests/support/fake_engine.py) in real runner processes; the real engine takes no extra arguments.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any


def engine_arg(value: str) -> str:
    if value != "real" and not all(value.partition(":")[::2]):
        raise argparse.ArgumentTypeError(f"{value!r}: expected 'real' or MODULE:FACTORY")
    return value


def mlx_figures() -> dict:
    """MLX's allocator counters, only if this runner uses MLX at all (a test engine may not)."""
    if "mlx.core" not in sys.modules:
        return {}
    from impl.memory import mlx_memory
    return {f"mlx_{k}": int(v) for k, v in mlx_memory().items()}


def engine_factory(spec: str):
    """The callable named by ``--engine MODULE:FACTORY``."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def load_engine(args, argv=()) -> tuple[Any, Any, dict]:
    """Load the model and build its engine. Returns (engine, tokenizer, info)."""
    if args.engine != "real":
        return engine_factory(args.engine)(args, list(argv))

    import mlx.core as mx
    from impl import models
    from impl.engine import Engine
    from impl.memory import release_pool

    info: dict = {}
    loaded = models.load(args.model)
    mx.eval(loaded.model.parameters())
    info["weight_bytes"] = int(getattr(loaded, "weight_bytes", 0))
    engine = Engine(loaded)          # its budget is set by main() once resolved (serve/budget.py)
    info["pool_released_bytes"] = release_pool()
    return engine, loaded.tokenizer, info
