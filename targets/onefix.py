"""One bug, one fix, for peers whose findings export pytest modules and whose sources are a directory
holding the package (vLLM, SGLang): copy the affected release once per fix, apply only that fix, run
every finding's exported test against the stock release and every copy, and tabulate.

  substitute(text, old, new, where)   text with `old` replaced by `new`; `old` must occur exactly once
  build(src, package, dst, edits)     dst/<package>: src/<package> with the edits applied; returns dst
  run_test(test, where, src, package) 'passes' | 'fails' | 'error: ...' for one test FILE::NAME run by
                                      pytest in a fresh interpreter that loads the package from `src`
  check_identity(tab, own)            the cells off the identity (a test passing anywhere but on its
                                      own fix, or failing there)
  markdown(tab)                       the table docs/peers.md keeps

The edits are exact substitutions written here, never patches copied from the peer: a substitution
whose text the release does not hold (moved, reworded) is refused with the file and the count, so a
copy is never built with a fix silently missing. `where/conftest.py` (written by the caller) loads the
package from $ONEFIX_SRC the way the target's own loader does (stubs for GPU-only imports) and writes
the directory it was imported from to $ONEFIX_FROM; run_test checks it, so a copy that is not the one
imported reads as an error, not as a result. Same contract as targets/mlx_lm/onefix.py and
targets/mlx_vlm/onefix.py (issue 50), which copy an installed package instead of a source directory.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def substitute(text: str, old: str, new: str, where: str) -> str:
    n = text.count(old)
    if n != 1:
        raise ValueError(f"{where}: the text to replace occurs {n} times (need exactly 1): {old.strip()[:80]!r}")
    return text.replace(old, new)


def build(src: Path, package: str, dst: Path, edits) -> Path:
    """dst/<package>: a copy of src/<package> (no bytecode) with edits [(file under package, old, new)]."""
    if not (Path(src) / package / "__init__.py").exists():
        raise FileNotFoundError(f"{src} holds no {package} package")
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(Path(src) / package, dst / package, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, old, new in edits:
        f = dst / package / rel
        f.write_text(substitute(f.read_text(), old, new, f"{dst.name}: {package}/{rel}"))
    return dst


def run_test(test: str, where: Path, src: Path, package: str, timeout: int = 600) -> str:
    """One exported test FILE::NAME in `where`, by pytest in a fresh interpreter (this one), with the
    package loaded from `src` by where/conftest.py."""
    seen = where / ".onefix_from"
    seen.unlink(missing_ok=True)
    env = dict(os.environ, ONEFIX_SRC=str(src), ONEFIX_FROM=str(seen), PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                        "-c", str(where / "pytest.ini"), "--rootdir", str(where), test],
                       cwd=where, capture_output=True, text=True, timeout=timeout, env=env)
    want = os.path.realpath(Path(src) / package)
    if not seen.exists() or seen.read_text() != want:
        tail = ([ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()] or ["?"])[-1][:120]
        return f"error: {package} was not imported from {want} ({tail})"
    if r.returncode == 0:
        return "passes"
    if r.returncode == 1 and "AssertionError" in r.stdout:
        return "fails"
    return "error: " + ([ln for ln in r.stdout.splitlines() if ln.strip()] or ["?"])[-1][:120]


def prepare(where: Path, conftest: str) -> Path:
    """where/: an empty pytest.ini (no project configuration) and the caller's conftest."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "pytest.ini").write_text("[pytest]\n")
    (where / "conftest.py").write_text(conftest)
    return where


def table(tests: dict, where: Path, columns: dict, package: str, log=print) -> dict:
    """{finding: {column: outcome}} for tests {finding: FILE::NAME} and columns {name: source dir}."""
    out = {}
    for stem, test in tests.items():
        out[stem] = {col: run_test(test, where, src, package) for col, src in columns.items()}
        log(f"{stem}: {out[stem]}")
    return out


def check_identity(tab: dict, own: dict) -> list:
    """Cells off the identity: `own[finding]` is the column (fix) that must pass; every other fails."""
    bad = []
    for stem, row in tab.items():
        for col, outcome in row.items():
            want = "passes" if col == own[stem] else "fails"
            if outcome != want:
                bad.append((stem, col, outcome))
    return bad


def markdown(tab: dict) -> str:
    cols = list(next(iter(tab.values())))
    lines = ["| finding (exported test) | " + " | ".join(f"`{c}`" for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for stem, row in tab.items():
        lines.append(f"| {stem} | " + " | ".join("**passes**" if row[c] == "passes" else row[c] for c in cols) + " |")
    return "\n".join(lines)
