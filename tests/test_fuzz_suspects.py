"""The fuzz's stronger oracle for C1 suspects on a noisy device (fuzz/campaign.py `suspect_recheck`):
a C1 failure under TF32 or half precision is replayed, shrunk, in float32 with TF32 off, in a fresh
process. The case below is the one the H200 campaign found on 2026-12-03 (deepseek_v32, one request,
resumed at 0: chunked prefill against one forward moved the first logits by 0.195 under TF32, when
TF32 rounding flipped the indexer's top-16 selection); in float32 it passes, so it is cleared."""
import json
from types import SimpleNamespace

from fuzz.campaign import Campaign
from fuzz.oracle import Failure

GPU_CASE = {
    "format": "prefix-trie-fuzz-case/1", "model": "deepseek_v32",
    "engine": {"budget": 1179648, "budget_spec": "8ckpt", "chunk_size": 16, "capture_interval": 32, "near_end": 4},
    "requests": [{"op": "generate", "tokens": [1, 9690, 198, 2683, 359, 253, 19484, 11173, 30, 19842, 281, 582, 355,
                                                827, 8545, 284, 2093, 722, 8639, 30, 2, 198, 1, 4093, 198, 2020, 800,
                                                7225, 1072, 253, 16198, 457, 28, 284, 638, 800, 3497, 47, 2, 198, 1,
                                                520, 9531, 198],
                  "media": [], "boundaries": [22, 40], "max_tokens": 12, "cancel_after": None, "kind": "edit"}],
    "failure": {"signature": "C1-logits", "message": "first logits differ from the cold run by 0.195 > 0.0392"},
    "dtype": "float32", "expect": "pass",
}


def _recheck(monkeypatch, tmp_path, case, signature="C1-logits", noisy=True):
    import fuzz.calibrate
    monkeypatch.setattr(fuzz.calibrate, "needs_recheck", lambda lm: noisy)
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    return Campaign.suspect_recheck(None, SimpleNamespace(loaded=None), Failure(signature, "x"), case, path)


def test_a_suspect_that_passes_in_float32_is_cleared(monkeypatch, tmp_path):
    cleared, said = _recheck(monkeypatch, tmp_path, GPU_CASE)
    assert cleared, said
    assert "MLX_ENABLE_TF32=0" in said and ": pass" in said


def test_a_replay_that_does_not_pass_never_clears(monkeypatch, tmp_path):
    # the same request, but the replay cannot even load the case: a failed replay never clears
    broken = dict(GPU_CASE, model="no-such-model")
    cleared, said = _recheck(monkeypatch, tmp_path, broken)
    assert not cleared and said


def test_no_recheck_off_noisy_devices_or_for_other_rules(monkeypatch, tmp_path):
    assert _recheck(monkeypatch, tmp_path, GPU_CASE, noisy=False) is None
    assert _recheck(monkeypatch, tmp_path, GPU_CASE, signature="rule:P1") is None
