"""KVCache snapshot protocol on synthetic rows (no model): lazy views, materialisation, G1, S1, A1, A2,
and random op sequences against a shadow of the stream. Copy-out before writes, page-ins and
restore_run: tests/impl/test_caches_kv_writes.py.

Row p of the stream is filled with a value that identifies (generation, position), so every
comparison is exact: a snapshot must hold exactly the rows written for its range when it was taken
(tests/support/kv_rows.py).
"""

from __future__ import annotations

import gc

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from impl.caches import CacheError, KVCache, MergeError
from impl.platform import cpu_only_allocator
from tests.support.kv_rows import DK, DV, H, expect, live_rows, rows, snap_rows, write
from tests.support.kv_rows import no_leaks  # noqa: F401 (autouse: A2, no snapshot leaks)


def test_lazy_view_materialises_only_when_overwritten():
    c = KVCache(layer=0)
    write(c, 1, 20)
    fired = {}
    views = {r: c.snapshot(0) for r in [(0, 20)]}
    a = c.merge_snapshots(None, None)  # no-op
    assert a is None
    s1, rest = c.split(views.pop((0, 20)), 5)
    s2, s3 = c.split(rest, 12)
    for name, s in (("s1", s1), ("s2", s2), ("s3", s3)):
        assert s.lazy and s.size == 0
        s.on_materialise = lambda d, name=name: fired.setdefault(name, []).append(d)
    # ordinary appends never touch views
    write(c, 1, 4)
    assert not fired and c.offset == 24
    # rewind to 8 and write 3 rows: only [5,12) overlaps [8,11)
    assert c.restore(None, 8)
    write(c, 2, 3)
    assert list(fired) == ["s2"] and fired["s2"] == [s2.size] and s2.size == 7 * (H * DK + H * DV) * 4
    assert not s2.lazy and s1.lazy and s3.lazy
    # the materialised view still holds generation-1 rows
    np.testing.assert_array_equal(snap_rows(s2)[0], np.array(rows(1, 5, 12)[0]))
    # restore the old stream: [0,5) lazy (no copy), then [5,12) owned, then [12,20) lazy
    assert c.restore(None, 5)
    assert c.restore(s1, 5)
    assert c.restore(s2, 12)  # owned: writes rows [5,12), which no remaining view covers
    # ... and is a view of them again: the rows are never held twice (its owner hears -size)
    assert s2.lazy and s2.size == 0 and fired["s2"] == [7 * (H * DK + H * DV) * 4, -7 * (H * DK + H * DV) * 4]
    assert s3.lazy
    assert c.restore(s3, 20)
    np.testing.assert_array_equal(live_rows(c)[0], np.array(rows(1, 0, 20)[0]))
    np.testing.assert_array_equal(live_rows(c)[1], np.array(rows(1, 0, 20)[1]))
    # free materialises everything left, once each
    c.free()
    assert fired.keys() == {"s1", "s2", "s3"} and [len(fired[k]) for k in ("s1", "s2", "s3")] == [1, 3, 1]
    assert not any(s.lazy for s in (s1, s2, s3))
    np.testing.assert_array_equal(snap_rows(s3)[0], np.array(rows(1, 12, 20)[0]))
    for s in (s1, s2, s3):
        s.release()


