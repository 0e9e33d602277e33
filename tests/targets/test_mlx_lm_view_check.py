"""The mlx-lm target's structure check (T1, T2 through spec.rules on the view of its trie) reports
what it finds and never swallows an error: a malformed view is a T1 finding, an adapter fault raises."""
from types import SimpleNamespace

import pytest

from targets.mlx_lm import rules
from targets.mlx_lm import view as view_module      # the builder rules.view_of calls


def _driver():
    lru = SimpleNamespace(nbytes=0)
    return SimpleNamespace(entries=dict, prompt_cache_bytes=None, prompt_cache_size=10, lru=lru)


def test_a_malformed_view_is_a_t1_finding(monkeypatch):
    def malformed(d, last_used=None):
        raise ValueError("view: node (1 2) starts at 1 but no node ends there on its path")
    monkeypatch.setattr(view_module, "view_of", malformed)
    c = rules.Checker(enabled={"T1", "T2"})
    c.after_request(_driver(), SimpleNamespace(crash=None), [])
    assert [(f.rule, f.cause, f.kind) for f in c.findings] == [("T1", "view-links", "violation")]
    assert "no node ends there" in c.findings[0].message


def test_an_adapter_fault_is_not_swallowed(monkeypatch):
    def broken(d, last_used=None):
        raise KeyError("__value__")
    monkeypatch.setattr(view_module, "view_of", broken)
    with pytest.raises(KeyError):
        rules.Checker(enabled={"T1", "T2"}).after_request(_driver(), SimpleNamespace(crash=None), [])


def test_a_view_finding_has_a_cause_a_report_can_quote():
    """Every cause the structure check can name quotes a line of the installed mlx-lm, and the report
    and the Go-free export know its rule (a finding would otherwise crash the report)."""
    from targets.mlx_lm.export import RULE_TEXT
    for rule, cause in rules.VIEW_CAUSE.items():
        c = rules.CAUSES[cause]
        assert c.rule == rule and rule in RULE_TEXT
        _, _, text = rules.quote(c)
        assert c.quote in text


class _ShiftedLRU:
    """A planted bug: insert_cache stores the cache one position short of its key (a trim the
    caller forgot to undo). Everything else is mlx-lm's LRUPromptCache."""

    def __new__(cls, size, max_bytes):
        from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

        class Shifted(LRUPromptCache):
            def insert_cache(self, model, tokens, prompt_cache, **kw):
                if can_trim_prompt_cache(prompt_cache) and len(tokens) > 1:
                    trim_prompt_cache(prompt_cache, 1)
                return super().insert_cache(model, tokens, prompt_cache, **kw)
        return Shifted(size) if max_bytes is None else Shifted(size, max_bytes)


def test_s2_flags_an_entry_stored_short_of_its_key():
    from targets.mlx_lm import machine
    program = {"model": "llama", "prompt_cache_size": 10, "prompt_cache_bytes": None,
               "ops": [[[1, 2, 3, 4], [5, 6], False, 0], [[7, 8, 9], [1], False, 0]]}
    assert not [f for f in machine.replay(program) if f.rule == "S2"]
    found = [f for f in machine.replay(program, _ShiftedLRU) if f.rule == "S2"]
    assert found and found[0].cause == "entry-not-at-its-end" and found[0].kind == "violation", found
