"""Pure attention holds every cached token's K/V rows once (issue #16, memory at raw KV).

After every request of an interleaved chat on SmolLM2 (conversation switches overwrite the live rows, so
the other conversation's views materialise; switching back restores them), the bytes held — the trie's
owned snapshots plus the live layer buffers' rows in use — equal the raw K/V bytes of the distinct tokens
the trie holds, exactly: a restored snapshot is a view of the live rows again (never a second copy). A live
buffer's growth slack at rest is at most 1/rest_slack of its rows in use (kv.py fit: dropping fewer is not
worth copying them all). Also at a tight budget, where the counter is what eviction sees.
"""
from __future__ import annotations

import pytest

from impl.engine import Engine
from impl.models import load
from impl.trie import walk

SYSTEM = list(range(1000, 1030))


@pytest.fixture(scope="module")
def attention():
    return load("smollm2")


def row_bytes(e) -> int:
    """Raw K+V bytes of one position over all layers (the buffers are float rows [B, H, T, D])."""
    return sum((c.keys.nbytes + c.values.nbytes) // c.keys.shape[2] for c in e.caches
               if c is not None and c.keys is not None)


def held(e) -> int:
    return e.pc.counter + sum(c.nbytes for c in e.caches if c is not None)


def in_use(c) -> int:
    """The rows a live KV buffer must keep: its offset and every outstanding view's end."""
    return max([c.offset] + [s.end for s in c._views])


def slack_bytes(e) -> int:
    """Bytes of live buffer rows past those in use, each buffer's slack checked against fit's bound."""
    total = 0
    for c in kv_caches(e):
        cap = c.keys.shape[2] if c.keys is not None else 0
        assert cap - in_use(c) <= in_use(c) // c.rest_slack, (cap, in_use(c))
        total += (cap - in_use(c)) * (c.keys.nbytes + c.values.nbytes) // cap if cap else 0
    return total


def exact(e) -> bool:
    """Held bytes = raw K/V bytes of the distinct cached tokens + the bounded slack."""
    return held(e) == distinct(e) * row_bytes(e) + slack_bytes(e)


def distinct(e) -> int:
    return sum(len(n.edge) for n in walk(e.pc.root) if n is not e.pc.root)


def chat(e, turns=3):
    """Two conversations sharing SYSTEM, interleaved A1 B1 A2 B2 ...; yields after every request."""
    hist = {"A": SYSTEM + [5, 6, 7], "B": SYSTEM + [8, 9]}
    for t in range(turns):
        for name in "AB":
            prompt = hist[name] + [100 + t, 200 + t]
            r = e.generate(prompt, max_tokens=3, stop_at_eos=False)
            hist[name] = prompt + r.tokens
            yield name, r


@pytest.mark.parametrize("budget", [1 << 62, 0])
def test_every_cached_token_is_held_once(attention, budget):
    e = Engine(attention, budget, check_rules=True, chunk_size=16, capture_interval=0)
    restored = evicted = 0
    for name, r in chat(e):
        restored += r.stats.resumed > len(SYSTEM)            # switching back resumed past the shared prefix
        evicted += r.stats.evictions
        assert exact(e), (name, e.dump())
    if budget:
        assert restored >= 3                                 # the switches did restore stored rows
    else:
        assert evicted > 0                                   # overwritten rows were evicted, not kept twice


def test_restore_turns_owned_copies_back_into_views(attention):
    """A switch back to conversation A restores A's rows that B's prefill had overwritten (owned copies):
    after the restore they are views of the live buffer and own nothing."""
    e = Engine(attention, check_rules=True, chunk_size=16, capture_interval=0)
    it = chat(e)
    next(it), next(it)                                       # A1, B1: A's branch is owned now
    owned_before = e.pc.counter
    assert owned_before > 0
    next(it)                                                 # A2 resumes on A's branch
    path_snaps = [s for n in e.pc.path[1:] for s in n.snaps if s is not None]
    assert path_snaps and all(s.lazy and s.size == 0 for s in path_snaps)
    assert exact(e)


def kv_caches(e):
    return [c for c in e.caches if c is not None and c.kind == "kv"]


