"""One bug, one fix: the saved vLLM findings' exported tests on the affected release and on a copy of
it with only the finding's cause fixed (issue 50).

`VLLM_PYTHON=... ./dev check-vllm onefix [--release 0.25.0 | --src PATH] [--dir reports/vllm/onefix]`
copies the release's `vllm` package once per fix into DIR/<fix>/vllm, applies that fix (an exact,
unique substitution written here: a release whose text differs is refused), exports every saved
finding (targets/vllm/findings/*.json) as its pytest module (targets/vllm/export.py) into DIR/tests,
runs each with pytest in a fresh interpreter on the stock release and on every copy (the conftest
loads vLLM from that directory through targets.vllm.engine, stubs included, and the run checks the
import location), and prints the table docs/peers.md keeps: one row per finding, one column per
source; "fails" = the test's AssertionError (the bug is there), "passes" = the test passed.

vLLM's three findings share one cause, so there is one fixed copy: `HybridKVCacheCoordinator.
find_longest_cache_hit` gives every EAGLE group one block of margin before the drop, the Mamba group
included, whose finder never drops (0.25.0 line 695); 0.26.0 gives none to Mamba. The copy changes
that one condition and nothing else.
Invariant: the expected outcome is the identity (every test fails on stock and passes on its own
fix); `targets.onefix.check_identity` lists the cells where it is not.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from targets import onefix

FINDINGS = Path(__file__).resolve().parent / "findings"
AFFECTED = "0.25.0"
COORD = "v1/core/kv_cache_coordinator.py"

FIXES: dict = {
    "mamba-no-eagle-margin": [(COORD, """                _max_length = curr_hit_length
                if drop_eagle_block:
""", """                _max_length = curr_hit_length
                if drop_eagle_block and not isinstance(spec, MambaSpec):
""")],
}
FIX_OF = {"C1-mamba-eagle": "mamba-no-eagle-margin", "C1-hybrid-eagle": "mamba-no-eagle-margin",
          "S1-hybrid-eagle": "mamba-no-eagle-margin"}

CONFTEST = """import os
from pathlib import Path

from targets.vllm.engine import load

load(os.environ["ONEFIX_SRC"])          # vLLM from that directory, with the stubs the target uses
import vllm  # noqa: E402

Path(os.environ["ONEFIX_FROM"]).write_text(os.path.dirname(os.path.realpath(vllm.__file__)))
"""


def findings(directory: Path = FINDINGS) -> dict:
    """{finding stem: record}; every finding must name its fix in FIX_OF."""
    recs = {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}
    for stem in recs:
        if FIX_OF.get(stem) not in FIXES:
            raise ValueError(f"finding {stem}: no fix named for it in targets/vllm/onefix.py FIX_OF")
    return recs


def tests(recs: dict, where: Path) -> dict:
    """Each finding's exported module in `where`; {stem: FILE::TEST}."""
    from targets.vllm.export import export
    out = {}
    for stem, rec in recs.items():
        name = f"{rec['rule'].lower()}_{rec['layout'].replace('-', '_')}"
        (where / f"test_{name}.py").write_text(export(rec))
        out[stem] = f"test_{name}.py::test_{name}"
    return out


def main(root: str, src: str) -> int:
    root, recs = Path(root), findings()
    where = onefix.prepare(root / "tests", CONFTEST)
    cols = {"stock": Path(src)}
    try:
        cols.update({fix: onefix.build(Path(src), "vllm", root / fix, edits) for fix, edits in FIXES.items()})
    except (ValueError, FileNotFoundError) as e:     # a release whose text differs: no copy, no table
        print(f"onefix: {e} (the fixes are written for vllm {AFFECTED})", file=sys.stderr)
        return 2
    tab = onefix.table(tests(recs, where), where, cols, "vllm")
    print(onefix.markdown(tab))
    bad = onefix.check_identity(tab, {stem: FIX_OF[stem] for stem in recs})
    print("identity: yes" if not bad else f"not the identity at {bad}")
    return int(bool(bad))
