"""KVCache writes on synthetic rows (no model): views copied out before a write overwrites them (one
evaluation for every layer; would_copy exact), a page-in written in place, and restore_run equal to
restore of each snapshot in turn. The protocol itself: tests/impl/test_caches_kv.py.
"""

from __future__ import annotations


import mlx.core as mx
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from impl.caches import CacheError, KVCache
from impl.platform import cpu_only_allocator
from impl.caches.evaluation import evaluate
from tests.support.evaluations import COPIES, copies_made
from tests.support.kv_rows import expect, live_rows, rows, snap_rows, write
from tests.support.kv_rows import no_leaks  # noqa: F401 (autouse: A2, no snapshot leaks)


@pytest.mark.parametrize("copies", COPIES)
def test_before_write_copies_every_layers_overwritten_views_in_one_evaluation(monkeypatch, copies):
    """A forward that overwrites lazy views on every layer copies them out before the model runs, all
    layers in one MLX evaluation (factory.before_write): a layer's own write would evaluate its copies
    alone, one evaluation per layer mid-forward. Copied on the host (the CPU device's way), there is
    nothing to evaluate. Hooks, rows and what the write leaves are unchanged."""
    from impl.caches.factory import before_write
    from tests.support.evaluations import count_evaluations

    copies_made(monkeypatch, copies)
    caches = [KVCache(layer=i) for i in range(3)]
    for c in caches:
        write(c, 0, 8)
    views = [c.snapshot(2) for c in caches]
    heard = {i: [] for i in range(3)}
    for i, s in enumerate(views):
        s.on_materialise = heard[i].append
    for c in caches:
        assert c.restore(None, 4)                       # a rewind: the next write overwrites [4, 6)
    evals = count_evaluations(monkeypatch)
    before_write(caches, 2)
    expected = [6] if copies == "stream" else []
    assert evals == expected, f"{copies}: evaluations of 3 layers x (K, V) {expected} expected, got {evals}"
    assert all(not s.lazy for s in views)
    for i, s in enumerate(views):
        assert heard[i] == [s.size] and s.size > 0
    for c in caches:
        write(c, 1, 2)                                   # the model's write: nothing left to copy
    assert evals == expected
    gens = [0] * 8
    for s in views:
        k, v = snap_rows(s)
        ek, ev = expect(gens, 2, 8)
        np.testing.assert_array_equal(k, ek)
        np.testing.assert_array_equal(v, ev)
        s.release()


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 12), starts=st.lists(st.integers(0, 11), max_size=4), rewind=st.integers(0, 12),
       n=st.integers(1, 6))
def test_would_copy_says_exactly_whether_before_write_has_a_view_to_copy(length, starts, rewind, n):
    """``would_copy(n)`` is True exactly when the next write of n rows overwrites an outstanding lazy
    view; when it is False, factory.before_write evaluates nothing and every view stays lazy (the
    decode-step fast path), and when it is True the views it copies are the overlapping ones."""
    from impl.caches.factory import before_write
    from tests.support.evaluations import count_evaluations

    c = KVCache(layer=0)
    write(c, 0, length)
    views = [c.snapshot(a) for a in starts if a < length]
    assert c.restore(None, min(rewind, length))
    p = c.offset
    overlapping = {id(s) for s in views if s.start < p + n and s.end > p}
    assert c.would_copy(n) == bool(overlapping)
    with pytest.MonkeyPatch.context() as mp:
        copies_made(mp, "stream")                        # (on the host, before_write never evaluates)
        evals = count_evaluations(mp)
        before_write([None, c], n)
    assert len(evals) == (1 if overlapping else 0)
    assert {id(s) for s in views if not s.lazy} == overlapping
    for s in views:
        s.release()


_STEP = st.one_of(st.tuples(st.just("write"), st.integers(1, 3)), st.tuples(st.just("view"), st.integers(0, 6)),
                  st.tuples(st.just("rewind"), st.integers(0, 6)), st.tuples(st.just("clear"), st.integers(1, 4)),
                  st.tuples(st.just("release"), st.integers(0, 10)))