def test_g1_merge_rules_and_split_identity():
    c = KVCache(layer=0)
    write(c, 1, 30)
    a, b, d = c.snapshot(0), None, None
    a, b = c.split(a, 10)
    b, d = c.split(b, 20)
    # non-adjacent: [0,10) + [20,30)
    with pytest.raises(MergeError, match=r"^G1:"):
        c.merge_snapshots(a, d)
    with pytest.raises(MergeError, match=r"^G1:"):
        c.merge_snapshots(b, a)  # wrong order is not adjacent either
    # adjacent lazy views merge by arithmetic
    ab = c.merge_snapshots(a, b)
    assert ab.lazy and (ab.start, ab.end) == (0, 20) and a.closed and b.closed
    whole = c.snapshot(0)
    # owned pieces: materialise by freeing, then split/merge must copy exactly
    c2 = KVCache(layer=0)
    write(c2, 1, 30)
    ref = c2.snapshot(0)
    c2.free()
    assert not ref.lazy
    ref_rows = snap_rows(ref)
    h, t = c2.split(ref, 13)
    assert not h.lazy and h.size + t.size == 30 * (H * DK + H * DV) * 4
    back = c2.merge_snapshots(h, t)
    np.testing.assert_array_equal(snap_rows(back)[0], ref_rows[0])
    np.testing.assert_array_equal(snap_rows(back)[1], ref_rows[1])
    # adjacent merge equals the contiguous snapshot (lazy + owned mix)
    merged = c.merge_snapshots(ab, d)
    np.testing.assert_array_equal(snap_rows(merged)[0], snap_rows(whole)[0])
    # merging with a missing side yields None and closes the other
    x = c.snapshot(25)
    assert c.merge_snapshots(x, None) is None and x.closed
    for s in (whole, back, merged):
        s.release()


def test_bad_input_leaves_cache_unchanged():
    c = KVCache(layer=3)
    write(c, 1, 12)
    before = (c.offset, live_rows(c))
    s = c.snapshot(4)  # [4,12)
    assert not c.restore(s, 13)  # past the snapshot
    assert not c.restore(s, 4)  # zero-width target: t must be > start
    assert not c.restore(None, 13)  # past the live offset
    with pytest.raises(CacheError):
        c.restore(None, -1)
    with pytest.raises(CacheError):
        c.snapshot(-1)
    with pytest.raises(CacheError):
        c.snapshot(13)
    other_layer = KVCache(layer=4)
    write(other_layer, 1, 12)
    o = other_layer.snapshot(0)
    with pytest.raises(CacheError, match="layer"):
        c.restore(o, 5)
    with pytest.raises(CacheError, match="layer"):
        c.merge_snapshots(o, None)
    assert not o.closed
    # a snapshot whose start is past the live offset cannot be restored (the prefix is missing)
    assert c.restore(None, 2)
    assert not c.can_restore(s, 8)
    assert not c.restore(s, 8)
    assert c.offset == 2
    assert c.restore(None, 12) is False
    # split outside the range
    with pytest.raises(CacheError):
        c.split(s, 4)
    with pytest.raises(CacheError):
        c.split(s, 12)
    # wrong kind
    from impl.caches import RecurrentCache

    r = RecurrentCache(2, layer=3)
    with pytest.raises(CacheError, match="kind"):
        r.restore(s, 12)
    # closed snapshot
    s.release()
    with pytest.raises(CacheError, match="A2"):
        s.release()
    with pytest.raises(CacheError, match="A2"):
        c.restore(s, 12)
    o.release()
    # the live rows never changed
    assert c.offset == 2
    np.testing.assert_array_equal(live_rows(c)[0], before[1][0][:, :, :2])


def test_prepare_captures_validation_and_interior_ranges():
    c = KVCache(layer=0)
    write(c, 1, 5)
    for bad in ([4], [7, 6], [6, 6], [-1]):
        with pytest.raises(CacheError):
            c.prepare_captures(bad)
    c.prepare_captures([5, 7, 9, 30])
    with pytest.raises(CacheError, match="previous schedule"):
        c.prepare_captures([10])
    with pytest.raises(CacheError, match="scheduled"):
        c.restore(None, 3)
    write(c, 1, 10)  # one write crosses 7 and 9 (interior) and reaches 15
    caps = c.take_captures()
    assert caps[0] is None  # zero width at the current offset
    assert (caps[1].start, caps[1].end) == (5, 7) and (caps[2].start, caps[2].end) == (7, 9)
    assert caps[3] is None  # not crossed
    np.testing.assert_array_equal(snap_rows(caps[2])[0], np.array(rows(1, 7, 9)[0]))
    for s in caps[1:3]:
        s.release()


