"""The Ollama target on a real checkout: OLLAMA_SRC=/path/to/ollama. Without it
the test is skipped (CI cannot reach Ollama's source); see
test_ollama_fixture.py for the build and protocol against our own fixture."""
from __future__ import annotations

import os

import pytest

from targets.machine import replay
from targets.ollama.build import build
from targets.ollama.target import HarnessTarget

SRC = os.environ.get("OLLAMA_SRC")
pytestmark = pytest.mark.skipif(not SRC, reason="OLLAMA_SRC is not set: no Ollama checkout to build the harness from")

# The seed's S3 history (REFERENCE S3): a close that lands on a head split off a stored
# edge. On a checkout without the seed's fixes it breaks S3 (and P1/T3 at the second begin).
S3_PROGRAM = [dict(op="reset", budget=1 << 40, interval=8, near_end=4, chunk=8, layout="sliding"),
              dict(op="begin", keys=[1, 1, 1], spans=[]), dict(op="prefill", max_chunks=1), dict(op="close"),
              dict(op="begin", keys=[1, 1], spans=[]), dict(op="close")]


def test_builds_and_serves_the_protocol(tmp_path):
    t = HarnessTarget(build(SRC, tmp_path))
    try:
        found = {rule for rule, _ in replay(t, S3_PROGRAM)}
        v = t.view()
        assert v.offset == 1 and v.request is None
        fixed = os.environ.get("OLLAMA_SRC_FIXED") == "1"
        assert ("S3" in found) != fixed, found
    finally:
        t.shutdown()
