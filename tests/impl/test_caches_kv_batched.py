"""KV views copied out across layers in one MLX operation per range (kv_snapshot.copy_queued): the
rows, sizes and hooks are those of a copy per view; only the number of operations changes."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from impl.caches import KVCache
from impl.caches.evaluation import deferred_eval
from tests.support.kv_rows import expect, snap_rows, write
from tests.support.kv_rows import no_leaks  # noqa: F401 (autouse: A2, no snapshot leaks)


@settings(max_examples=40, deadline=None)
@given(starts=st.lists(st.lists(st.integers(0, 7), max_size=3), min_size=1, max_size=4),
       rewind=st.integers(0, 8), n=st.integers(1, 4))
@example(starts=[[2, 2], [2], [5]], rewind=3, n=1)
def test_before_write_copies_each_range_of_every_layer_in_one_operation(starts, rewind, n):
    """Layers with views of several ranges: before_write evaluates once, one concatenation for K and one
    for V per range and view of it a layer has (K and V differ in width here; two views of one range
    in one layer are two groups, so that no buffer outlives a release), and every view reads its own
    rows, owns its own bytes and has heard them once through its hook."""
    from impl.caches.factory import before_write
    from tests.support.evaluations import count_evaluations

    caches = [KVCache(layer=i) for i in range(len(starts))]
    views, heard, c_views = [], {}, {}
    for c, layer_starts in zip(caches, starts):
        write(c, 0, 8)
        for a in layer_starts:
            s = c.snapshot(a)
            heard[id(s)] = []
            s.on_materialise = heard[id(s)].append
            views.append(s)
            c_views.setdefault(c.layer, []).append(s)
    for c in caches:
        assert c.restore(None, rewind)
    copied = [s for s in views if s.start < rewind + n and s.end > rewind]
    with pytest.MonkeyPatch.context() as mp:
        evals = count_evaluations(mp)
        before_write(caches, n)
    # per range, as many groups as the most views one layer has of it (a group holds one view a layer)
    per_layer = Counter((s.start, s.end, i) for i, vs in c_views.items() for s in vs if s in copied)
    groups = {}
    for (a, b, _), m in per_layer.items():
        groups[(a, b)] = max(groups.get((a, b), 0), m)
    assert evals == ([2 * sum(groups.values())] if copied else []), (evals, groups)
    for s in views:
        assert s.lazy == (s not in copied)
        k, v = snap_rows(s)
        ek, ev = expect([0] * 8, s.start, s.end)
        np.testing.assert_array_equal(k, ek)
        np.testing.assert_array_equal(v, ev)
        if s in copied:
            assert heard[id(s)] == [s.size] and s.size == ek.nbytes + ev.nbytes
        s.release()


def test_equal_widths_copy_k_and_v_of_all_layers_in_one_operation(monkeypatch):
    """Where K and V have one shape (most models), all layers' K and V of a range are one copy."""
    from impl.caches.factory import before_write
    from tests.support.evaluations import count_evaluations

    caches = [KVCache(layer=i) for i in range(5)]
    rows = [(mx.arange(i * 96, i * 96 + 48, dtype=mx.float32).reshape(1, 2, 6, 4),
             -mx.arange(i * 96, i * 96 + 48, dtype=mx.float32).reshape(1, 2, 6, 4)) for i in range(5)]
    for c, (k, v) in zip(caches, rows):
        c.update_and_fetch(k, v)
        c.finish_forward(6)
    views = [c.snapshot(1) for c in caches]
    for c in caches:
        assert c.restore(None, 3)
    evals = count_evaluations(monkeypatch)
    before_write(caches, 1)
    assert evals == [1]
    for s, (k, v) in zip(views, rows):
        np.testing.assert_array_equal(np.array(s.keys), np.array(k)[:, :, 1:6])
        np.testing.assert_array_equal(np.array(s.values), np.array(v)[:, :, 1:6])
        assert s.size == 2 * 2 * 5 * 4 * 4
        s.release()


def test_queued_copies_keep_the_rows_a_later_write_in_the_block_replaces():
    """Inside one block: views queued for copying, then the writes over their rows (a page-in's, a
    forward's), then a view released and another read before the block ends. Every copy holds the rows
    as they were when it was queued: the queue slices them then, not at the block's end."""
    caches = [KVCache(layer=i) for i in range(3)]
    for c in caches:
        write(c, 0, 8)
    views = [[c.snapshot(2), c.snapshot(5)] for c in caches]
    with deferred_eval():
        for c in caches:
            assert c.restore(None, 3)
            c.before_write(4)                       # queues the views [2, 8) and [5, 8) of every layer
            write(c, 1, 4)                          # rows [3, 7) of generation 1
        views[0][1].release()                       # queued, released before its copy
        k, _ = snap_rows(views[1][0])               # read while queued: copies the queue now
        np.testing.assert_array_equal(k, expect([0] * 8, 2, 8)[0])
        write(caches[2], 2, 1)                      # a write after that copy, same block
    for row in views:
        for s in row:
            if not s.closed:
                assert not s.lazy
                k, v = snap_rows(s)
                ek, ev = expect([0] * 8, s.start, s.end)
                np.testing.assert_array_equal(k, ek)
                np.testing.assert_array_equal(v, ev)
                s.release()
    gens = [0, 0, 0, 1, 1, 1, 1, 2]
    for c in caches[2:]:
        np.testing.assert_array_equal(np.array(c.keys_and_values()[0]), expect(gens, 0, 8)[0])
