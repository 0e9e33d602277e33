"""The Ollama machine's Go-free path: the same machine, layouts and rule set
that judge Ollama's prefix cache judge impl (on tracer caches). impl is
correct, so nothing may be reported: no false alarm comes from the machine,
the rules or the program generator."""
from __future__ import annotations

from targets.ollama.pyside import Resettable
from targets.ollama.target import LAYOUTS, HarnessTarget
from targets.report import campaign


def test_impl_under_the_ollama_machine_is_clean():
    t = Resettable("impl")
    t.RULES = HarnessTarget.RULES
    try:
        c = campaign(t, list(LAYOUTS), minutes=0.15, max_examples=10)
    finally:
        t.shutdown()
    assert c.findings == {}, {r: (f.message, f.ops) for r, f in c.findings.items()}
    assert c.steps > 200
