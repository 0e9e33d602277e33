"""targets/sglang/crash.py: an exception raised inside SGLang's code (here the CI fixture, which plays
SGLang's part) is a PANIC finding, shrunk, reported and replayable; one raised in our driver stops the
campaign with its own traceback."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from targets.machine import removals
from targets.sglang import machine, report
from targets.sglang.crash import Guarded, SglangCrash
from targets.sglang.fixture import FakeApi
from targets.sglang.target import SglangTarget


def req(keys):
    return [dict(op="begin", keys=list(keys), spans=[]), dict(op="prefill", max_chunks=0),
            dict(op="step", key=keys[-1]), dict(op="close")]


# two requests sharing [1, 2]: the second splits the first's node, so evicting makes a leaf below [1, 2]
CRASHING = [dict(op="reset", budget=1 << 40)] + req([1, 2, 3, 4]) + req([1, 2, 5, 6]) + \
    [dict(op="set_budget", budget=0)]


def test_a_crash_in_the_cache_is_an_sglang_crash_naming_its_frame():
    from targets.machine import replay
    t = Guarded(SglangTarget(FakeApi("crash")))
    with pytest.raises(SglangCrash) as e:
        replay(t, CRASHING)
    assert e.value.signature[0] == "IndexError" and e.value.where[2] == "evict"
    assert e.value.where[0] == "targets/sglang/fixture.py"
    assert replay(Guarded(SglangTarget(FakeApi(None))), CRASHING) == []       # clean fake: no crash


def test_campaign_reports_the_crash_and_ends_cleanly(tmp_path):
    # one Hypothesis run of up to 400 examples whatever the machine's load (not a time budget)
    c = machine.campaign(SglangTarget(FakeApi("crash")), 0.001, max_examples=400)
    f = c.findings["PANIC"]
    assert "IndexError in evict (targets/sglang/fixture.py:" in f.message
    # reduced to a fixpoint: dropping any request or run of operations loses the crash (how short that
    # is depends on the example Hypothesis drew: 4-14 operations over 120 campaigns)
    for a, b in removals(f.ops):
        lost = machine.crash_of(Guarded(SglangTarget(FakeApi("crash"))), f.ops[:a] + f.ops[b:])
        assert lost is None or lost.signature != ("IndexError", "targets/sglang/fixture.py", "evict"), (a, b)
    out = report.write(tmp_path, c, "fixture (crash)", "--fixture crash").read_text()
    assert "| PANIC |" in out and "`evict (targets/sglang/fixture.py:" in out
    prog = tmp_path / "programs" / "PANIC.json"
    again = machine.crash_of(Guarded(SglangTarget(FakeApi("crash"))), json.loads(prog.read_text())["ops"])
    assert again is not None and again.signature == ("IndexError", "targets/sglang/fixture.py", "evict")
    run = lambda fx: subprocess.run([sys.executable, "-m", "targets.sglang", "--replay", str(prog), "--fixture", fx],
                                    capture_output=True, text=True)
    assert "(PANIC): reproduces" in run("crash").stdout
    assert "stops reproducing at fixture (none)" in run("none").stdout


class Broken(SglangTarget):
    """A driver bug: our own code raises on a close."""

    def close(self):
        raise KeyError("ours")


def test_an_exception_in_our_code_stops_the_campaign():
    with pytest.raises(KeyError, match="ours"):
        machine.campaign(Broken(FakeApi(None)), 0.001, max_examples=50)


class NoFree:
    """An allocator of ours that lacks what the cache calls (`free`): a driver bug."""


def test_an_attribute_missing_on_our_object_is_ours_even_inside_the_cache():
    from targets.machine import replay
    from targets.sglang.fixture import FakeRadixCache
    t = Guarded(SglangTarget(FakeApi(None), cache_factory=lambda api, a: FakeRadixCache(NoFree())))
    with pytest.raises(AttributeError, match="free"):
        replay(t, CRASHING)