def test_finish_forward_checks_consistency():
    c = KVCache(layer=0)
    k, v = rows(1, 0, 3)
    c.update_and_fetch(k, v)
    with pytest.raises(CacheError, match="T3"):
        c.finish_forward(4)


def test_free_releases_memory():
    mx.synchronize()
    base = mx.get_active_memory()
    c = KVCache(layer=0)
    write(c, 1, 300)
    snaps = [c.snapshot(0), c.snapshot(100)]
    c.free()
    assert all(not s.lazy and s.size > 0 for s in snaps)
    for s in snaps:
        s.release()
    del snaps
    mx.synchronize()
    assert mx.get_active_memory() <= base


# --- property test: random op sequences against a shadow of the stream ------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(1, 9)),
        st.tuples(st.just("rewind"), st.integers(0, 40)),
        st.tuples(st.just("snap"), st.integers(0, 40)),
        st.tuples(st.just("restore"), st.integers(0, 40), st.integers(0, 40)),
        st.tuples(st.just("merge"), st.integers(0, 40)),
        st.tuples(st.just("split"), st.integers(0, 40), st.integers(0, 40)),
        st.tuples(st.just("close"), st.integers(0, 40)),
        st.tuples(st.just("free"),),
        st.tuples(st.just("fit"),),
    ),
    max_size=30,
)


EXACT_BYTES = cpu_only_allocator()     # (see the MEM check below)


def _warm() -> None:
    """Every kind of step once on a throwaway cache: MLX's first use of an operation may keep a few
    bytes of its own (88 B seen), which the MEM check below would count."""
    c = KVCache(layer=0)
    write(c, 0, 6)
    a, b = c.split(c.snapshot(0), 3)
    assert c.restore(None, 1)
    write(c, 1, 4)
    m = c.merge_snapshots(a, b)
    h, t = c.split(m, 2)
    assert c.restore(None, 0) and c.restore(h, 2) and c.restore(t, 4)
    c.fit()
    c.free()
    for s in (h, t):
        np.array(s._rows()[0])
        s.release()


