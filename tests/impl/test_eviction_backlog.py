"""impl/eviction.py: the nodes changed while no eviction runs are read into the E3 order in steps of at
most ``BACKLOG`` (so the first eviction after a long quiet period does not read the whole trie at once),
and victims stay the walk's (check=True: impl.invariants.assert_victim) however early they are read."""
from __future__ import annotations

import pytest

from bench.trie_scale import Conversations, Model, nodes, request
from impl.prefix_cache import PrefixCache


def serve(pc, model, conv, requests: int) -> int:
    """Requests of bench.trie_scale's workload; returns the most changed nodes the order owed after one."""
    most = 0
    for _ in range(requests):
        slot, prompt, answer = conv.next()
        request(pc, model, prompt, answer)
        conv.answered(slot, prompt, answer)
        most = max(most, len(pc.order.changed))
    return most


def test_the_order_reads_its_backlog_in_steps_while_the_trie_grows():
    model, conv = Model(), Conversations(1)
    pc = PrefixCache([model.cache], interval=0, near_end=0)
    pc.BACKLOG = 64
    most = serve(pc, model, conv, 200)
    assert pc.evictions == 0 and nodes(pc) > 4 * pc.BACKLOG      # grown under the budget: no eviction ran
    assert most <= pc.BACKLOG + 32, f"the order owed {most} changed nodes (bound {pc.BACKLOG} + one request's)"
    assert len(pc.order.current) > pc.BACKLOG                    # read before any eviction asked for a victim


@pytest.mark.parametrize("backlog", [0, 7])
def test_victims_stay_the_walks_when_the_backlog_is_read_early(backlog):
    model, conv = Model(), Conversations(2)
    pc = PrefixCache([model.cache], interval=0, near_end=0, check=True)
    pc.BACKLOG = backlog
    serve(pc, model, conv, 60)
    pc.set_budget(pc.counter // 2)
    serve(pc, model, conv, 60)
    assert pc.evictions > 20
