"""The mlx-lm target's fast tier (targets/mlx_lm/hollow.py): a hollow model drives mlx-lm's server cache
into the same states as the real model, so every rule but C1 judges the same thing at a fraction of the
cost; and what the tier finds is what the real models find."""
import json
import random

import pytest

pytest.importorskip("mlx_lm")

from targets.mlx_lm import machine, models  # noqa: E402
from targets.mlx_lm.adapter import ServerDriver  # noqa: E402
from targets.mlx_lm.report import FINDINGS_DIR  # noqa: E402
from targets.mlx_lm.rules import RULES  # noqa: E402


def _program(rng: random.Random, n: int):
    """Requests that extend, branch off and repeat earlier sequences (the machine's shapes), with chat
    segments and seeded (sequential-path) requests among them."""
    seqs, ops = [()], []
    for _ in range(n):
        base = rng.choice(seqs)
        prompt = list(base[:rng.randint(0, len(base))]) + [rng.randint(1, 6) for _ in range(rng.randint(0, 4))]
        prompt = prompt or [rng.randint(1, 6)]
        gen = [rng.randint(1, 6) for _ in range(rng.randint(1, 3))]
        chat = rng.random() < 0.4
        ops.append((prompt, gen, chat, rng.randint(0, 3) if chat else 0, 0 if rng.random() < 0.2 else None))
        seqs.append(tuple(prompt + gen))
    return ops


CONFIGS = [(name, {}) for name in models.MODEL_NAMES] + [("llama_q", {"kv_bits": 4, "quantized_kv_start": 0})]


@pytest.mark.parametrize("name,flags", CONFIGS, ids=[c[0] + ("+kv_bits" if c[1] else "") for c in CONFIGS])
def test_hollow_model_leaves_the_same_cache_states(name, flags):
    unit = machine.unit_bytes(name)
    for seed, (size, limit) in enumerate([(10, None), (3, 2 * unit), (2, 4 * unit)]):
        real = ServerDriver(name, prompt_cache_size=size, prompt_cache_bytes=limit, **flags)
        hollow = ServerDriver(name, prompt_cache_size=size, prompt_cache_bytes=limit, hollow=True, **flags)
        for i, (prompt, gen, chat, sys_len, s) in enumerate(_program(random.Random(seed), 14)):
            s = s if real.batchable else None
            a = real.request(prompt, gen, chat=chat, sys_len=sys_len, seed=s)
            b = hollow.request(prompt, gen, chat=chat, sys_len=sys_len, seed=s)
            where = f"{name} {flags} program {seed}, request {i}"
            assert (b.count, b.path, b.crash, b.generated) == (a.count, a.path, a.crash, a.generated), where
            assert hollow.calls == real.calls, where
            assert hollow.entries() == real.entries(), where
            assert int(hollow.lru.nbytes) == int(real.lru.nbytes), where
        assert real.entries(), f"{name}: the program left no entry to compare"


def test_hollow_model_is_not_the_real_one():
    """The equality above is not vacuous: a hollow model writing one head too few leaves other bytes."""
    from targets.mlx_lm import hollow
    d_real = ServerDriver("llama", prompt_cache_size=10)
    d_real.request([1, 2, 3], [4])
    model = models.build("llama", hollow=True)
    kind, (heads, dk, dv, dtype) = model._layouts[0]
    saved = model._layouts
    try:
        model.__dict__["_layouts"] = ((kind, (heads - 1, dk, dv, dtype)),) + saved[1:]
        d = ServerDriver("llama", prompt_cache_size=10, hollow=True)
        d.request([1, 2, 3], [4])
        assert d.entries() != d_real.entries()
    finally:
        model.__dict__["_layouts"] = saved
    assert isinstance(model, hollow.HollowModel)


@pytest.mark.parametrize("path", sorted(FINDINGS_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_saved_findings_reproduce_on_the_fast_tier_unless_they_judge_values(path):
    """Every saved finding but C1's (which judges values) and speculative-key-ahead's (a draft path the
    fast tier does not take) reproduces on hollow models, same rule and cause; the fast tier's checker
    does not judge C1 at all."""
    rec = json.loads(path.read_text())
    found = {(f.rule, f.cause) for f in machine.replay(rec["program"], hollow=True) if f.kind == "violation"}
    if rec["rule"] == "C1":
        assert not any(rule == "C1" for rule, _ in found)
    elif rec["cause"] == "speculative-key-ahead":   # a path hollow drafts (all accepted) do not take
        assert (rec["rule"], rec["cause"]) not in found
    else:
        assert (rec["rule"], rec["cause"]) in found
    assert machine.tier_checker(True).enabled == RULES - {"C1"} and machine.tier_checker().enabled == RULES


def test_a_finding_of_the_fast_tier_is_reported_only_once_the_real_models_show_it(monkeypatch):
    from hypothesis import settings
    quick = settings(max_examples=50, stateful_step_count=6, derandomize=True)
    got = machine.hunt("llama", hollow=True, hyp_settings=quick)
    assert got is not None and got[0] != "unconfirmed", got        # E1 on llama: real models show it too
    finding, program, _ = got
    assert machine._fails(program, finding.rule, finding.cause, None)          # on the real models
    real_violation = machine._violation          # the real models refuse: only hollow replays fail
    monkeypatch.setattr(machine, "_violation",
                        lambda p, r, c, lru, hollow=False: real_violation(p, r, c, lru, True) if hollow else None)
    got = machine.hunt("llama", hollow=True, hyp_settings=quick)
    assert got is not None and got[0] == "unconfirmed" and got[1].rule == finding.rule