@settings(max_examples=max(20, settings.default.max_examples // 2))
@given(ops)
@example([("write", 10), ("snap", 0), ("split", 0, 4), ("rewind", 0), ("write", 10), ("close", 0)])
@example([("write", 9), ("snap", 0), ("split", 0, 2), ("split", 1, 2), ("rewind", 3), ("write", 1), ("snap", 0),
          ("rewind", 0), ("write", 1), ("merge", 0)])     # merging an owned snapshot and one copied out of a view
def test_random_sequences_keep_every_snapshot_exact(seq):
    limit = mx.set_cache_limit(0)    # no freed buffer reused for a smaller array: active bytes are exact
    _warm()
    gc.collect()
    mx.synchronize()
    base = mx.get_active_memory()
    c = KVCache(layer=0)
    gen = 0
    gens: list[int] = []  # generation that wrote live position p
    held = []  # (snapshot, expected rows, fired list)
    try:
        for op in seq:
            if op[0] == "write":
                gen += 1
                n = op[1]
                gens = gens[: c.offset] + [gen] * n
                write(c, gen, n)
            elif op[0] == "rewind":
                t = op[1]
                reachable = t <= c.offset
                ok = c.restore(None, t)
                assert ok == reachable
                if ok:
                    gens = gens[:t]
            elif op[0] == "snap":
                start = min(op[1], c.offset)
                s = c.snapshot(start)
                if start == c.offset:
                    assert s is None
                else:
                    fired = [s.size]
                    s.on_materialise = fired.append
                    held.append((s, expect(gens, start, c.offset), fired))
            elif op[0] == "restore" and held:
                s, exp, fired = held[op[1] % len(held)]
                t = op[2]
                can = c.can_restore(s, t)
                before = (c.offset, live_rows(c) if c.keys is not None else None)
                assert c.restore(s, t) == can == (s.start <= c.offset and s.start < t <= s.end)
                if can:
                    gens = gens[: s.start] + [gens_of(exp, s, p) for p in range(s.start, t)]
                    assert s.lazy                    # its rows are live: it is a view of them (never twice)
                else:
                    assert c.offset == before[0]
            elif op[0] == "merge" and len(held) >= 2:
                i = op[1] % (len(held) - 1)
                (a, ea, fa), (b, eb, fb) = held[i], held[i + 1]
                if a.end != b.start:
                    with pytest.raises(MergeError, match="^G1:"):
                        c.merge_snapshots(a, b)
                else:
                    m = c.merge_snapshots(a, b)
                    assert a.closed and b.closed
                    fired = [m.size]
                    m.on_materialise = fired.append
                    held[i : i + 2] = [(m, (np.concatenate([ea[0], eb[0]], 2), np.concatenate([ea[1], eb[1]], 2)), fired)]
            elif op[0] == "split" and held:
                i = op[1] % len(held)
                s, e, _ = held[i]
                if s.end - s.start >= 2:
                    at = s.start + 1 + op[2] % (s.end - s.start - 1)
                    h, t = c.split(s, at)
                    assert h.lazy == t.lazy
                    j = at - s.start
                    fh, ft = [h.size], [t.size]
                    h.on_materialise, t.on_materialise = fh.append, ft.append
                    held[i : i + 1] = [
                        (h, (e[0][:, :, :j], e[1][:, :, :j]), fh),
                        (t, (e[0][:, :, j:], e[1][:, :, j:]), ft),
                    ]
            elif op[0] == "close" and held:
                s, _, _ = held.pop(op[1] % len(held))
                s.release()
            elif op[0] == "fit":
                cap = c.keys.shape[2] if c.keys is not None else 0
                c.fit()
                need = max([c.offset] + [s.end for s, _, _ in held if s.lazy])
                kept = c.keys.shape[2] if c.keys is not None else 0
                if cap - need <= need // c.rest_slack:
                    assert kept == cap                          # small slack: not worth a copy, kept
                else:
                    assert kept == need                         # exactly the rows in use
            elif op[0] == "free":
                c.free()
                gens = []
                assert all(not s.lazy for s, _, _ in held)
            # invariants after every step
            # MEM, before anything reads a snapshot: what MLX holds is the live buffer and the snapshots'
            # owned bytes, exactly (no released row stays held behind another array, e.g. by a pending
            # merge or split of rows read from the live buffer). Byte-exact with a CPU-only build of MLX
            # (impl.platform.cpu_only_allocator): a CUDA build's allocator rounds small blocks up, for
            # CPU-device arrays too (a 16,384 B buffer counted 24,832 B on the H200)
            if c.keys is not None:
                mx.eval(c.keys, c.values)
            held_bytes, owned = mx.get_active_memory() - base, c.nbytes + sum(s.size for s, _, _ in held)
            assert held_bytes == owned if EXACT_BYTES else held_bytes >= owned, op
            if c.keys is not None and c.offset:
                np.testing.assert_array_equal(live_rows(c)[0], expect(gens, 0, c.offset)[0])
            assert c.outstanding_views == sum(s.lazy for s, _, _ in held)
            for s, e, fired in held:
                k, v = snap_rows(s)
                np.testing.assert_array_equal(k, e[0])
                np.testing.assert_array_equal(v, e[1])
                # A1: the deltas the hook reported, from the size at creation, add up to the size now,
                # and they alternate (+size on materialising, -size when a restore makes it a view again)
                assert sum(fired) == s.size
                assert all(x == -y for x, y in zip(fired[1:], fired[2:]))
                if s.lazy:
                    assert s.size == 0
                    assert s.end <= c.keys.shape[2]
                else:
                    assert s.size == (s.end - s.start) * (H * DK + H * DV) * 4
    finally:
        mx.set_cache_limit(limit)
        for s, _, _ in held:
            if not s.closed:
                s.release()


def gens_of(exp, s, p):
    """The generation encoded in the expected K row of position p of snapshot s."""
    val = exp[0][0, 0, p - s.start, 0]
    return int(round((val - p) / 1000))
