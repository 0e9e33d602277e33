"""Helpers of the directed cases (stateful_tests/test_directed*.py): a prefix cache on the tracer's
real MLX caches, one request run through it, and its abstract state judged by the spec's rules."""
from __future__ import annotations

from impl.prefix_cache import PrefixCache as ImplCache
from spec.rules import c1_cold_equivalence, check
from stateful_tests.abstraction import abstract, canon
from stateful_tests.machines import kv, recurrent
from stateful_tests.tracer import Tracer


LAYERS = (kv(), recurrent())


def cache(layers=LAYERS, **kw):
    tracer = Tracer(layers)
    return ImplCache(tracer.caches, **kw), tracer


def evaluate_prompt(pc, tracer, keys, spans=(), chunk=4):
    """Prefill the open request's prompt chunk by chunk (captures not yet attached)."""
    while (ch := pc.next_chunk(chunk)) is not None:
        p, q = ch
        tracer.forward(p, keys[p:q], spans)
        pc.evaluated(keys[p:q])


def run(pc, tracer, keys, spans=(), produce=(), chunk=4, boundaries=()):
    """One request: begin, prefill in chunks, decode `produce`, close."""
    result = pc.begin(keys, spans, boundaries)
    evaluate_prompt(pc, tracer, keys, spans, chunk)
    pc.prefilled()
    last = keys[-1]
    for k in produce:
        tracer.forward(pc.offset, [last], ())
        pc.evaluated([last])
        last = k
    stats = pc.close()
    return result, stats


def state(pc, tracer, layers=LAYERS):
    return canon(abstract(pc, layers, tracer, 4))


def assert_sound(pc, tracer, layers=LAYERS):
    a = abstract(pc, layers, tracer, 4)
    assert check(a) == [] and c1_cold_equivalence(a) == []
