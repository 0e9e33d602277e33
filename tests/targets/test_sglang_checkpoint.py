"""targets/sglang/full_req: RadixCache driven through 0.5.23's own request calls (checkpoint, lock / unlock,
free_kv_row), on a planted-fault fake (always) and on SGLang's own RadixCache when SGLANG_SRC names a
release that has `checkpoint` (0.5.23), else skipped with the reason."""
from __future__ import annotations

import importlib.util
import os

import pytest

from targets.machine import replay
from targets.sglang.fixture_checkpoint import FAULTS
from targets.sglang.full_req import fixture_target


def req(keys, gen=()):
    return [dict(op="begin", keys=list(keys), spans=[]), dict(op="prefill", max_chunks=0),
            *[dict(op="step", key=k) for k in [keys[-1], *gen]], dict(op="close")]


PROGRAM = [dict(op="reset", budget=1 << 40)] + req([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [2, 3]) + \
    req([1, 2, 3, 4, 5, 9]) + req([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 2, 3, 4]) + \
    [dict(op="set_budget", budget=40)] + req([2, 2]) + req([2, 2]) + req([1, 2, 3, 7, 7]) + req([1, 2, 3, 7, 7, 1]) + \
    [dict(op="set_budget", budget=0)]
RULE = {"split-value": "S1", "double-free": "A2", "mru": "E3", "short-match": "C2", "keep-duplicates": "A2"}


@pytest.mark.parametrize("fault", FAULTS)
def test_each_planted_fault_is_caught_through_checkpoint(fault):
    assert RULE[fault] in {r for r, _ in replay(fixture_target(fault), PROGRAM)}


def test_clean_checkpoint_fake_breaks_no_rule():
    assert replay(fixture_target(None), PROGRAM) == []


SRC = os.environ.get("SGLANG_SRC", "")


@pytest.mark.skipif(not SRC or importlib.util.find_spec("torch") is None,
                    reason="SGLANG_SRC (sglang 0.5.23, whose RadixCache has checkpoint) and torch not given: "
                    "targets/sglang/install.sh, then SGLANG_SRC=... SGLANG_PYTHON=... ./dev python -m pytest")
def test_real_radix_cache_through_checkpoint():
    from targets.sglang import engine
    from targets.sglang.full_req import CheckpointTarget, has_checkpoint
    api = engine.load(SRC)
    if not has_checkpoint(api):
        pytest.skip(f"{SRC}: this RadixCache has no checkpoint (older than 0.5.23)")
    assert replay(CheckpointTarget(api), PROGRAM) == []