@settings(max_examples=400, deadline=None)
@given(steps=st.lists(_STEP, min_size=1, max_size=16), n=st.integers(1, 4))
@example(steps=[("write", 3), ("view", 0), ("rewind", 0), ("clear", 3), ("write", 1), ("view", 0), ("rewind", 0)], n=1)
def test_would_copy_stays_exact_through_writes_views_rewinds_and_clears(steps, n):
    """The O(1) answers of ``would_copy`` (slots past every view, slots a before_write cleared) agree
    with a brute-force overlap test after any sequence of writes, new views, rewinds, before_writes
    and releases; and no write ever overwrites a view's rows (every view still reads what it named)."""
    c = KVCache(layer=0)
    gens, views = [], []
    for op, k in steps:
        if op == "write":
            c.before_write(k)
            write(c, len(views) + 1, k)
            gens[c.offset - k:] = [len(views) + 1] * k
        elif op == "view" and k <= c.offset:
            s = c.snapshot(k)
            if s is not None:
                views.append((s, list(gens)))
        elif op == "rewind":
            assert c.restore(None, min(k, c.offset))
            del gens[c.offset:]
        elif op == "clear":
            c.before_write(k)
        elif op == "release" and views:
            views.pop(k % len(views))[0].release()
        p = c.offset
        brute = any(s.lazy and s.start < p + n and s.end > p for s, _ in views)
        assert c.would_copy(n) == brute, (op, k, p, [(s.start, s.end, s.lazy) for s, _ in views])
    for s, g in views:
        np.testing.assert_array_equal(snap_rows(s)[0], expect(g, s.start, s.end)[0])
        s.release()


@settings(max_examples=120, deadline=None)
@given(length=st.integers(1, 12), starts=st.lists(st.integers(0, 11), max_size=4), rewind=st.integers(0, 12),
       n=st.integers(1, 6), taken=st.booleans())
def test_copies_made_ahead_leave_views_lazy_until_the_write_takes_them_over(length, starts, rewind, n, taken):
    """``copy_ahead(n)`` (evaluated with a forward) copies the rows of the views the next write of n rows
    overwrites, and changes nothing a reader sees: every view stays lazy, owns 0 bytes, its hook hears
    nothing. The write's before_write then takes the copies over with no evaluation of its own (hooks hear
    each size once); or, the request ending first, ``drop_ahead`` lets them go and the views stay lazy
    (a later write copies them itself). Either way every view reads the rows it named."""
    from impl.caches.evaluation import deferred_eval
    from impl.caches.factory import before_write
    from tests.support.evaluations import count_evaluations

    c = KVCache(layer=0)
    write(c, 0, length)
    views = [c.snapshot(a) for a in starts if a < length]
    heard = {id(s): [] for s in views}
    for s in views:
        s.on_materialise = heard[id(s)].append
    assert c.restore(None, min(rewind, length))
    p = c.offset
    overlapping = {id(s) for s in views if s.start < p + n and s.end > p}
    with pytest.MonkeyPatch.context() as mp:
        evals = count_evaluations(mp)
        with deferred_eval():                                   # the forward's evaluation
            c.copy_ahead(n)
        assert len(evals) == (1 if overlapping else 0)
        assert all(s.lazy and s.size == 0 for s in views) and not any(heard.values())
        if taken:
            made = {id(s): s._ahead for s in views if id(s) in overlapping}
            before_write([c], n)
            assert all((s.keys, s.values) == made[id(s)] for s in views if id(s) in overlapping), "not taken over"
            assert len(evals) == (1 if overlapping else 0), "the write evaluated copies made ahead again"
            assert {id(s) for s in views if not s.lazy} == overlapping
            assert all(heard[id(s)] == ([s.size] if id(s) in overlapping else []) for s in views)
        else:
            c.drop_ahead()
            assert all(s.lazy and s._ahead is None for s in views) and not any(heard.values())
    write(c, 9, n)
    gens = [0] * length
    for s in views:
        np.testing.assert_array_equal(snap_rows(s)[0], expect(gens, s.start, s.end)[0])
        np.testing.assert_array_equal(snap_rows(s)[1], expect(gens, s.start, s.end)[1])
        s.release()


