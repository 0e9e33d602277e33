"""One bug, one fix (targets/mlx_lm/onefix.py): every saved finding has a fix whose text applies exactly
once to the installed mlx-lm, and a copy with one bug fixed makes that finding's script pass while
another finding's script still fails. (The full table, every script against every copy, takes
minutes: `python -m targets.mlx_lm onefix`, in docs/peers.md.)"""
import json

from targets.mlx_lm import onefix
from targets.mlx_lm.export import export
from targets.mlx_lm.report import FINDINGS_DIR

RECS = {p.stem: json.loads(p.read_text()) for p in sorted(FINDINGS_DIR.glob("*.json"))}


def test_every_saved_finding_has_a_fix_that_applies(tmp_path):
    assert {r["cause"] for r in RECS.values()} <= set(onefix.FIXES)
    for cause in onefix.FIXES:
        assert (onefix.build(cause, tmp_path) / "mlx_lm" / "models" / "cache.py").exists()


def test_a_fixed_copy_fixes_its_own_bug_only(tmp_path):
    copy = onefix.build("one-token-prefix", tmp_path)
    scripts = {}
    for stem in ("C2-one-token-prefix", "C2-exact-hit-no-seed"):
        scripts[stem] = tmp_path / f"{stem}.py"
        scripts[stem].write_text(export(RECS[stem], RECS[stem]["mlx_lm_version"]))
    assert onefix.run_script(scripts["C2-one-token-prefix"], None) == "fails"
    assert onefix.run_script(scripts["C2-one-token-prefix"], copy) == "passes"
    assert onefix.run_script(scripts["C2-exact-hit-no-seed"], copy) == "fails"