def test_a_request_that_runs_to_max_tokens_leaves_no_slack_to_copy(attention, monkeypatch):
    """Engine.generate reserves the rows a request writes (prompt - 1 + max_tokens): the buffer's last
    growth stops there, so close's fit has nothing to copy; a request that stops early is fitted."""
    from impl.caches import kv

    released = []
    fit = kv.SnapshotKVCache.fit
    monkeypatch.setattr(kv.SnapshotKVCache, "fit", lambda self: released.append(fit(self)) or released[-1])
    e = Engine(attention, check_rules=True, chunk_size=16, capture_interval=0)
    prompt = SYSTEM + [5, 6, 7]
    e.generate(prompt, max_tokens=4, stop_at_eos=False)
    rows = len(prompt) - 1 + 4
    assert all(c.keys.shape[2] == rows == c.offset for c in kv_caches(e))
    assert released and not any(released)                   # exact already: fit copied nothing
    released.clear()
    calls = iter(range(100))
    e.generate(prompt + [9, 9], max_tokens=6, stop_at_eos=False, cancel=lambda: next(calls) >= 3)
    assert any(released)                                     # stopped far early: the unused reserved rows went
    assert all(c.keys.shape[2] == c.offset for c in kv_caches(e))
    assert exact(e)


def test_a_request_that_stops_a_row_short_keeps_that_slack_instead_of_copying(attention, monkeypatch):
    """fit keeps slack of at most need // rest_slack rows: dropping one row would copy all of them."""
    from impl.caches import kv

    released = []
    fit = kv.SnapshotKVCache.fit
    monkeypatch.setattr(kv.SnapshotKVCache, "fit", lambda self: released.append(fit(self)) or released[-1])
    e = Engine(attention, check_rules=True, chunk_size=16, capture_interval=0)
    prompt = SYSTEM + [5, 6, 7]
    got = []
    e.generate(prompt, max_tokens=4, stop_at_eos=False, on_token=got.append, cancel=lambda: len(got) >= 3)
    rows = len(prompt) - 1 + 4                               # reserved
    assert len(got) == 3 and all(c.offset == rows - 1 for c in kv_caches(e))
    assert 1 <= (rows - 1) // kv.SnapshotKVCache.rest_slack
    assert all(c.keys.shape[2] == rows for c in kv_caches(e))   # the one unused row is kept ...
    assert released and not any(released)                   # ... and nothing was copied to drop it
    assert exact(e)


def test_a_prefill_of_several_chunks_grows_the_buffer_once(attention, monkeypatch):
    """The prompt's rows are allocated at the request's first growth (reserve's certain rows): the
    prefill's later chunks write in place instead of each copying every row held into a buffer one
    chunk larger. Cold, and resumed with a long new message; the decode's last growth stops exactly at
    the reservation."""
    from impl.caches import kv

    seen = []                                                # the buffer's capacity after each write
    orig = kv.SnapshotKVCache.update_and_fetch

    def update_and_fetch(self, keys, values):
        out = orig(self, keys, values)
        seen.append(self.keys.shape[2])
        return out

    monkeypatch.setattr(kv.SnapshotKVCache, "update_and_fetch", update_and_fetch)
    e = Engine(attention, check_rules=True, chunk_size=64, capture_interval=0)
    prompt = SYSTEM + [5 + i % 500 for i in range(400)]
    for turn in range(2):
        seen.clear()
        r = e.generate(prompt, max_tokens=3, stop_at_eos=False)
        prefill = seen[:-2 * len(kv_caches(e))]              # the chunks' writes and the seed's, not the decode's
        assert r.stats.total - r.stats.resumed > 4 * 64      # several chunks prefilled
        assert set(prefill) == {len(prompt)}, (turn, sorted(set(prefill)))
        assert all(c.keys.shape[2] == len(prompt) + 2 == c.offset for c in kv_caches(e))
        prompt = prompt + r.tokens + [7 + i % 300 for i in range(300)]
    assert exact(e)


def test_a_reservation_never_grows_a_buffer_past_the_step_rule(attention):
    """A reservation beyond the next step grows in steps as mlx-lm does (no up-front allocation for a
    large max_tokens); the growth that reaches it stops there; close ends the reservation."""
    from impl.caches.kv import SnapshotKVCache

    e = Engine(attention, check_rules=True, chunk_size=16, capture_interval=0)
    sizes = []
    prompt = SYSTEM + [5]
    e.generate(prompt, max_tokens=300, stop_at_eos=False,
               on_token=lambda _: sizes.append({c.keys.shape[2] for c in kv_caches(e)}))
    assert sizes[0] == {SnapshotKVCache.step}                # not len(prompt) - 1 + 300 at once
    assert sizes[-1] == {len(prompt) - 1 + 300}              # the last growth stopped at the reservation
    assert all(c._reserved == 0 and c.keys.shape[2] == c.offset for c in kv_caches(e))