def test_copies_made_ahead_with_a_forward_leave_its_write_in_place():
    """A chunk's forward writes its rows and, in the same evaluation, copies out the view the next chunk
    overwrites, reading the buffer it just wrote. The write still finds the buffer unshared and updates
    it in place (peak: the copy, not a second buffer; exact on the CPU's allocator), the next chunk's
    before_write evaluates nothing, and the view keeps its rows through that chunk's write."""
    from impl.caches.evaluation import deferred_eval
    from impl.caches.factory import before_write
    from tests.support.evaluations import count_evaluations

    n = 4096
    live = KVCache(layer=0)
    write(live, 0, n)
    view = live.snapshot(n - 256)                         # lazy: the last 256 rows
    assert live.restore(None, n - 512)
    buffer = live.keys.nbytes + live.values.nbytes
    mx.eval(live.keys, live.values)
    mx.synchronize()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    with deferred_eval():                                 # chunk [n-512, n-256), copying [n-256, n) ahead
        k, v = rows(1, n - 512, n - 256)
        mx.eval(k, v)
        live.update_and_fetch(k, v)
        live.finish_forward(256)
        live.copy_ahead(256)
        evaluate(live.keys, live.values)
    peak = mx.get_peak_memory() - base
    assert view.lazy
    if cpu_only_allocator():
        assert peak < sum(a.nbytes for a in view._ahead) + buffer // 2 + k.nbytes + v.nbytes, \
            f"peak {peak} B: a whole buffer ({buffer} B) was copied"
    with pytest.MonkeyPatch.context() as mp:
        evals = count_evaluations(mp)
        before_write([live], 256)
        assert evals == [] and not view.lazy
    write(live, 2, 256)
    gens = [0] * (n - 512) + [1] * 256 + [2] * 256
    np.testing.assert_array_equal(snap_rows(view)[0], expect([0] * n, n - 256, n)[0])
    np.testing.assert_array_equal(live_rows(live)[0], expect(gens, 0, n)[0])
    view.release()


def page_in_peak(live: KVCache, page_in) -> tuple[int, int]:
    """(peak bytes above the start, the live buffer's bytes) of `page_in()` run in one deferred
    evaluation, then the buffer evaluated as the next forward does."""
    from impl.caches.evaluation import deferred_eval

    buffer = live.keys.nbytes + live.values.nbytes
    mx.eval(live.keys, live.values)
    mx.synchronize()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    with deferred_eval():
        page_in()
    mx.eval(live.keys, live.values)
    return mx.get_peak_memory() - base, buffer


@pytest.mark.parametrize("copies", COPIES)
def test_a_page_in_that_copies_views_out_writes_the_live_buffer_in_place(monkeypatch, copies):
    """Inside one deferred evaluation, a restore that overwrites lazy views copies them out and writes
    the snapshot's rows in. The block evaluates the copies; the write is left to the next evaluation
    of the buffer (the forward's), so it finds the buffer unshared and updates it in place: the
    page-in's peak is the views' copies, not a second whole buffer (MLX copies a buffer for a write
    while a pending copy still reads it). The peak is asserted on the CPU (CI's device), where it is
    exact; the rows everywhere."""
    copies_made(monkeypatch, copies)
    n = 4096
    live, other = KVCache(layer=0), KVCache(layer=0)
    write(live, 0, n)
    write(other, 1, n)
    view = live.snapshot(n - 256)                         # lazy: the last 256 rows of the live buffer
    owned = other.snapshot(n - 256)
    other.free()                                          # the snapshot copies its rows out: owned now
    assert view.lazy and not owned.lazy
    assert live.restore(None, n - 256)

    def page_in():
        assert live.restore(owned, n)
    peak, buffer = page_in_peak(live, page_in)
    assert not view.lazy and owned.lazy                  # the view copied out; the snapshot adopted
    if mx.default_device() == mx.cpu:    # a GPU backend may release the copies' temporaries a little after
        assert peak < view.size + buffer // 2, f"page-in peak {peak} B: a whole buffer ({buffer} B) was copied"
    gens = [0] * n
    np.testing.assert_array_equal(snap_rows(view)[0], expect(gens, n - 256, n)[0])
    gens[n - 256:] = [1] * 256
    np.testing.assert_array_equal(live_rows(live)[0], expect(gens, 0, n)[0])
    view.release()
    owned.release()


