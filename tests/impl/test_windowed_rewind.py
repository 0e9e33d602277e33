"""Regression: a windowed cache's live window after any sequence of writes,
rewinds, snapshots and restores holds exactly the last W positions in order.

Found by the conformance machine: restore(None, t) with t equal to the
current offset reset the ring index of a wrapped window, so the next read
returned the rows rotated (the newest row first)."""
import mlx.core as mx
import numpy as np
from hypothesis import given, strategies as st

from impl.caches.windowed import WindowedCache

W = 6


def rows(p, n):
    return mx.array(np.array([[p + j, p + j] for j in range(n)], dtype=np.float32)[None, None])


def window(c):
    if c.offset == 0:
        return []
    k, _ = c._window_rows()
    return [int(x) for x in np.array(k)[0, 0, :, 1]]


ops = st.lists(st.one_of(
    st.tuples(st.just("write"), st.sampled_from([1, 1, 2, 3, 5, 7])),
    st.tuples(st.just("snapshot"), st.just(0)),
    st.tuples(st.just("restore"), st.integers(0, 1000)),
    st.tuples(st.just("rewind"), st.integers(0, 1000)),
), max_size=30)


@given(ops)
def test_window_holds_the_last_w_positions_in_order(ops):
    c, snaps = WindowedCache(W), []
    for op, arg in ops:
        if op == "write":
            c.update_and_fetch(rows(c.offset, arg), rows(c.offset, arg))
            c.finish_forward(arg)
        elif op == "snapshot" and c.offset:
            snaps.append(c.snapshot(0))
        elif op == "restore" and snaps:
            s = snaps[arg % len(snaps)]
            target = s.end if s.end > W else arg % (s.end + 1)
            assert c.restore(s, target)
        elif op == "rewind":
            c.restore(None, arg % (c.offset + 1))
        assert window(c) == list(range(max(0, c.offset - W), c.offset))
    for s in snaps:
        s.release()
