"""targets/mlx_vlm: the view and the rule set on a planted-fault fake of the driver (always), and on
mlx-vlm's own automatic prefix cache when mlx-vlm is importable (MLXVLM_PYTHON's venv:
targets/mlx_vlm/install.sh), else skipped."""
from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest

from spec.media import fold_key
from spec.rules import check
from targets.base import ALL_RULES
from targets.mlx_vlm.target import NOT_APPLICABLE, RULES
from targets.mlx_vlm.view import view_of

HAVE_MLX_VLM = importlib.util.find_spec("mlx_vlm") is not None
needs_mlx_vlm = pytest.mark.skipif(not HAVE_MLX_VLM, reason="mlx-vlm is not installed here: run "
                                   "targets/mlx_vlm/install.sh and the tests with MLXVLM_PYTHON")
BLOCK_BYTES = 256                      # per layer, in the fake


def test_rules_cover_every_id():
    from targets.mlx_vlm.target import CHECKPOINT_RULES
    assert set(RULES) | set(NOT_APPLICABLE) == set(ALL_RULES) and not set(RULES) & set(NOT_APPLICABLE)
    assert set(CHECKPOINT_RULES) | set(NOT_APPLICABLE) | {"S1"} == set(ALL_RULES)


# ------------------------------------------------------------------ the fake (no mlx-vlm)
class FakeDriver:
    """The driver's state as view.py reads it: blocks by hash (memory), their recorded contents and
    parents, the manager's counter and budget. `fault` plants one bug."""

    def __init__(self, chains, fault=None, budget=1 << 40):
        self.block, self.content, self.links, self.exact, table = 2, {}, {}, {}, {}
        for keys in chains:
            parent = 0
            for i in range(len(keys) // 2):
                h = hash((parent, tuple(keys[2 * i:2 * i + 2])))
                self.content[h], self.links[h] = tuple(keys[2 * i:2 * i + 2]), parent
                arr = SimpleNamespace(nbytes=BLOCK_BYTES // 2)
                table[h] = SimpleNamespace(kv_handle=lambda a=arr: SimpleNamespace(keys=[a, a], values=[a, a]))
                parent = h
        resident = len(table) * 2 * BLOCK_BYTES + (BLOCK_BYTES if fault == "unreachable-bytes" else 0)
        self.manager = SimpleNamespace(hash_table=table, resident_bytes=lambda: resident, memory_max_bytes=budget,
                                       disk=None, _exact_cache={})
        self.apc = SimpleNamespace(SEED_PARENT_HASH=0)
        self.model = SimpleNamespace(layers=[0, 1])

    def present(self, h):
        return h in self.manager.hash_table

    def present_exact(self, e):
        return False


def request(keys, resume, live):
    return {"keys": keys, "spans": [], "matched": resume, "resume": resume, "live": live}


def test_fake_clean_state_breaks_no_rule():
    d = FakeDriver([[1, 2, 3, 4, 5, 6], [1, 2, 9, 9]])
    assert check(view_of(d), RULES) == []
    assert check(view_of(d, request([1, 2, 3, 4, 7], 4, (1, 2, 3, 4))), RULES) == []


@pytest.mark.parametrize("fault,rule", [("other-image", "C1"), ("unreachable-bytes", "A1"), ("over-budget", "E1")])
def test_fake_planted_faults_are_caught(fault, rule):
    a, b = fold_key(b"page", (28, 84), 4), fold_key(b"page", (84, 28), 4)
    d = FakeDriver([[a, a, a, a, 1, 2]], fault, budget=100 if fault == "over-budget" else 1 << 40)
    req = request([b, b, b, b, 1, 3], 4, (a, a, a, a)) if fault == "other-image" else None
    assert rule in {v.rule for v in check(view_of(d, req), RULES)}


class RotatingKVCache:                  # the name view.layers_of reads, and max_size
    max_size = 2


def test_fake_windowed_layer_holds_only_its_window():
    """A windowed layer (RotatingKVCache, window 2) is judged on the last 2 live keys only: a restore
    whose older keys came from another request breaks C1 on the KV layer, not on the windowed one."""
    a = FakeDriver([[1, 2, 3, 4]])
    a.model = SimpleNamespace(layers=[0, 1], make_cache=lambda: [RotatingKVCache(), None])
    assert [layer.kind for layer in view_of(a).layers] == ["windowed", "kv"]
    found = check(view_of(a, request([9, 9, 3, 4, 5], 4, (1, 2, 3, 4))), RULES)
    assert {(v.rule, v.where) for v in found} == {("C1", "layer 1")}
    found = check(view_of(a, request([1, 2, 9, 4, 5], 4, (1, 2, 3, 4))), RULES)
    assert {(v.rule, v.where) for v in found} == {("C1", "layer 0"), ("C1", "layer 1")}


# ------------------------------------------------------------------ mlx-vlm itself
def req_ops(keys, cancel=False):
    if cancel:
        return [dict(op="begin", keys=keys, spans=[]), dict(op="prefill", max_chunks=1), dict(op="close")]
    return [dict(op="begin", keys=keys, spans=[]), dict(op="prefill", max_chunks=None),
            dict(op="step", key=keys[-1]), dict(op="close")]


@needs_mlx_vlm
def test_mlx_vlm_media_program_breaks_no_rule():
    """Same image twice, two different images of one token count, an image at another position,
    text-only turns, a budget that evicts, a cancel: judged by the rules, nothing flagged; the same
    with every item a video (random clips: wide, long or tall)."""
    from targets.mlx_vlm.search import run
    a, b = fold_key(b"a", (), 3), fold_key(b"b", (), 3)
    ops = (req_ops([1, 2, a, a, a, 3, 4, 1, 2, 3]) + req_ops([1, 2, a, a, a, 3, 4, 1, 2, 4])
           + req_ops([1, 2, b, b, b, 3, 4, 1, 2, 3]) + req_ops([1, 2, 3, 4, 1, a, a, a, 2, 3, 4])
           + req_ops([1, 2, 3, 4, 1, 2, 3, 4, 4]) + [dict(op="set_budget", budget=4096)]
           + req_ops([4, 4, 4, 4, 3, 3, 3, 3, 2, 2, 2, 2, 1]) + req_ops([1, 2, a, a, a, 3, 4, 1, 2, 3, 1], cancel=True))
    for arch in ("qwen2_vl", "qwen3_5"):
        for media in ("image", "video"):
            v = run(ops, {"arch": arch, "image_kind": "random", "media": media})
            assert v.error is None and v.violations == [] and v.steps == len(ops), (arch, media)


@needs_mlx_vlm
def test_gemma3_windowed_checkpoints_break_no_rule():
    """gemma3 (a RotatingKVCache layer of window 4 and a KV layer: APC's checkpoint mode), text-only:
    follow-ups resume from checkpoints past the window (the ring has wrapped), an edit does not;
    judged by the rules, nothing flagged."""
    from targets.mlx_vlm.search import run
    from targets.mlx_vlm.target import MlxVlmTarget
    prompts = ([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1], [1, 2, 3, 4, 1, 2, 3, 3, 3],
               [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 2])
    config = {"arch": "gemma3", "image_kind": "random", "media": "none"}
    v = run([op for keys in prompts for op in req_ops(list(keys))], config)
    assert v.error is None and v.violations == [] and v.steps == 4 * len(prompts)
    t = MlxVlmTarget(**config)
    resumes = []
    for keys in prompts:
        resumes.append(t.begin(keys)[1])
        t.prefill(None)
        t.close()
    t.shutdown()
    assert [layer.kind for layer in t.view().layers] == ["windowed", "kv"]
    assert resumes == [0, 9, 0, 12]


@needs_mlx_vlm
def test_saved_findings_reproduce():
    from targets.mlx_vlm.report import FINDINGS
    from targets.mlx_vlm.search import run
    for p in sorted(FINDINGS.glob("*.json")):
        f = json.loads(p.read_text())
        v = run(f["ops"], f["config"], f["rule"])
        assert f["rule"] in v.rules and [str(x) for x in v.violations] == f["violations"], p.name


def _script(name="test_c1_image_dims_not_in_key.py"):
    from targets.mlx_vlm.report import FINDINGS
    spec = importlib.util.spec_from_file_location(name[:-3], FINDINGS / name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


IMAGE, VIDEO = "test_c1_image_dims_not_in_key.py", "test_c1_video_dims_not_in_key.py"
SCRIPT_TESTS = ((IMAGE, "test_qwen3_5_portrait_page_is_not_served_the_landscape_checkpoint", "image_grid_thw"),
                (IMAGE, "test_qwen2_vl_portrait_page_is_not_served_the_landscape_blocks", "image_grid_thw"),
                (VIDEO, "test_qwen3_5_tall_strip_is_not_served_the_wide_strip_checkpoint", "video_grid_thw"),
                (VIDEO, "test_qwen2_vl_wide_strip_is_not_served_the_slideshow_blocks", "video_grid_thw"))


@needs_mlx_vlm
@pytest.mark.parametrize("script,name,grid", SCRIPT_TESTS)
def test_exported_script_fails_on_this_mlx_vlm(script, name, grid, monkeypatch):
    with pytest.raises(AssertionError, match="served the (landscape page's|first clip's) state"):
        getattr(_script(script), name)(monkeypatch)


@needs_mlx_vlm
@pytest.mark.parametrize("script,name,grid", SCRIPT_TESTS)
def test_exported_script_passes_with_the_grid_in_the_salt(script, name, grid, monkeypatch):
    """The fix the finding names (its grid folded into the server's salt) makes the script pass (the
    same fix inside mlx-vlm's source: targets/mlx_vlm/onefix.py)."""
    mod = _script(script)
    plain = mod.salt

    def fixed(model, processor, raw):
        return mod.apc.semantic_extra_hash(tenant=None, image_hash=plain(model, processor, raw),
                                           media={grid: raw[grid]})
    monkeypatch.setattr(mod, "salt", fixed)
    getattr(mod, name)(monkeypatch)


@needs_mlx_vlm
def test_the_driver_salt_is_the_servers():
    """driver.server_salt runs the server's ResponseGenerator.generate: equal to semantic_extra_hash over
    pixel_values and the video payload as generate passes them, and it changes with the video bytes."""
    from mlx_vlm import apc

    from targets.mlx_vlm import models
    from targets.mlx_vlm.driver import server_salt
    model, proc = models.load("qwen2_vl"), models.Processor("qwen2_vl")
    a, b = fold_key(b"a", (), 3), fold_key(b"b", (), 3)
    salts = []
    for keys in ([1, a, a, a, 2], [1, b, b, b, 2]):
        _, raw = models.request(keys, proc, {}, "random", "video")
        mine = apc.semantic_extra_hash(tenant=None, image_hash=0, media={"audio": None, "video": raw["pixel_values_videos"]},
                                       model=model.language_model, processor=proc)
        salts.append(server_salt(model, proc, raw))
        assert salts[-1] == mine
    assert salts[0] != salts[1]