@pytest.mark.parametrize("copies", COPIES)
def test_a_first_write_after_a_page_in_copies_its_views_from_the_buffer_before_the_page_in(monkeypatch, copies):
    """The engine's page-in block: a restore overwrites one lazy view (copied out) and writes rows in,
    then the first chunk's before_write copies out another view, past the restored rows. That second
    copy reads the buffer as it was before the restore's write (its rows are the same there), so the
    block evaluates no write: the write is left to the forward, which updates the buffer in place.
    (Read from the written buffer, the copy would evaluate the write while the first copy still reads
    the old buffer, and MLX would copy the whole buffer: the CPU's exact peak shows it.)"""
    copies_made(monkeypatch, copies)
    n = 4096
    live, other = KVCache(layer=0), KVCache(layer=0)
    write(live, 0, n)
    write(other, 1, n - 384)
    high = live.snapshot(n - 256)                         # lazy views of the live buffer: [n-256, n)
    assert live.restore(None, n - 256)                    # (a rewind moves the offset: views stay lazy)
    first = live.snapshot(n - 512)                        # [n-512, n-256): the rows the restore overwrites
    owned = other.snapshot(n - 512)                       # [n-512, n-384) of another generation
    other.free()
    assert first.lazy and high.lazy and not owned.lazy
    assert live.restore(None, n - 512)

    def page_in():
        assert live.restore(owned, n - 384)               # writes [n-512, n-384), copies `first` out
        live.before_write(256)                            # the first chunk [n-384, n-128): copies `high` out
    peak, buffer = page_in_peak(live, page_in)
    assert not first.lazy and not high.lazy
    if cpu_only_allocator():
        assert peak < first.size + high.size + buffer // 2, f"page-in peak {peak} B: a whole buffer ({buffer} B) was copied"
    gens = [0] * n
    np.testing.assert_array_equal(snap_rows(first)[0], expect(gens, n - 512, n - 256)[0])
    np.testing.assert_array_equal(snap_rows(high)[0], expect(gens, n - 256, n)[0])
    gens[n - 512:n - 384] = [1] * 128
    np.testing.assert_array_equal(live_rows(live)[0], expect(gens, 0, n - 384)[0])
    for s in (first, high, owned):
        s.release()


@pytest.mark.parametrize("copies", COPIES)
def test_a_view_of_rows_the_page_in_wrote_copies_the_written_rows(monkeypatch, copies):
    """The other side of the rule above: a restored snapshot adopted as a view whose rows the first
    chunk overwrites (the request resumed inside its node) is copied from the written buffer, so it
    keeps the rows it was restored with, not the ones the buffer held before."""
    copies_made(monkeypatch, copies)
    from impl.caches.evaluation import deferred_eval

    n = 1024
    live, other = KVCache(layer=0), KVCache(layer=0)
    write(live, 0, n)
    write(other, 1, n - 256)
    owned = other.snapshot(n - 512)                       # [n-512, n-256) of generation 1
    other.free()
    assert live.restore(None, n - 512)
    with deferred_eval():
        assert live.restore(owned, n - 384)               # all its rows written; adopted: a view again
        assert owned.lazy
        live.before_write(256)                            # the first chunk [n-384, n-128) overwrites its tail
    assert not owned.lazy
    np.testing.assert_array_equal(snap_rows(owned)[0], expect([1] * n, n - 512, n - 256)[0])
    owned.release()



