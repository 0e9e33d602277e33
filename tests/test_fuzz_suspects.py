"""The fuzz's two further looks at a C1 failure (fuzz/campaign.py): the suspect replay (on a noisy
device, the shrunk case replayed in float32 with TF32 off, in a fresh process) and the one-cold-answer
check (mlx-lm's stock caches in the engine's chunks against one forward of the prompt). GPU_CASE is one
the H200 campaign found on 2026-12-03 (deepseek_v32, one request, resumed at 0, 0.246 from the cold
run); the replay there confirmed it, and the stock caches alone reproduce it (docs/platform.md)."""
import json
from types import SimpleNamespace

from fuzz.campaign import Campaign
from fuzz.oracle import Failure

GPU_CASE = {
    "format": "prefix-trie-fuzz-case/1", "model": "deepseek_v32",
    "engine": {"budget": 1179648, "budget_spec": "8ckpt", "chunk_size": 16, "capture_interval": 32, "near_end": 4},
    "requests": [{"op": "generate", "tokens": [1, 9690, 198, 2683, 359, 253, 3158, 15474, 327, 253, 2222, 1380, 563,
                                                6944, 28, 8856, 284, 7505, 30, 16374, 897, 1833, 28, 5879, 5289, 1924,
                                                28, 284, 2545, 260, 2222, 506, 1725, 418, 260, 1112, 30, 2, 198, 1,
                                                4093, 198, 8241, 12837, 637, 12018, 5738, 28, 638, 359, 346, 23, 618,
                                                5071, 284, 3697, 30, 2, 198, 1, 520, 9531, 198],
                  "media": [], "boundaries": [39, 59], "max_tokens": 4, "cancel_after": None, "kind": "new_conv"}],
    "failure": {"signature": "C1-logits", "message": "first logits differ from the cold run by 0.246 > 0.0392"},
    "dtype": "float32", "expect": "pass",
}


def _recheck(monkeypatch, tmp_path, case, signature="C1-logits", noisy=True):
    import fuzz.calibrate
    monkeypatch.setattr(fuzz.calibrate, "needs_recheck", lambda lm: noisy)
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    return Campaign.suspect_recheck(None, SimpleNamespace(loaded=None), Failure(signature, "x"), case, path)


def test_a_suspect_that_passes_in_float32_is_cleared(monkeypatch, tmp_path):
    # its first 12 tokens and 4 answer tokens stay within the indexer's top 16: one cold answer anywhere
    short = dict(GPU_CASE, requests=[dict(GPU_CASE["requests"][0], tokens=GPU_CASE["requests"][0]["tokens"][:12],
                                          boundaries=[5])])
    cleared, said = _recheck(monkeypatch, tmp_path, short)
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




def _cold(monkeypatch, tokens, shift=0.0, signature="C1-logits", tol=None):
    import fuzz.calibrate
    from impl.models import load
    if shift:
        real = fuzz.calibrate.one_forward
        monkeypatch.setattr(fuzz.calibrate, "one_forward", lambda lm, t: real(lm, t) + shift)
    if tol is not None:
        monkeypatch.setattr(fuzz.calibrate, "tolerance", lambda lm: tol)
    m = SimpleNamespace(loaded=load("deepseek_v32", "float32"), settings={"chunk_size": 16})
    case = dict(GPU_CASE, requests=[dict(GPU_CASE["requests"][0], tokens=tokens)])
    return Campaign.cold_disagrees(None, m, Failure(signature, "x"), case)


def test_c1_is_judged_where_the_cold_path_agrees_with_itself(monkeypatch):
    # 16 keys: within the indexer's top 16, so attention is dense and chunking cannot change it
    assert _cold(monkeypatch, GPU_CASE["requests"][0]["tokens"][:16]) is None


def test_c1_is_unjudged_where_the_cold_path_disagrees_with_itself(monkeypatch):
    """On the H200 (and on this CPU with the reference BLAS, not with OpenBLAS) mlx-lm's own caches in
    chunks of 16 and one forward of this 63-token prompt differ by 0.246: deepseek_v32's indexer keeps
    the top 16 keys, and at that boundary scores tie or nearly tie (many are exactly 0 after its relu),
    so which keys are kept follows the matmul's rounding and argpartition's order in a row whose length
    the chunking sets. Planted here as a shift of the one-forward logits, so the test does not depend
    on this machine's BLAS. No cache of ours is in that comparison, so C1 cannot be judged there.
    The tolerance is pinned at 0.1 (the campaign's on the H200: 0.039): what is tested is the comparison.
    In the suite on the H200 with 14 workers this test once found no disagreement with the calibrated
    tolerance, which needs a tolerance >= 0.25 there; alone it passed, and the campaign's calibration
    gave 0.039. Likely cause, not confirmed (the device budget was spent): deepseek_v32's calibration
    probes can hit such a top-k flip themselves and read it as chunking noise."""
    tokens = GPU_CASE["requests"][0]["tokens"]
    said = _cold(monkeypatch, tokens, shift=0.25, tol=0.1)
    assert said is not None and "stock caches in chunks of 16" in said and "63 tokens" in said
    assert "tolerance 0.1" in said
    assert _cold(monkeypatch, tokens, shift=0.25, signature="rule:P1", tol=0.1) is None   # only C1 has a cold answer
    assert _cold(monkeypatch, tokens, shift=0.25, tol=1.0) is None       # within a tolerance: judged
