"""One bug, one fix: for every saved mlx-vlm finding, a copy of the installed mlx-vlm with ONLY that bug
fixed, and every finding's standalone test run against the stock package and every copy.

`MLXVLM_PYTHON -m targets.mlx_vlm onefix [--dir /tmp/mlx-vlm-onefix]` copies the installed `mlx_vlm`
package once per fix into DIR/<fix>/mlx_vlm, applies that fix's edits (each an exact, unique
substitution in the installed source: a copy whose text is not found is refused), copies the finding
tests (findings/test_*.py) to DIR/scripts, runs each finding's test (its JSON's "test": FILE::NAME)
with pytest in a fresh interpreter, with PYTHONPATH=DIR/<fix> (the copy shadows the installed
package; the run checks that `mlx_vlm` was imported from the copy) and with the installed package,
and prints the table docs/peers.md keeps: one row per finding, one column per fixed copy; "fails" =
the test's AssertionError (its bug is there), "passes" = the test passed.

The fixes are a maintainer's smallest change for each bug, not proposals for mlx-vlm's design: they
show that each test checks its own bug and nothing else (issue 50).
Invariant: the expected outcome is the identity (each test passes on its own fix only);
`check_identity` lists the cells where it is not.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from targets.mlx_vlm.report import FINDINGS

GENERATION = "server/generation.py"
_SALT_MEDIA = """                media={
                    "audio": raw_inputs.get("input_features"),
                    "video": raw_inputs.get("pixel_values_videos"),
                },
"""

# fix -> [(file under mlx_vlm/, old text, new text)]
FIXES: dict = {
    "image-dims-not-in-key": [(GENERATION, _SALT_MEDIA, _SALT_MEDIA.replace(
        """                },
""", """                    "image_grid_thw": raw_inputs.get("image_grid_thw"),
                },
"""))],
    "video-dims-not-in-key": [(GENERATION, _SALT_MEDIA, _SALT_MEDIA.replace(
        """                },
""", """                    "video_grid_thw": raw_inputs.get("video_grid_thw"),
                },
"""))],
}


def installed() -> Path:
    import mlx_vlm
    return Path(mlx_vlm.__file__).resolve().parent


def findings(directory: Path = FINDINGS) -> dict:
    """{finding stem: its record}; every record names its fix and its test."""
    recs = {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}
    for stem, rec in recs.items():
        if "fix" not in rec or "test" not in rec:
            raise ValueError(f"finding {stem}: needs 'fix' and 'test' (FILE::NAME)")
    return recs


def build(fix: str, root: Path) -> Path:
    """root/<fix>/mlx_vlm: the installed package with FIXES[fix] applied; returns root/<fix>."""
    if fix not in FIXES:
        raise ValueError(f"no fix named {fix!r}: one of {sorted(FIXES)}")
    dst = root / fix
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(installed(), dst / "mlx_vlm", ignore=shutil.ignore_patterns("__pycache__"))
    for rel, old, new in FIXES[fix]:
        f = dst / "mlx_vlm" / rel
        text = f.read_text()
        if text.count(old) != 1:
            raise ValueError(f"fix {fix}: the text to replace occurs {text.count(old)} times in {rel}")
        f.write_text(text.replace(old, new))
    return dst


def scripts(root: Path, directory: Path = FINDINGS) -> Path:
    """root/scripts: the finding tests, with an empty pytest.ini (no project configuration)."""
    out = root / "scripts"
    out.mkdir(parents=True, exist_ok=True)
    for p in directory.glob("test_*.py"):
        shutil.copy(p, out / p.name)
    (out / "pytest.ini").write_text("[pytest]\n")
    (out / "conftest.py").write_text(            # records where the run imported mlx_vlm from
        "import os\nfrom pathlib import Path\n\nimport mlx_vlm\n\n"
        "Path(os.environ['MLXVLM_ONEFIX_FROM']).write_text(os.path.dirname(os.path.realpath(mlx_vlm.__file__)))\n")
    return out


def run_test(test: str, where: Path, copy: Path | None, timeout: int = 300) -> str:
    """'passes', 'fails' (an AssertionError) or 'error: ...' for one test FILE::NAME in `where`."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if copy is not None:
        env["PYTHONPATH"] = str(copy)
    seen = where / ".mlx_vlm_from"
    seen.unlink(missing_ok=True)
    env["MLXVLM_ONEFIX_FROM"] = str(seen)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                        "-c", str(where / "pytest.ini"), "--rootdir", str(where), test],
                       cwd=where, capture_output=True, text=True, timeout=timeout, env=env)
    want = os.path.realpath((copy / "mlx_vlm") if copy is not None else installed())
    if not seen.exists() or seen.read_text() != want:
        return "error: mlx_vlm was not imported from " + want
    if r.returncode == 0:
        return "passes"
    if r.returncode == 1 and "AssertionError" in r.stdout:
        return "fails"
    return "error: " + ([ln for ln in r.stdout.splitlines() if ln.strip()] or ["?"])[-1][:120]


def table(root: Path, recs: dict | None = None, log=print) -> dict:
    """{finding stem: {"stock": outcome, fix: outcome for every fixed copy}}."""
    recs = findings() if recs is None else recs
    where = scripts(root)
    copies = {fix: build(fix, root) for fix in FIXES}
    out = {}
    for stem, rec in recs.items():
        row = {"stock": run_test(rec["test"], where, None)}
        for fix, path in copies.items():
            row[fix] = run_test(rec["test"], where, path)
        out[stem] = row
        log(f"{stem}: {row}")
    return out


def check_identity(tab: dict, recs: dict) -> list:
    """Cells off the identity: a test passing on stock or on another bug's fix, or failing on its own."""
    bad = []
    for stem, row in tab.items():
        for col, outcome in row.items():
            want = "passes" if col == recs[stem]["fix"] else "fails"
            if outcome != want:
                bad.append((stem, col, outcome))
    return bad


def markdown(tab: dict) -> str:
    cols = list(next(iter(tab.values())))
    lines = ["| finding (test) | " + " | ".join(f"`{c}`" for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for stem, row in tab.items():
        lines.append(f"| {stem} | " + " | ".join("**passes**" if row[c] == "passes" else row[c] for c in cols) + " |")
    return "\n".join(lines)


def main(root: str) -> int:
    recs = findings()
    tab = table(Path(root), recs)
    print(markdown(tab))
    bad = check_identity(tab, recs)
    print("identity: yes" if not bad else f"not the identity at {bad}")
    return int(bool(bad))
