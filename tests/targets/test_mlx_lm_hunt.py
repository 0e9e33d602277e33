"""The mlx-lm target finds a rule violation from scratch (no saved programs, no example database)
within the Hypothesis profile in force (CI=true selects "ci"), shrinks it to at most 10 requests, and
the exported standalone script fails on the installed mlx-lm with the same rule."""
import subprocess
import sys

from hypothesis import settings

from targets.mlx_lm import machine
from targets.mlx_lm.export import export
from targets.mlx_lm.report import finding_record


def test_hunt_from_scratch_finds_a_shrunk_violation(tmp_path):
    got = machine.hunt("mamba2", hyp_settings=settings())          # the profile in force
    assert got is not None, "no violation found from scratch"
    f, program, _ = got
    assert f.kind == "violation" and f.rule in {"C1", "C2", "E1", "E3", "A1"}
    assert 1 <= len(program["ops"]) <= 10
    assert machine.reproduces({"rule": f.rule, "cause": f.cause, "program": program})
    from importlib.metadata import version
    rec = finding_record({"rule": f.rule, "cause": f.cause, "message": f.message, "model": "mamba2",
                          "program": program, "steps": len(program["ops"]), "seconds_to_detect": 0},
                         version("mlx-lm"))
    script = tmp_path / "repro.py"
    script.write_text(export(rec, rec["mlx_lm_version"]))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and f"AssertionError: {f.rule}:" in r.stderr, r.stderr[-2000:]
