"""The composite (CacheList) and chunked layer caches under the snapshot protocol's rules.

KVListCache (deepseek_v32): S1 ranges part by part, G1 refuses non-adjacent merges before touching
any part, G2 merges lazy views by arithmetic, S4 split gives both halves; A2 counts a composite once.
StateListCache (falcon_h1) and ChunkedCache (llama4): S2 state at one offset, captured at forward
boundaries only, never rewound by the protocol; a restored snapshot continues like a cold prefill
(bit-identical here: the same chunking on both sides).
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from impl.caches import CacheError, MergeError, forward, live_snapshots, make_layer_caches
from tests.support.evaluations import COPIES, copies_made
from tests.support.small_archs import build

TOKENS = [1, 5, 9, 2, 7, 3, 4, 8, 6, 11, 12, 10]


def test_kv_list_snapshots_keep_every_kv_rule():
    model, _ = build("deepseek_v32")
    caches = make_layer_caches(model)
    c = caches[0]
    assert c.kind == "kv" and type(c).__name__ == "KVListCache"
    base = live_snapshots()
    c.prepare_captures([4, 8])
    forward(model, TOKENS[:10], caches)
    for other in caches[1:]:
        other.take_captures()          # only layer 0 scheduled: the rest hold nothing
    a, b = c.take_captures()
    assert (a.start, a.end, b.start, b.end) == (0, 4, 4, 8)                     # S1
    assert all((p.start, p.end) == (0, 4) for p in a.parts) and a.lazy and a.size == 0
    assert live_snapshots() == base + 2                                          # A2: once each
    with pytest.raises(MergeError, match="G1"):
        c.merge_snapshots(b, a)
    assert not a.closed and not b.closed and len(a.parts) == len(c.caches)      # nothing touched
    ab = c.merge_snapshots(a, b)                                                 # G2
    assert (ab.start, ab.end) == (0, 8) and ab.lazy and a.closed and b.closed
    head, tail = c.split(ab, 3)                                                  # S4
    assert (head.start, head.end, tail.start, tail.end) == (0, 3, 3, 8)
    assert live_snapshots() == base + 2
    assert c.restore(head, 3) and c.offset == 3 and all(p.offset == 3 for p in c.caches)
    head.release()
    tail.release()
    assert live_snapshots() == base
    with pytest.raises(CacheError, match="A2"):
        head.release()


@pytest.mark.parametrize("model_type, kind", [("falcon_h1", "StateListCache"), ("llama4", "ChunkedCache")])
def test_whole_state_composite_and_chunked_restore_like_a_cold_prefill(model_type, kind):
    model, _ = build(model_type)
    caches = make_layer_caches(model)
    layers = [c for c in caches if c is not None and type(c).__name__ == kind]
    assert layers and all(c.kind == "recurrent" for c in layers)
    for c in caches:
        c.prepare_captures([6])
    assert all(c.captures_inside(10) == [6] for c in layers)        # the driver must cut there
    with pytest.raises(CacheError, match="cut the forward"):
        forward(model, TOKENS[:10], caches)
    for c in caches:
        c.free()
        c.prepare_captures([6])
    forward(model, TOKENS[:6], caches)
    forward(model, TOKENS[6:10], caches)
    snaps = [c.take_captures()[0] for c in caches]
    assert all(s is not None and s.end == 6 and (s.start == 6 or c.kind == "kv")
               for c, s in zip(caches, snaps))                                      # S2 (S1 for KV)
    assert not layers[0].can_restore(None, 4)                                         # never rewound
    fresh = make_layer_caches(model)
    for c, s in zip(fresh, snaps):
        assert c.restore(s, 6)
    stock = make_prompt_cache(model)
    model(mx.array([TOKENS[:6]]), cache=stock)
    for t in TOKENS[6:9]:
        want = model(mx.array([[t]]), cache=stock)
        got = forward(model, [t], fresh)
        assert mx.array_equal(want, got).item()
    for s in snaps:
        s.release()


@pytest.mark.parametrize("copies", COPIES)
@pytest.mark.parametrize("model_type", ["deepseek_v32", "falcon_h1"])
def test_before_write_copies_composite_parts_views_in_one_evaluation(model_type, monkeypatch, copies):
    """A KV part's lazy views, in a KV list (deepseek_v32) or a whole-state list (falcon_h1), are
    copied out by before_write with every other layer's, in one evaluation (none on the host), not
    mid-forward."""
    from impl.caches.factory import before_write
    from tests.support.evaluations import count_evaluations

    copies_made(monkeypatch, copies)
    model, _ = build(model_type)
    caches = make_layer_caches(model)
    base = live_snapshots()
    for c in caches:
        c.prepare_captures([4, 10])
    forward(model, TOKENS[:4], caches)
    forward(model, TOKENS[4:10], caches)
    snaps = [c.take_captures() for c in caches]
    for c, (s4, _) in zip(caches, snaps):
        assert c.restore(s4, 4)
    lazy = lambda: [p for _, s10 in snaps for p in s10.parts if p.lazy]   # noqa: E731
    assert lazy(), "the later captures' KV parts read rows the next write overwrites"
    evals = count_evaluations(monkeypatch)
    before_write(caches, 2)
    assert len(evals) == (copies == "stream") and not lazy(), evals
    evals.clear()
    forward(model, TOKENS[4:6], caches)
    # the forward evaluates only the whole-state parts' pending captures (one payload list each,
    # recurrent.py: they wait for the next forward); a view copied out there would be a (keys, values) pair
    assert all(n == 1 for n in evals), f"the forward had nothing left to copy: {evals}"
    for pair in snaps:
        for s in pair:
            s.release()
    assert live_snapshots() == base
