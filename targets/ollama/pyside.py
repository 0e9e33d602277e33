"""The machine's Go-free path: our own caches behind the harness's reset
protocol, so the same machine, programs and rules that judge Ollama judge
impl (and the spec) with the layouts of the Go harness. A run that reports
nothing here shows the machine and the rules raise no false alarm on a
correct cache; a difference between this and the Go run is Ollama's.

Invariants: the layouts and byte costs are the Go harness's (target.COST,
window 4); keys are used as given (no uint32 wire form is needed).
"""
from __future__ import annotations

from spec.trie import Layer
from targets.ollama.target import COST
from targets.reference import ImplTarget, SpecTarget

KINDS = {"transformer": ["kv"], "sliding": ["kv", "windowed"], "recurrent": ["kv", "recurrent"],
         "stateless": ["recurrent", None, "kv", None], "hybrid": ["recurrent", "kv", "recurrent", "kv", "kv"]}


def layers_of(layout: str) -> list:
    return [Layer(k, COST[k] if k else 0, 4 if k == "windowed" else 0) for k in KINDS[layout]]


class Resettable:
    """A reference target rebuilt at each reset(layout, budget, interval, near_end, chunk)."""

    def __init__(self, kind: str = "impl"):
        self.kind, self.name = kind, kind
        self.inner = None
        self.outcome, self.merges, self.sent, self.steps = None, [], [], 0
        cls = ImplTarget if kind == "impl" else SpecTarget
        self.RULES, self.NOT_APPLICABLE = cls.RULES, cls.NOT_APPLICABLE

    def reset(self, layout="recurrent", budget=1 << 40, interval=8, near_end=4, chunk=8, **_):
        if self.inner is not None:
            self.inner.shutdown()
        if self.kind == "impl":
            self.inner = ImplTarget(layers_of(layout), chunk=chunk, budget=budget, interval=interval,
                                    near_end=near_end)
        else:
            self.inner = SpecTarget(layers_of(layout), budget=budget, interval=interval, near_end=near_end,
                                    chunk=chunk)

    def _do(self, f, *a):
        self.steps += 1
        self.outcome = f(*a)
        return self.outcome

    def begin(self, keys, spans=()):
        return self._do(self.inner.begin, keys, spans)

    def prefill(self, max_chunks=None):
        done = self._do(self.inner.prefill, max_chunks)
        self.outcome = (int(bool(done)),)
        return done

    def step(self, key):
        self._do(self.inner.step, key)

    def close(self):
        self._do(self.inner.close)

    def set_budget(self, budget):
        self._do(self.inner.set_budget, budget)

    def view(self):
        return self.inner.view()

    def shutdown(self):
        if self.inner is not None:
            self.inner.shutdown()
