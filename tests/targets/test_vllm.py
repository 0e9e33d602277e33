"""targets/vllm: the adapter, view and rules on a fake manager with planted faults (no vLLM needed),
and, where vLLM's managers can be imported (installed, or VLLM_SRC=a source tree), the same on vLLM.

The fake (targets.vllm.fake) has vLLM's call surface; each planted fault must be flagged by the
rule it breaks on a fixed program, the clean fake by none in a short hunt, and every rule id is
applied or explained. The real-engine tests replay the saved findings (targets/vllm/findings/) on
the version they name when that version is the one importable, and run a short clean hunt.
"""
import json
import os
from pathlib import Path

import pytest

from targets.base import ALL_RULES
from targets.machine import Hunt, hunt_once, replay
from targets.vllm.adapter import VllmTarget
from targets.vllm.fake import FakeEngine

R = {"op": "reset", "budget": 400, "interval": 8, "near_end": 4, "chunk": 8}


def begin(*keys):
    return {"op": "begin", "keys": list(keys), "spans": []}


PREFILL, CLOSE = {"op": "prefill", "max_chunks": 0}, {"op": "close"}

# fault -> (layout, program, the rule it breaks)
PLANTED = {
    "mamba-extend": ("mamba", [begin(1, 2), CLOSE, begin(1, 2)], "C1"),
    "draft-cached": ("full-spec", [begin(1, 2, 3), PREFILL, {"op": "step", "key": 3}, {"op": "step", "key": 4},
                                   CLOSE], "A1"),
    "stale-map": ("full", [{"op": "set_budget", "budget": b} for b in (64,)] + [begin(1, 2, 4, 4, 5), CLOSE] +
                  [{"op": "set_budget", "budget": b} for b in (400, 160, 400, 0)], "A1"),
}


def test_every_rule_is_applied_or_explained():
    from targets.vllm.rules import NOT_APPLICABLE, RULES
    assert set(RULES) | set(NOT_APPLICABLE) == set(ALL_RULES)
    assert all(why and "\n" not in why for why in NOT_APPLICABLE.values())


@pytest.mark.parametrize("fault", sorted(PLANTED))
def test_a_planted_fault_is_flagged_by_its_rule(fault):
    layout, ops, rule = PLANTED[fault]
    program = [dict(R, layout=layout)] + ops
    assert rule in {r for r, _ in replay(VllmTarget(FakeEngine({fault})), program)}
    assert replay(VllmTarget(FakeEngine()), program) == []          # the clean fake: nothing


def test_the_clean_fake_breaks_no_rule_in_a_short_hunt():
    t = VllmTarget(FakeEngine())
    for layout in ("hybrid", "full-spec", "mamba-eagle"):
        t.reset(layout=layout)
        hunt = Hunt(rules=frozenset(t.RULES) | {"PANIC"})
        e = hunt_once(t, hunt, dict(interval=8, near_end=4, chunk=8, layout=layout), max_examples=15, shrink=False)
        assert e is None, f"{layout}: {e}"
        assert hunt.steps > 100


def test_a_finding_exports_a_pytest_module():
    from targets.vllm.export import export
    layout, ops, _ = PLANTED["mamba-extend"]
    text = export(dict(rule="C1", layout=layout, ops=[dict(R, layout=layout)] + ops, version="fake"))
    compile(text, "test_c1.py", "exec")
    assert "def test_c1_mamba" in text and "get_computed_blocks" in text


# ------------------------------------------------------------------ the real vLLM, where importable
def _vllm():
    try:
        from targets.vllm.engine import load
        return load(os.environ.get("VLLM_SRC") or None)
    except Exception as e:                  # noqa: BLE001
        pytest.skip(f"vLLM's prefix-cache managers are not importable here ({type(e).__name__}: {e}); "
                    "install vllm --no-deps as docs/peers.md says, or set VLLM_SRC to a source tree")


FINDINGS = sorted((Path(__file__).resolve().parents[2] / "targets" / "vllm" / "findings").glob("*.json"))


@pytest.mark.parametrize("path", FINDINGS, ids=[p.stem for p in FINDINGS])
def test_a_saved_finding_reproduces_on_its_version_only(path):
    eng = _vllm()
    rec = json.loads(path.read_text())
    got = {r for r, _ in replay(VllmTarget(eng), rec["ops"])}
    if eng.version in rec["reproduces_on"]:
        assert rec["rule"] in got
    elif eng.version in rec["fixed_on"]:
        assert rec["rule"] not in got
    else:
        pytest.skip(f"vLLM {eng.version}: the finding names {rec['reproduces_on']} and {rec['fixed_on']}")


def test_vllm_breaks_no_rule_in_a_short_hunt():
    eng = _vllm()
    t = VllmTarget(eng)
    t.reset(layout="hybrid")
    hunt = Hunt(rules=frozenset(t.RULES) | {"PANIC"})
    e = hunt_once(t, hunt, dict(interval=8, near_end=4, chunk=8, layout="hybrid"), max_examples=10, shrink=False)
    if e is not None:
        pytest.skip(f"vLLM {eng.version} breaks {e.rule} (a finding, not a test failure): {e}")
