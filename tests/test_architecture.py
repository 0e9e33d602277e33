"""The house rules of docs/architecture.md, as bars a reviewer can see:

- every Python file of the project is within LINE_BUDGET lines (EXCEPTIONS name a reason each);
- the import graph (module-level and function-level imports of project modules, read with ``ast``)
  has no cycle;
- the rooms import only in the allowed directions (ALLOWED), all one way: spec imports nothing of ours,
  impl only spec, serve impl and spec; product code (spec, impl, serve) never imports the tests' doubles
  (tests.support).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("spec", "impl", "serve", "prefix_trie", "fuzz", "bench", "targets", "stateful_tests", "tests")
LINE_BUDGET = 400
EXCEPTIONS: dict[str, str] = {}  # file -> why it may exceed the budget for now (a split in progress)
PRODUCT = ("spec", "impl", "serve")
# room -> the rooms it may import (itself always); one direction: this relation has no cycle
# (test_the_arrows_go_one_way). docs/architecture.md draws the same arrows. A test module (test_*.py,
# conftest.py) anywhere, stateful_tests/ included, is in the room "tests".
ALLOWED = {
    "spec": set(),
    "impl": {"spec"},
    "serve": {"spec", "impl"},
    "stateful_tests": {"spec", "impl"},
    "fuzz": {"spec", "impl"},
    "targets": {"spec", "impl", "fuzz", "stateful_tests"},
    "bench": {"spec", "impl", "serve", "fuzz", "targets"},
    "prefix_trie": {"spec", "impl", "serve", "fuzz", "targets"},
    "tests": {"spec", "impl", "serve", "stateful_tests", "fuzz", "targets", "bench", "prefix_trie"},
}


def python_files() -> list[Path]:
    return sorted(p for room in ROOMS for p in (ROOT / room).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports, anywhere in the file (inside functions and
    ``if TYPE_CHECKING`` too). ``from a.b import c`` counts as a.b.c when that is a module, else a.b."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:             # `import a.b.c` of a non-module attribute path
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def import_graph() -> dict[str, set[str]]:
    files = python_files()
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules) for p in files}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def room(module: str) -> str:
    last = module.rpartition(".")[2]
    if last.startswith("test_") or last == "conftest":
        return "tests"
    return module.partition(".")[0]


def test_every_file_is_within_the_line_budget():
    over = {}
    for p in python_files():
        rel = p.relative_to(ROOT).as_posix()
        n = len(p.read_text().splitlines())
        if n > LINE_BUDGET and rel not in EXCEPTIONS:
            over[rel] = n
    assert not over, f"files over {LINE_BUDGET} lines (split them along a real seam): {over}"


def test_the_exceptions_name_real_files_with_a_reason():
    for rel, reason in EXCEPTIONS.items():
        assert (ROOT / rel).is_file() and reason.strip(), rel


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_rooms_import_only_in_the_allowed_directions():
    bad = []
    for module, targets in sorted(import_graph().items()):
        here = room(module)
        for t in sorted(targets):
            there = room(t)
            if there != here and there not in ALLOWED[here]:
                bad.append(f"{module} -> {t}")
    assert not bad, "imports against docs/architecture.md's arrows:\n" + "\n".join(bad)


def test_the_arrows_go_one_way():
    assert not cycles({r: set(a) for r, a in ALLOWED.items()}), "ALLOWED has a circle of rooms"
    assert set(ALLOWED) == set(ROOMS)


def test_product_code_never_imports_the_test_doubles():
    bad = [f"{m} -> {t}" for m, ts in sorted(import_graph().items()) if room(m) in PRODUCT
           for t in sorted(ts) if t == "tests" or t.startswith("tests.")]
    assert not bad, "\n".join(bad)


def test_the_graph_sees_imports_inside_functions_and_relative_ones(tmp_path):
    """The reader itself: a function-level and a relative import are edges, and a two-module circle
    is found."""
    modules = {"impl", "impl.a", "impl.b", "serve"}
    (tmp_path / "impl").mkdir()
    a = tmp_path / "impl" / "a.py"
    a.write_text("def f():\n    from . import b\n    import serve\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert imports_of(a, modules) == {"impl.b", "serve"}
    finally:
        ROOT = saved
    assert cycles({"impl.a": {"impl.b"}, "impl.b": {"impl.a"}, "spec": set()}) == [["impl.a", "impl.b"]]
