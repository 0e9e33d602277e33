"""Session fixtures for the impl tests: loaded models (once per process) and the cold-prefill oracle.

The oracle (C1) is mlx-lm itself: stock caches from ``make_prompt_cache`` and one forward of the
whole prefix, independent of everything in impl/caches.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from impl.models import load

@pytest.fixture(scope="session")
def models():
    class _Models:
        def __getitem__(self, name):
            return load(name)

    return _Models()


@pytest.fixture(scope="session")
def smollm2():
    return load("smollm2")


class Oracle:
    """Cold prefill with mlx-lm's stock caches."""

    @staticmethod
    def cold_logits(model, tokens) -> mx.array:
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(model)
        logits = model(mx.array(list(tokens))[None], cache=cache)[0, -1]
        mx.eval(logits)
        return logits, cache

    @staticmethod
    def greedy_stock(model, cache, logits, k: int) -> list[int]:
        out = []
        for _ in range(k):
            t = int(mx.argmax(logits).item())
            out.append(t)
            logits = model(mx.array([[t]]), cache=cache)[0, -1]
        return out

    @staticmethod
    def greedy_ours(model, caches, logits, k: int) -> list[int]:
        from impl.caches import forward

        out = []
        for _ in range(k):
            t = int(mx.argmax(logits).item())
            out.append(t)
            logits = forward(model, [t], caches)[0, -1]
        return out


@pytest.fixture(scope="session")
def oracle():
    return Oracle()


@pytest.fixture
def bounded_and_clean():
    """A test that starts runner processes: a watchdog, and no runner may survive it (R1)."""
    import faulthandler

    from impl.client import runner_processes

    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
    left = runner_processes()
    for p in left:
        p.kill()
    assert not left, f"runner processes survived the test: {left}"


@pytest.fixture
def watchdog():
    """A test that talks to runner processes: a stack dump and exit if it hangs for 120 s."""
    import faulthandler

    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def no_runner_left():
    """A module whose server starts runner processes: none may survive the module (R1)."""
    from impl.client import runner_processes

    yield
    left = runner_processes()
    for p in left:
        p.kill()
    assert not left, f"runner processes survived the module: {left}"
