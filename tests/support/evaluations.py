"""Counting the MLX evaluations the layer caches make (impl/caches/evaluation.py)."""
from __future__ import annotations

import impl.caches.evaluation as evaluation


def count_evaluations(monkeypatch) -> list:
    """From now on (until monkeypatch undoes it), every evaluation the caches make through
    ``evaluation.evaluate`` appends its number of arrays to the returned list."""
    evals: list = []
    real = evaluation.mx

    class Counting:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def eval(*arrays):
            evals.append(len(arrays))
            real.eval(*arrays)

    monkeypatch.setattr(evaluation, "mx", Counting())
    return evals


COPIES = ("stream", "host")


def copies_made(monkeypatch, how: str) -> None:
    """Lazy views copied out with MLX's stream ("stream": operations evaluated, a GPU's way) or on the
    calling thread ("host": impl/caches/host_rows.py, the CPU device's way, nothing to evaluate)."""
    import impl.caches.host_rows as host_rows

    monkeypatch.setattr(host_rows, "ENABLED", how == "host")
