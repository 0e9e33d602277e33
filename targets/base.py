"""The target interface: the operation alphabet the conformance machines drive,
and the read-only view (spec.view) a target shows after each operation.

A target is anything that can run these operations and show its state:

  begin(keys, spans) -> (matched, resume)   the request's prompt keys and its
                                            non-causal media spans (pos, end)
  prefill(max_chunks) -> bool               evaluate the prompt but its last key, in
                                            chunks; stop after max_chunks (a cancel
                                            if close follows); True when complete
  step(key)                                 one decode step at the live offset
  close()                                   end the request (a cancel mid-prefill)
  set_budget(budget)                        the byte budget; eviction follows
  view() -> spec.view.View                  the state, frozen
  shutdown()                                release processes and files

`RULES` says which rule ids apply to the target; `NOT_APPLICABLE` says in one
line why each other rule does not. Every applicable rule is judged by the
predicates of spec.rules alone, on the target's successive views.
"""
from __future__ import annotations

from typing import Protocol

from spec.view import View

ALL_RULES = ("T1", "T2", "T3", "S1", "S2", "S3", "S4", "M1", "M2", "M3", "P1", "P2", "G1", "G2",
             "E1", "E2", "E3", "E4", "E5", "A1", "A2", "A3", "C1", "C2")


class Target(Protocol):
    name: str
    RULES: frozenset
    NOT_APPLICABLE: dict              # rule id -> why it does not apply, one line

    def begin(self, keys, spans=()) -> tuple: ...
    def prefill(self, max_chunks: int | None = None) -> bool: ...
    def step(self, key: int) -> None: ...
    def close(self) -> None: ...
    def set_budget(self, budget: int) -> None: ...
    def view(self) -> View: ...
    def shutdown(self) -> None: ...
