"""A rule's finding: the rule id, where (a node by key path), and what."""
from __future__ import annotations

from dataclasses import dataclass

from spec.view import View


@dataclass(frozen=True)
class Violation:
    rule: str
    where: str
    message: str

    def __str__(self):
        return f"{self.rule} at {self.where}: {self.message}"


def as_view(x) -> View:
    return x if isinstance(x, View) else x.view()


def inside(x: int, spans) -> bool:
    return any(a < x < e for a, e in spans)