def owned_run(gen: int, base: int, lengths) -> list:
    """Owned snapshots of generation `gen` covering [base, base + sum(lengths)) in adjacent pieces."""
    src, end = KVCache(layer=0), base + sum(lengths)
    write(src, gen, end)
    snaps, a = [], end
    for n in reversed(lengths):              # views [a - n, a), rewinding down the buffer
        snaps.append(src.snapshot(a - n))
        assert src.restore(None, a - n)
        a -= n
    src.free()                               # every view copies its rows out: owned
    return snaps[::-1]


@given(st.integers(1, 40), st.lists(st.integers(1, 30), min_size=1, max_size=6), st.data())
def test_restore_run_is_restore_of_each_snapshot_in_turn(base, lengths, data):
    """restore_run(snaps, target) writes a run of owned snapshots in one write; every observable must
    be what restoring them one by one gives: the live rows and offset, each snapshot's state (adopted:
    a view again) and the bytes its hook heard (A1), the cache's outstanding views."""
    end = base + sum(lengths)
    target = data.draw(st.integers(end - lengths[-1] + 1, end), label="target")
    kept = data.draw(st.integers(base, base + lengths[0] - 1), label="rewind to")   # inside the first

    def build():
        c = KVCache(layer=0)
        write(c, 0, end + 3)
        inside, past = c.snapshot(end - 1), c.snapshot(end)   # views: one overwritten, one past the run
        snaps = owned_run(1, base, lengths)
        heard = [[] for _ in snaps]
        for s, h in zip(snaps, heard):
            s.on_materialise = h.append
        assert c.restore(None, kept)
        return c, snaps, heard, [inside, past]

    one, s1, h1, v1 = build()
    run, s2, h2, v2 = build()
    for s in s1:
        assert one.restore(s, min(s.end, target))
    assert run.restore_run(s2, target)
    assert run.offset == one.offset == target and run.outstanding_views == one.outstanding_views
    for x, y in zip(live_rows(one), live_rows(run)):
        np.testing.assert_array_equal(x, y)
    gens = [0] * base + [1] * (target - base)
    np.testing.assert_array_equal(live_rows(run)[0], expect(gens, 0, target)[0])
    assert [(s.lazy, s.size) for s in s1] == [(s.lazy, s.size) for s in s2] == [(True, 0)] * len(s2)
    assert h1 == h2 and all(len(h) == 1 and h[0] < 0 for h in h2)
    assert [(v.lazy, v.size) for v in v1] == [(v.lazy, v.size) for v in v2] == [(False, v2[0].size), (True, 0)]
    np.testing.assert_array_equal(snap_rows(v2[0])[0], expect([0] * (end + 3), end - 1, end + 3)[0])
    for s in s1 + s2 + v1 + v2:
        s.release()


def test_restore_run_refuses_a_gap_and_an_unreachable_target():
    c = KVCache(layer=0)
    a, = owned_run(1, 0, [20])                # [0, 20)
    b0, b = owned_run(1, 0, [21, 4])          # [21, 25): not adjacent to a
    d0, d = owned_run(1, 0, [20, 10])         # [20, 30)
    with pytest.raises(CacheError, match="one run of rows"):
        c.restore_run([a, b], 24)
    assert c.offset == 0 and c.keys is None and not a.lazy and not b.lazy
    assert not c.restore_run([a, d], 31)      # past the run's end: refused, unchanged
    assert c.offset == 0 and c.keys is None and not a.lazy and not d.lazy
    assert c.restore_run([a, d], 30) and a.lazy and d.lazy and c.offset == 30
    for s in (a, b, d, b0, d0):
        s.release()
