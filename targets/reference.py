"""Our own caches as targets: the spec (`SpecTarget`) and impl on tracer
caches (`ImplTarget`), each under the same interface as a foreign target.

They exist so that every rule predicate can be shown to catch a broken
policy the way a target run would (tests/power/): a policy mutant is the
spec or impl with one hook changed, run through `targets.program.judge`,
judged by spec.rules on its views alone, with no comparison against anything.

Invariants:
  - `victims` lists the key paths of the nodes evicted so far, in order (the
    operation rules read the slice each operation added, spec.view.Op.evicted).
  - `view()` shows contents: the spec's directly, impl's decoded from the
    tracer caches (stateful_tests.tracer) through the abstraction.
"""
from __future__ import annotations

from spec.cache import PrefixCache as SpecCache
from spec.view import View
from targets.base import ALL_RULES

NOT_OURS = {"A3": "memory figures are not in the view; the fuzz oracle checks A3 on real models",
            "F1": "a scheduler rule (spec/scheduler.py), not a prefix-cache one",
            "F2": "a scheduler rule (spec/scheduler.py), not a prefix-cache one",
            "R1": "a runner rule (spec/scheduler.py), not a prefix-cache one"}


class SpecTarget:
    name = "spec"
    RULES = frozenset(ALL_RULES) - set(NOT_OURS)
    NOT_APPLICABLE = NOT_OURS

    def __init__(self, layers, cache_cls=SpecCache, **config):
        self.pc = cache_cls(layers, **config)

    @property
    def victims(self) -> list:
        return self.pc.victims

    def begin(self, keys, spans=()) -> tuple:
        return self.pc.begin_keys(tuple(keys), list(spans))

    def prefill(self, max_chunks=None) -> bool:
        return self.pc.prefill(max_chunks)

    def step(self, key) -> None:
        self.pc.step(key)

    def close(self) -> None:
        self.pc.close()

    def set_budget(self, budget) -> None:
        self.pc.set_budget(budget)

    def view(self) -> View:
        return self.pc.view()

    def shutdown(self) -> None:
        pass


class ImplTarget:
    """impl's PrefixCache over tracer caches; the caller's `chunk` sizes prefill
    chunks the way the Engine's chunk size does."""
    name = "impl"
    RULES = frozenset(ALL_RULES) - set(NOT_OURS)
    NOT_APPLICABLE = NOT_OURS

    def __init__(self, layers, cache_cls=None, chunk: int = 8, **config):
        from impl.prefix_cache import PrefixCache
        from stateful_tests.tracer import Tracer
        self.layers, self.chunk = tuple(layers), chunk
        self.tracer = Tracer(self.layers)
        self.pc = (cache_cls or PrefixCache)(self.tracer.caches, **config)
        self.pc.record_victims = True

    @property
    def victims(self) -> list:
        return self.pc.victims

    def begin(self, keys, spans=()) -> tuple:
        return self.pc.begin(tuple(keys), list(spans))

    def prefill(self, max_chunks=None) -> bool:
        done, req = 0, self.pc.request
        while True:
            ch = self.pc.next_chunk(self.chunk)
            if ch is None:
                self.pc.prefilled()
                return True
            if max_chunks is not None and done >= max_chunks:
                return False
            p, q = ch
            self.tracer.forward(p, req.keys[p:q], req.spans)
            self.pc.evaluated(req.keys[p:q])
            done += 1

    def step(self, key) -> None:
        self.tracer.forward(self.pc.offset, [key])
        self.pc.evaluated([key])

    def close(self) -> None:
        self.pc.close()

    def set_budget(self, budget) -> None:
        self.pc.set_budget(budget)

    def view(self) -> View:
        from stateful_tests.abstraction import abstract
        return abstract(self.pc, self.layers, self.tracer, self.chunk).view()

    def shutdown(self) -> None:
        for c in self.tracer.caches:
            if c is not None:
                c.free()
