"""The fuzz's stronger oracle for C1 suspects on a noisy device (fuzz/campaign.py `suspect_recheck`):
a C1 failure under TF32 or half precision is replayed, shrunk, in float32 with TF32 off, in a fresh
process. The case below is one the H200 campaign found on 2026-12-03 (deepseek_v32, one request,
resumed at 0: chunked prefill against one forward, 0.246 apart). On the H200 the replay confirmed it:
there MLX's one forward of such prompts differs from its chunked forward also without TF32, with
mlx-lm's stock caches alone (docs/platform.md). On the CPU it passes, which is what the clearing path
needs here."""
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



def _cold(tokens, signature="C1-logits"):
    from impl.models import load
    m = SimpleNamespace(loaded=load("deepseek_v32", "float32"), settings={"chunk_size": 16})
    case = dict(GPU_CASE, requests=[dict(GPU_CASE["requests"][0], tokens=tokens)])
    return Campaign.cold_disagrees(None, m, Failure(signature, "x"), case)


def test_c1_is_judged_where_the_cold_path_agrees_with_itself():
    assert _cold(GPU_CASE["requests"][0]["tokens"][:56]) is None


def test_c1_is_unjudged_where_the_cold_path_disagrees_with_itself():
    """deepseek_v32's indexer keeps the top 16 keys by relu(q.k) x weights; many keys tie at exactly 0,
    and argpartition breaks the tie by the row's length, which the chunking sets: on this 63-token
    prompt mlx-lm's own caches in chunks of 16 and one forward differ by 0.246, on the CPU as on the
    H200. No cache of ours is in that comparison, so C1 cannot be judged there."""
    tokens = GPU_CASE["requests"][0]["tokens"]
    said = _cold(tokens)
    assert said is not None and "stock caches in chunks of 16" in said and "63 tokens" in said
    assert _cold(tokens, signature="rule:P1") is None      # only C1 has a cold answer
