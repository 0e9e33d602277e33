"""The conformance machine on composite KV layers (impl/caches/composite.py, KVListCache).

Each KV layer of the mix is a KVListCache of two KV parts (mlx-lm's CacheList(KVCache, KVCache), as
deepseek_v32 builds it); both parts receive the tracer's rows, so each decodes to the layer's content.
The machine is the ordinary one (stateful_tests/machines.py): impl against the spec step by step,
every rule, C1 on the live caches; the tracer decodes a composite snapshot part by part and reports a
mismatch unless every part holds the same content. A KV layer's byte cost is doubled (two parts).

Whole-state composites (StateListCache) are not machine-checked: their KV part is a lazy view of
[0, o) whose bytes materialise on the live buffer's schedule, which the spec's byte model of a
recurrent layer (one state, constant size) does not describe; the fuzz and
tests/impl/test_caches_composite.py check them.
"""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from impl.caches.composite import KVListCache, PartsSnapshot
from impl.caches.kv import KVCache
from spec.trie import KV, Layer
from stateful_tests import machines
from stateful_tests.conftest import stateful_settings
from stateful_tests.requests import NONE, ROW, recurrent
from stateful_tests.tracer import Mismatch, Tracer


class CompositeTracer(Tracer):
    def __init__(self, layers):
        super().__init__(layers)
        for i, layer in enumerate(self.layers):
            if layer.kind == KV:
                self.caches[i] = KVListCache(KVCache(layer=i), KVCache(layer=i), layer=i)

    def write_rows(self, cache, rows) -> None:
        for part in cache.caches if isinstance(cache, KVListCache) else (cache,):
            part.update_and_fetch(rows, rows)

    def live(self, i: int, seq: tuple) -> tuple:
        cache = self.caches[i]
        if not isinstance(cache, KVListCache):
            return super().live(i, seq)
        if cache.offset == 0:
            return ()
        got = [self.decode_rows(self._numpy(p.keys)[..., :cache.offset, :], 0) for p in cache.caches]
        return got[0] if all(g == got[0] for g in got) else Mismatch(("parts", tuple(got)))

    def snap(self, i: int, s, expected: tuple) -> tuple:
        if not isinstance(s, PartsSnapshot):
            return super().snap(i, s, expected)
        got = [super(CompositeTracer, self).snap(i, p, expected) for p in s.parts]
        if any((p.start, p.end) != (s.start, s.end) for p in s.parts):
            return Mismatch(("part ranges", tuple((p.start, p.end) for p in s.parts)))
        return got[0] if all(g == got[0] for g in got) else Mismatch(("parts", tuple(got)))


def two_part_kv() -> Layer:
    return Layer("kv", 2 * ROW)


MIXES = {
    "kvlist": (two_part_kv(),),
    "kvlist_recurrent": (NONE, two_part_kv(), NONE, recurrent()),
}


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_conformance_on_composite_kv_layers(mix, monkeypatch):
    monkeypatch.setattr(machines, "Tracer", CompositeTracer)
    machine = type(f"{mix.title()}Machine", (machines.ConformanceMachine,), {"LAYERS": MIXES[mix]})
    run_state_machine_as_test(machine, settings=stateful_settings())
