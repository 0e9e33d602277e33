"""Meta-test: the conformance machines catch every mutant of the mutant set
(stateful_tests/mutants.py: the seed's historical bugs and the bugs issue 18
found guarded by one directed test each), re-introduced into impl, under the
CI profile (derandomized, 40 steps; max_examples raised only for the mutants
whose trigger is rare, see the table in docs/stateful_tests.md), and the
failure cites the bug's rule id or the conformance fields it corrupts.
Detection time and shrunk length are printed (pytest -s) and recorded in the
docs."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stateful_tests.historical_bugs import MUTANTS, hunt, hunt_settings

ROOT = Path(__file__).resolve().parent.parent


def hunt_in_a_fresh_process(key: str) -> dict:
    """The hunt in a new interpreter. A rare-trigger hunt (max_examples raised) must not depend on
    what the pytest-xdist worker ran before it: the same derandomised search that finds S3 in a
    fresh process missed it in 1,339 runs inside a CI worker."""
    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci")
    out = subprocess.run([sys.executable, "-m", "stateful_tests.historical_bugs", "--json", key], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("key", list(MUTANTS))
def test_mutant_is_caught(key):
    m = MUTANTS[key]
    r = hunt_in_a_fresh_process(key) if m.examples else hunt(m, hunt_settings(m))
    print(f"\n{m.name}: detected={r['detected']} cites={r['cited']} first failure {r['first_failure_s']}s "
          f"total {r['total_s']:.1f}s runs {r['runs']} shrunk to {r['shrunk_steps']} steps\n  {r['message']}\n  "
          + "\n  ".join(r["program"]))
    assert r["detected"], f"{m.name}: the machine did not catch it ({r['runs']} runs)"
    assert set(r["cited"]) & set(m.cites), f"{m.name}: failure cites {r['cited']}, expected one of {m.cites}: " \
                                           f"{r['message']}"


def test_mutants_leave_impl_untouched():
    """Each mutant restores impl when its context ends."""
    from impl import media, prefix_cache, trie
    snapshot = lambda: (dict(vars(prefix_cache.PrefixCache)), dict(vars(trie.Trie)), prefix_cache.schedule,
                        dict(vars(media.MediaItem)))
    before = snapshot()
    for m in MUTANTS.values():
        with m.apply():
            pass
    assert before == snapshot()


def test_the_same_bug_elsewhere_exists():
    """Every place a mutant names as the same bug elsewhere (a spec test, an
    impl test, a fuzz corpus case) exists."""
    for m in MUTANTS.values():
        for ref in m.elsewhere:
            path, _, test = ref.partition("::")
            assert (ROOT / path).is_file(), f"{m.key}: {path} is gone"
            if test:
                assert re.search(rf"^def {test}\(", (ROOT / path).read_text(), re.M), f"{m.key}: {ref} is gone"
            else:
                json.loads((ROOT / path).read_text())
