"""The mutation run's bookkeeping (stateful_tests/mutation.py) and the list of
equivalent mutants in docs/mutation.md. The run itself is nightly
(`./dev mutation`); these checks are cheap and keep the list honest in CI:
every explained mutant names a function that exists and a line that is
still in its source."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from stateful_tests.mutation import EXPLAINED, Change, change_of, explained, function_of, verdict

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "impl" / f for f in ("trie.py", "prefix_cache.py", "plan.py", "eviction.py", "settled.py")]

DIFF = """--- impl/prefix_cache.py
+++ impl/prefix_cache.py
@@ -3,7 +3,7 @@
     cache = self.caches[i]
     if x == 0:
         return "reset"
-    if x <= common and cache.can_restore(None, x):
+    if x < common and cache.can_restore(None, x):
         return "live"
"""


def test_function_names_from_mutmut_names():
    assert function_of("impl.prefix_cache.xǁPrefixCacheǁ_source__mutmut_7") == "PrefixCache._source"
    assert function_of("impl.trie.x_match__mutmut_12") == "match"
    assert function_of("impl.prefix_cache.x__inside__mutmut_1") == "_inside"


def test_a_diff_becomes_its_change():
    c = change_of("impl.prefix_cache.xǁPrefixCacheǁ_source__mutmut_7", DIFF)
    assert c == Change("PrefixCache._source", "if x <= common and cache.can_restore(None, x):",
                       "if x < common and cache.can_restore(None, x):")


def test_explanations_parse_and_bad_lines_are_refused():
    text = ("### PrefixCache._source\n"
            "- `if x <= common and cache.can_restore(None, x):` → `if x < common and cache.can_restore(None, x):`"
            " — a snapshot exists at x == common\n")
    assert explained(text) == {Change("PrefixCache._source", "if x <= common and cache.can_restore(None, x):",
                                      "if x < common and cache.can_restore(None, x):"):
                               "a snapshot exists at x == common"}
    with pytest.raises(ValueError, match="line 2"):
        explained("### match\n- `a` -> `b` because\n")


def test_verdict_separates_killed_equivalent_unexplained_and_stale():
    eq, other, gone = (Change("f", "a", "b"), Change("f", "a", "c"), Change("g", "x", "y"))
    status = {"m1": "killed", "m2": "timeout", "m3": "survived", "m4": "survived", "m5": "no tests"}
    changes = {"m3": eq, "m4": other, "m5": eq}
    v = verdict(status, changes, {eq: "why", gone: "why"})
    assert v["detected"] == 2 and v["equivalent"] == ["m3"]
    assert v["unexplained"] == ["m4", "m5"]          # a "no tests" mutant is never explained away
    assert v["stale"] == [gone] and not v["ok"]
    assert v["score"] == pytest.approx(2 / 5) and v["score_without_equivalent"] == pytest.approx(2 / 4)
    assert verdict({"m1": "killed", "m3": "survived"}, {"m3": eq}, {eq: "why"})["ok"]
    assert verdict({"m1": "killed"}, {}, {eq: "why"}, partial=True)["ok"]     # a partial run: nothing stale
    assert not verdict({"m1": "killed"}, {}, {eq: "why"})["ok"]
    assert not verdict({}, {}, {})["ok"]


def _functions(path: Path) -> dict:
    """"Class.method" / "function" -> its source lines, stripped."""
    source = path.read_text()
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body:
        items = [(f"{node.name}.{f.name}", f) for f in node.body if isinstance(f, ast.FunctionDef)] \
            if isinstance(node, ast.ClassDef) else [(node.name, node)] if isinstance(node, ast.FunctionDef) else []
        for name, f in items:
            out[name] = {ln.strip() for ln in lines[f.lineno - 1:f.end_lineno]}
    return out


def test_every_explained_mutant_points_at_live_code():
    """docs/mutation.md may only explain changes to lines that still exist in
    the function it names (the nightly run also flags explanations no
    surviving mutant uses any more)."""
    functions = {}
    for path in SOURCES:
        functions.update(_functions(path))
    entries = explained(EXPLAINED.read_text())
    assert entries, "docs/mutation.md explains no mutant: is the format still '- `before` → `after` — why'?"
    for change, why in entries.items():
        assert change.function in functions, f"docs/mutation.md: no function {change.function}"
        for line in change.before.split(" ⏎ "):
            assert line in functions[change.function], \
                f"docs/mutation.md: {change.function} has no line {line!r} any more"
        assert why.strip(), f"docs/mutation.md: {change} has no reason"
