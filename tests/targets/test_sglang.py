"""targets/sglang: the adapter, view and rules on a planted-fault fake (always), and on SGLang's own
RadixCache when sglang is importable (SGLANG_PYTHON's venv: targets/sglang/install.sh), else skipped."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from targets.machine import replay
from targets.sglang.fixture import FAULTS, FakeApi
from targets.sglang.target import SglangTarget


def req(keys, gen=()):
    return [dict(op="begin", keys=list(keys), spans=[]), dict(op="prefill", max_chunks=0),
            *[dict(op="step", key=k) for k in [keys[-1], *gen]], dict(op="close")]


RESET = [dict(op="reset", budget=1 << 40)]
PROGRAMS = {   # fault -> (a program that exposes it, the rule it breaks)
    "split-value": (RESET + req([1, 2, 3, 4, 5], [6]) + req([1, 2, 3, 9, 9]), "S1"),
    "double-free": (RESET + req([1, 2, 3, 4, 5]) + req([1, 2, 3, 6, 6]) + [dict(op="set_budget", budget=0)], "A2"),
    "mru": (RESET + req([1, 2, 3, 4, 5]) + req([2, 2, 3, 4, 5]) + [dict(op="set_budget", budget=24)], "E3"),
    "short-match": (RESET + req([1, 2, 3, 4, 5, 6]) + req([1, 2, 3, 4, 9, 9]), "C2"),
}
CLEAN = RESET + req([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [2, 3]) + req([1, 2, 3, 4, 5, 9]) + \
    req([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 2, 3, 4]) + [dict(op="set_budget", budget=40)] + req([2, 2]) + \
    [dict(op="begin", keys=[1, 2, 3, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7], spans=[]), dict(op="prefill", max_chunks=1),
     dict(op="close"), dict(op="set_budget", budget=0)]


def test_rules_cover_every_id():
    from targets.base import ALL_RULES
    from targets.sglang.rules import CAUSES, NOT_APPLICABLE, RULES
    assert set(RULES) | set(NOT_APPLICABLE) == set(ALL_RULES)
    assert set(RULES) <= set(CAUSES)


@pytest.mark.parametrize("fault", FAULTS)
def test_each_planted_fault_is_caught_by_its_rule(fault):
    ops, rule = PROGRAMS[fault]
    assert rule in {r for r, _ in replay(SglangTarget(FakeApi(fault)), ops)}
    assert replay(SglangTarget(FakeApi(None)), ops) == []        # the same program on the clean fake


def test_clean_fake_breaks_no_rule():
    assert replay(SglangTarget(FakeApi(None)), CLEAN) == []


def test_campaign_on_the_fixture_finds_and_shrinks(tmp_path):
    from targets.sglang import machine, report
    # one Hypothesis run of up to 400 examples whatever the machine's load (not a time budget)
    c = machine.campaign(SglangTarget(FakeApi("double-free")), 0.001, max_examples=400)
    assert "A2" in c.findings and c.findings["A2"].length <= 12
    out = report.write(tmp_path, c, "fixture (double-free)", "--fixture double-free")
    assert "RadixCache.evict" in out.read_text() and (tmp_path / "programs" / "A2.json").exists()
    compile((tmp_path / "programs" / "test_a2_sglang.py").read_text(), "test_a2_sglang.py", "exec")


def test_replay_names_where_a_program_stops(tmp_path):
    ops, rule = PROGRAMS["short-match"]
    p = tmp_path / "C2.json"
    p.write_text(json.dumps(dict(rule=rule, ops=ops)))
    run = lambda fx: subprocess.run([sys.executable, "-m", "targets.sglang", "--replay", str(p), "--fixture", fx],
                                    capture_output=True, text=True)
    bad, good = run("short-match"), run("none")
    assert bad.returncode == 1 and "still reproduces" in bad.stdout
    assert good.returncode == 0 and "stops reproducing at fixture (none)" in good.stdout


# ------------------------------------------------------------------ the real engine (optional)
HAVE_SGLANG = importlib.util.find_spec("sglang") is not None and importlib.util.find_spec("torch") is not None
needs_sglang = pytest.mark.skipif(not HAVE_SGLANG, reason="sglang (and torch) not installed in this venv: "
                                  "targets/sglang/install.sh, then SGLANG_PYTHON=... ./dev python -m pytest")


@needs_sglang
def test_exported_tests_pass_on_a_clean_tree(tmp_path):
    """The exported pytest test replays through SGLang's public API: the clean program passes."""
    from targets.sglang.export import export
    f = tmp_path / "test_clean_sglang.py"
    f.write_text(export("S1", "clean", "none", CLEAN))
    boot = ("from targets.sglang import stubs; stubs.install(); import sglang.srt.mem_cache.radix_cache; "
            "stubs.settle(); import pytest, sys; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', sys.argv[1]]))")
    r = subprocess.run([sys.executable, "-c", boot, str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:]


@needs_sglang
def test_sglang_radix_cache_clean_programs():
    from targets.sglang import engine
    t = SglangTarget(engine.load())
    assert replay(t, CLEAN) == []
    for fault, (ops, _) in PROGRAMS.items():
        assert replay(t, ops) == [], fault
