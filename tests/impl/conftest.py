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
