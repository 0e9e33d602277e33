"""MlxLmTarget speaks targets/base.py's interface: it declares every rule (applicable or with a
one-line reason), begin returns (matched, resume), and its view passes spec.rules' structural and
accounting predicates (T1, T2, A1; E1 with a budget it respects)."""
from spec import rules as spec_rules
from targets.base import ALL_RULES
from targets.mlx_lm.target import MlxLmTarget


def test_rules_declared():
    t = MlxLmTarget
    assert set(t.RULES) | set(t.NOT_APPLICABLE) == set(ALL_RULES)
    assert all(len(r.splitlines()) == 1 for r in t.NOT_APPLICABLE.values())


def test_operations_and_view():
    t = MlxLmTarget("qwen3next", prompt_cache_size=10)
    assert t.begin([1, 2, 3, 4]) == (0, 0)
    assert t.prefill() is True
    t.step(5)
    t.close()
    matched, resume = t.begin([1, 2, 3, 9])
    assert (matched, resume) == (3, 3)                 # the "user" segment entry [1 2 3]
    t.step(7)
    t.close()
    v = t.view()
    assert v.counter == sum(s.nbytes for n in v.walk() for s in n.snaps.values()) > 0
    assert spec_rules.check(v, rules={"T1", "T2", "A1", "E1"}) == []
    assert not t.checker.violations()
