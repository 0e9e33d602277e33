"""A request's plan (REFERENCE section 2, steps 1-3): where captures go and
where prefill chunks end. Pure functions with CrossHair contracts (pre/post
lines, checked by tests/spec/test_crosshair.py and, at run time, by
tests/spec/test_contract_monitor.py); spec.cache calls them, impl mirrors them
in impl/prefix_cache.py."""
from __future__ import annotations

from spec.media import capture_ceiling, extend_chunk


def schedule(n: int, resume: int, matched: int, spans: list[tuple[int, int]], interval: int,
             near_end: int, boundaries: tuple[int, ...] = ()) -> list[tuple[int, bool]]:
    """Capture offsets for a prompt of n keys resumed at `resume` (section 2
    steps 1-2): the branch point (`matched`, when resume < matched; not user;
    `begin` has already floored it off any non-causal span, M3), periodic
    multiples of `interval`, n - near_end and the message boundaries the caller
    names (user), moved off non-causal spans (M2), kept in (resume, n - 1],
    sorted and unique, a user flag winning a tie.

    pre: 0 <= resume <= matched < n
    pre: not any(p < matched < e for (p, e) in spans)
    pre: interval >= 0 and near_end >= 0
    pre: all(0 <= p < e < n for (p, e) in spans)
    pre: all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
    post: all(resume < c <= n - 1 for (c, _) in __return__)
    post: all(__return__[i][0] < __return__[i + 1][0] for i in range(len(__return__) - 1))
    post: not any(p < c < e for (c, _) in __return__ for (p, e) in spans)
    """
    wanted = {}
    if resume < matched:
        wanted[matched] = False
    user = [k * interval for k in range(1, n // interval + 1) if k * interval < n] if interval else []
    if n - near_end > 0:
        user.append(n - near_end)
    user += [b for b in boundaries if 0 < b < n]
    for c in user:
        wanted[capture_ceiling(c, spans)] = True
    return sorted((c, u) for c, u in wanted.items() if resume < c <= n - 1)


def next_chunk_end(p: int, target: int, chunk: int, cuts: list[int], spans: list[tuple[int, int]]) -> int:
    """End of the prefill chunk starting at p: at most `chunk` keys, cut at
    the next scheduled capture when whole-state layers need a forward
    boundary there (`cuts`), then extended to the end of a non-causal span it
    would split (M1).

    pre: 0 <= p < target and chunk > 0
    pre: all(0 <= a < e <= target for (a, e) in spans)
    pre: all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
    pre: not any(a < p < e for (a, e) in spans)
    post: p < __return__ <= target
    post: not any(a < __return__ < e for (a, e) in spans)
    """
    q = min(p + chunk, target)
    q = min([q] + [c for c in cuts if c > p])
    return extend_chunk(q, spans)
