"""Benchmark smoke runs: a tiny run of each workload and of the fifty-turn table on the small hybrid.

No timed assertions: only that the figures are self-consistent (ours never prefills fewer tokens than
the ideal nor more than no cache, bytes held >= 0, the tight budget holds) and that the fifty-turn run
plateaus at or under the budget (+ one turn) with E2 protection while the pre-fix policy outgrows it.
"""

from __future__ import annotations

import pytest

from bench import workloads as W
from bench.runners import Ideal, common_prefix, distinct_tokens

pytestmark = pytest.mark.bench

TINY = {
    "chat": dict(convs=2, turns=2, answer=4, system_tokens=60, question=(6, 10)),
    "branching": dict(rounds=1, answer=4, system_tokens=60, question=(6, 10)),
    "agent": dict(start_tokens=150, context_tokens=340, answer=4, tool_tokens=(30, 50), system_tokens=60),
}


def test_ideal_and_helpers_on_synthetic_sequences():
    assert common_prefix([1, 2, 3] * 50, [1, 2, 3] * 50 + [4]) == 150
    assert distinct_tokens([[1, 2, 3], [1, 2, 4], [5]]) == 5
    ideal = Ideal(interval=4, near_end=2)
    assert ideal.prefill([1, 2, 3]) == 3                      # cold
    ideal.add([1, 2, 3, 4, 5, 6], [7, 8])                      # evaluated: 1..7
    assert ideal.prefill([1, 2, 3, 4, 5, 6]) == 1              # full match backs off by one
    assert ideal.prefill([1, 2, 3, 4, 5, 6, 7, 8, 9]) == 2     # 1..7 covered
    assert ideal.prefill([1, 2, 9]) == 1
    # checkpoints: end of evaluated (7), near end (4), interval (4)
    assert ideal.prefill_at_captures([1, 2, 3, 4, 5, 6, 7, 8, 9]) == 2
    assert ideal.prefill_at_captures([1, 2, 3, 4, 5, 9]) == 2  # lands on 4
    assert ideal.prefill_at_captures([1, 2, 9]) == 3           # no checkpoint at 2


def test_workloads_are_deterministic_and_shaped():
    from impl.models import shared_tokenizer

    tok = shared_tokenizer()
    for name, kw in TINY.items():
        a, b = W.build(name, tok, seed=3, **kw), W.build(name, tok, seed=3, **kw)
        fake = {i: [7] * r.max_tokens for i, r in enumerate(a.requests)}
        assert [a.prompt(i, fake) for i in range(len(a))] == [b.prompt(i, fake) for i in range(len(b))]
        assert len(a) >= 3
    br = W.build("branching", tok, **TINY["branching"])
    kinds = {r.kind for r in br.requests}
    assert {"regenerate", "edit", "fork"} <= kinds
    regen = next(i for i, r in enumerate(br.requests) if r.kind == "regenerate")
    fake = {i: [7, 8, 9, 10] for i in range(len(br))}
    assert br.prompt(regen, fake) == br.prompt(regen - 1, fake)
    ag = W.build("agent", tok, **TINY["agent"])
    lens = [len(ag.prompt(i, fake)) for i in range(len(ag))]
    assert lens == sorted(lens) and lens[-1] <= TINY["agent"]["context_tokens"]


@pytest.fixture(scope="module")
def hybrid():
    from bench.runners import geometry
    from impl.models import load

    lm = load("qwen3next")
    return lm, geometry(lm)


@pytest.mark.parametrize("name", list(TINY))
def test_workload_figures_are_consistent(hybrid, name):
    from bench import floors, report, suite

    from impl.caches import live_snapshots

    lm, geom = hybrid
    assert geom.checkpoint_bytes > 0 and geom.kv_bytes_per_token > 0
    wl = W.build(name, lm.tokenizer, **TINY[name])
    base = live_snapshots()
    rows = suite.run_case(lm, geom, wl, suite.Settings(chunk=128, check_rules=True), log=lambda *_: None)
    assert live_snapshots() == base                           # the runners released what they held (A2)
    for budget, r in rows.items():
        assert r["ours_below_ideal"] == 0, r                 # never fewer than the ideal, per request
        assert r["ours_above_none"] == 0, r                  # never more than no cache, per request
        assert r["prefilled_ideal"] <= r["prefilled_ours"] <= r["prefilled_none"] == r["prompt_tokens"]
        assert r["prefilled_lru"] <= r["prefilled_none"]
        assert r["prefilled_ideal"] <= r["prefilled_ideal_cp"] <= r["prefilled_none"]
        assert r["held_ours"] >= 0 and r["held_lru"] >= 0 and r["paged_out_ours"] >= 0
        assert r["peak_ours"] >= r["weights"] and r["peak_lru"] >= r["weights"]
        assert r["bk_frac"] is not None and r["bk_frac"] >= 0
        # E1 (budget held unless every node left is protected) is checked inside the engine after every
        # operation: check_rules=True raises RuleViolation otherwise.
        if budget == "tight":
            assert r["evictions_ours"] > 0 or r["paged_out_ours"] <= r["budget_bytes"]
        assert r["ttft_ours_lru"] > 0 and r["ttft_ours_none"] > 0
    assert rows["ample"]["prefilled_ours"] <= rows["tight"]["prefilled_ours"]
    assert "|" in report.markdown_table(list(rows.values()))
    # structural floors of issue #16 that the hybrid meets at this size (bench/floors.py)
    lines = [x for x in floors.judge(list(rows.values()))
             if x["floor"] in ("gap<=interval", "held<=mlx", "iso prefill<=mlx")]
    assert "iso prefill<=mlx" in {x["floor"] for x in lines}
    assert lines and all(x["ok"] for x in lines), floors.table(lines)
    tight = rows["tight"]
    assert tight["iso_held_ours"] <= tight["held_lru"] and tight["iso_trials"]


STRUCTURAL = ("pure=ideal", "B/token<=1.1raw", "held<=mlx", "gap<=interval", "prefill<=mlx")


def test_structural_floors_on_pure_attention_chat():
    """Issue #16's structural floors (token and byte counts, never timings) on SmolLM2: prefill at the
    ideal, every cached token's K/V rows held once (<= 1.1x raw KV per distinct cached token), ours
    holds (ample rows) and evaluates no more than mlx-lm's server cache at the same budget, and matched -
    resumed stays within the capture interval. (The iso-memory search, ~10 more SmolLM2 runs of the
    workload, is left to the hybrid's tests above.)"""
    from bench import floors, suite
    from bench.runners import geometry
    from impl.models import load

    lm = load("smollm2")
    wl = W.build("chat", lm.tokenizer, **TINY["chat"])
    rows = suite.run_case(lm, geometry(lm), wl, suite.Settings(chunk=128, check_rules=True, iso=False),
                          log=lambda *_: None)
    lines = [x for x in floors.judge(list(rows.values())) if x["floor"] in STRUCTURAL]
    assert {x["floor"] for x in lines} == set(STRUCTURAL)
    assert all(x["ok"] for x in lines), floors.table(lines)


def test_fifty_turns_plateaus_under_e2_and_grows_under_prefix_policy():
    from bench import fifty_turns

    res = fifty_turns.run("qwen3next", turns=16, budget_checkpoints=4, answer=6, chunk=128, check=True)
    budget, turn = res["budget"], res["turn_bytes"]
    fixed = [r["paged_out"] for r in res["policies"]["fixed"]["rows"]]
    pre = [r["paged_out"] for r in res["policies"]["prefix"]["rows"]]
    assert turn > 0
    assert max(fixed) <= budget + turn                       # plateau at or under the budget (+ one turn)
    assert fixed[-1] == fixed[-4]                            # flat at the end
    assert pre[-1] > budget + turn                           # the pre-fix policy outgrows it
    assert pre == sorted(pre)                                # and never shrinks
    assert res["same_tokens"]


def test_scale_smoke(tmp_path):
    """python -m bench.scale --smoke: random-weight models built, saved and loaded through mlx-lm's
    loader, a chat served by ours, the limit (ours' prefill forwards on a warm stock cache), mlx-lm's
    server cache and no cache; figures self-consistent, the TTFT / limit columns and ours' bookkeeping
    share present and positive (no timing asserted)."""
    import json

    from bench import scale

    assert scale.main(["--smoke", "--conversations", "2", "--turns", "2", "--report", str(tmp_path)]) == 0
    for arch in ("llama", "qwen3next"):
        rep = json.loads((tmp_path / f"scale-{arch}-smoke-smoke.json").read_text())
        runs = {r["runner"]: r for r in rep["runners"]}
        assert [r["runner"] for r in rep["runners"]] == ["ours", "limit", "server", "none"] and rep["device"]
        assert runs["none"]["prefilled"] == runs["none"]["prompt_tokens"]
        for r in runs.values():
            assert r["requests"] == 4 and r["ttft_sum_s"] > 0
        assert all(runs[k]["peak_bytes"] > 0 for k in ("ours", "server", "none"))
        assert runs["ours"]["prefilled"] < runs["none"]["prefilled"]
        assert runs["ours"]["held_bytes"] > 0 and runs["none"]["held_bytes"] == 0
        ours, lim = runs["ours"], runs["limit"]
        assert lim["prefilled"] == ours["prefilled"]
        for o, x in zip(ours["rows"], lim["rows"], strict=True):
            assert x["resumed"] == o["resumed"] and x["prefilled"] == o["prefilled"] == o["prompt"] - o["resumed"]
            assert x["ttft_s"] > 0 and x["ratio"] > 0
        assert sum(o["resumed"] > 0 for o in ours["rows"]) >= 2          # later turns resume from the trie
        for o in ours["rows"]:                       # the first token's time, split (tests/impl/test_engine_timing.py)
            assert 0 < o["ttft_forward_s"] <= o["forward_s"] and 0 < o["ttft_bookkeeping_s"] <= o["bookkeeping_s"]
            assert o["ttft_forward_s"] + o["ttft_bookkeeping_s"] <= o["ttft_s"]
        ratio = ours["ttft_over_limit"]
        assert ratio == lim["ttft_over_limit"] and 0 < ratio["median"] <= ratio["p90"] <= ratio["max"]
        gap = ratio["gap_s"]                         # ours over the limit, summed, and its parts
        assert gap["total"] == pytest.approx(ours["ttft_sum_s"] - lim["ttft_sum_s"], abs=1e-9)
        forwards = sum(o["ttft_forward_s"] for o in ours["rows"])
        assert gap["forward"] == pytest.approx(forwards - lim["ttft_sum_s"], abs=1e-9)
        assert gap["bookkeeping"] == pytest.approx(sum(o["ttft_bookkeeping_s"] for o in ours["rows"]), abs=1e-9)
        assert gap["other"] >= 0 and gap["bookkeeping"] > 0
        md = (tmp_path / f"scale-{arch}-smoke-smoke.md").read_text()
        assert "| limit |" in md and "TTFT ours / limit" in md and "Ours' TTFT over the limit's" in md
        bk = ours["bookkeeping_over_forward"]                  # ours' bookkeeping share; the others have none
        assert 0 < bk < 10 and runs["server"]["bookkeeping_over_forward"] is None
        assert f"| {bk:.2%} |" in md


def test_limit_replays_exactly_the_forwards_ours_reported():
    """bench/limit.py: the prefill plan must run contiguously from the resume offset to the decode seed;
    anything else is refused before a forward runs. Ratio statistics: median, p90, max. The runner list
    puts ours before the limit, adding it when not named."""
    from bench.limit import check_plan, ratio_stats
    from bench.scale import runner_order

    assert runner_order(None) == ["ours", "limit", "server", "none"]
    assert runner_order(["server", "limit"]) == ["ours", "limit", "server"]      # ours first: limit replays it
    assert runner_order(["none", "ours", "limit"]) == ["none", "ours", "limit"]
    assert check_plan(10, 3, [[3, 7], [7, 9]]) == [(3, 7), (7, 9)]
    assert check_plan(10, 9, []) == []
    for resumed, chunks in ((3, [[4, 9]]), (3, [[3, 7]]), (3, [[3, 7], [6, 9]]), (0, [[0, 10]]), (10, []),
                            (3, [[3, 3], [3, 9]])):
        with pytest.raises(ValueError):
            check_plan(10, resumed, chunks)
    r = ratio_stats([2.0, 1.0, 3.0, 1.0], [1.0, 1.0, 1.0, 2.0])
    assert r["median"] == 1.5 and r["max"] == 3.0 and r["per_request"] == [2.0, 1.0, 3.0, 0.5]
    assert r["p90"] == pytest.approx(2.7)
    with pytest.raises(ValueError):
        ratio_stats([1.0], [0.0])


def test_iso_memory_search_meets_the_target_from_below(hybrid):
    """bench/iso_memory.py on the tiny hybrid: the budget found holds no more than the target, the next
    budget tried above it (within one step) holds more; a target under what budget 0 holds is not found."""
    from bench import iso_memory, suite

    lm, geom = hybrid
    wl = W.build("chat", lm.tokenizer, **TINY["chat"])
    reqs = iso_memory.requests_of(wl, {i: [7 + i] * r.max_tokens for i, r in enumerate(wl.requests)})
    s = suite.Settings(chunk=128, check_rules=True)
    full, none = iso_memory.run_ours(lm, reqs, 1 << 62, s), iso_memory.run_ours(lm, reqs, 0, s)
    assert none["held"] < full["held"] and none["prefilled"] > full["prefilled"]
    step, target = geom.checkpoint_bytes, (none["held"] + full["held"]) // 2
    budget = {"budget": full["held"]}
    for start in (none, {**full, **budget}):                  # upwards from budget 0, downwards from above
        res = iso_memory.search(lm, reqs, s, target, step, start)
        at, above = res["at"], res["above"]
        assert res["found"] and at["held"] <= target < above["held"], (start["budget"], res["trials"])
        assert above["budget"] - at["budget"] <= step or above["budget"] == iso_memory.AMPLE
        assert len(res["trials"]) <= 3 + (full["held"] // step).bit_length()
    miss = iso_memory.search(lm, reqs, s, none["held"] - 1, step, {**full, **budget})
    assert not miss["found"] and miss["at"]["budget"] == 0
    easy = iso_memory.search(lm, reqs, s, full["held"], step, none)   # unlimited holds no more: that run
    assert easy["found"] and easy["at"]["budget"] == iso_memory.AMPLE and easy["above"] is None


def test_iso_floor_replaces_held_on_tight_rows():
    """bench/floors.py: held<=mlx is judged on ample rows only; a tight row is judged at equal bytes held
    (iso prefill<=mlx), failing when ours evaluates more there or no budget brings it down to mlx-lm's."""
    from bench import floors

    base = {"workload": "chat", "model": "m", "prefilled_ideal_cp": 1, "prefilled_ours": 10, "prefilled_ideal": 10,
            "prefilled_lru": 12, "evaluated_ours": 13, "evaluated_lru": 16, "held_ours": 500, "held_lru": 400,
            "gap_max_ours": 0, "interval": 256}
    ample = floors.judge([{**base, "budget": "ample"}])
    assert [x["ok"] for x in ample if x["floor"] == "held<=mlx"] == [False]
    iso = {"iso_found": True, "iso_trials": [{}] * 3, "iso_budget": 100,
           "iso_held_ours": 390, "iso_prefilled_ours": 11, "iso_evaluated_ours": 14, "iso_above_budget": 150,
           "iso_above_held": 450}
    for extra, ok in (({}, True), ({"iso_evaluated_ours": 17}, False), ({"iso_held_ours": 401}, False),
                      ({"iso_found": False}, False)):
        lines = floors.judge([{**base, "budget": "tight", **iso, **extra}])
        assert "held<=mlx" not in {x["floor"] for x in lines}
        assert [x["ok"] for x in lines if x["floor"] == "iso prefill<=mlx"] == [ok], extra


def test_reruns_keep_earlier_runs_flat_under_dated_headings():
    """A rerun keeps the file's run and the runs it kept as one flat "Earlier runs" section, each under
    "### Run of <date>" with its own headings at level 4 (never past Markdown's six), the hand-written
    analysis kept, the marker and code blocks as they were; a file of the older nested layout (each
    older run one level further down) reads the same way."""
    from bench.__main__ import EARLIER, MARKER, _earlier

    def run(date, note):
        return (f"# Title\n\n- Date: {date}; wall time 1 min.\n\n```\n# a shell comment\n```\n\n## Table\n\n| a |\n"
                f"\n### Detail\n\n{MARKER}\n\n{note}\n")

    def old_earlier(text):     # the layout before: each older run one heading level further down
        body = text.split("\n", 1)[1]
        body = "\n".join("#" + ln if ln.startswith("#") else ln for ln in body.splitlines())
        return "---\n\n" + EARLIER + "\n" + body + "\n"

    flat = run("2026-01-03 10:00 UTC", "third") + "\n" + _earlier(run("2026-01-02 10:00 UTC", "second") + "\n" +
                                                                 _earlier(run("2026-01-01 10:00 UTC", "first")))
    old_layout = run("2026-01-03 10:00 UTC", "third") + "\n" + old_earlier(
        run("2026-01-02 10:00 UTC", "second") + "\n" + old_earlier(run("2026-01-01 10:00 UTC", "first")))
    assert "#### Table" in old_layout and "##### Detail" in old_layout                # (the nesting it had)
    for text in (flat, old_layout):
        out = _earlier(text)
        fence, heads = False, []
        for ln in out.splitlines():
            fence ^= ln.startswith("```")
            if ln.startswith("#") and not fence:
                heads.append(ln)
        assert heads == [EARLIER] + [h for d in ("03", "02", "01") for h in
                                    (f"### Run of 2026-01-{d} 10:00 UTC", "#### Table", "##### Detail")]
        assert MARKER not in out
        assert text is old_layout or out.count("\n# a shell comment\n") == 3       # (the old layout edited them)
        assert [ln for ln in out.splitlines() if ln in ("first", "second", "third")] == ["third", "second", "first"]
    deep = "# T\n\n- Date: 2026-01-09 10:00 UTC; x\n\n######## Deep\n"     # an old file's run seven levels down
    assert "#### Deep" in _earlier(deep).splitlines()


def test_pagein_split_smoke(tmp_path, monkeypatch):
    """python -m bench.pagein_split: a request's bookkeeping split (docs/benchmarks.md). A cold request
    copies nothing out; each resume copies out whole layers' K and V views (4 layers: a multiple of 8
    arrays), whose bytes the allocator serves from its pool or anew. The runs experiment copies fewer
    arrays and restores the same first tokens. The timers are removed when the block ends. (The
    page-in MLX's stream evaluates, a GPU's: on the CPU device the rows are copied on the host.)"""
    import json

    from bench import pagein_split, scale
    from tests.support.evaluations import copies_made

    copies_made(monkeypatch, "stream")
    from impl.caches.kv_views import LiveViews
    from impl.prefix_cache import PrefixCache

    begin, mat = PrefixCache.begin, LiveViews.__dict__["_materialise_views"]
    got, first = {}, {}
    for runs in (False, True):
        recs: list = []
        rep = tmp_path / str(runs)
        with pagein_split.split_timers(recs, runs=runs):
            assert scale.main(["--smoke", "--arch", "llama", "--runner", "ours", "--conversations", "2",
                               "--turns", "2", "--report", str(rep)]) == 0
        assert PrefixCache.begin is begin and LiveViews.__dict__["_materialise_views"] is mat
        got[runs] = [r for r in recs if r["engine"] == recs[-1]["engine"]]
        first[runs] = [r["first"] for r in json.loads(next(rep.glob("*.json")).read_text())["runners"][0]["rows"]]
    base = got[False]
    assert [r["resumed"] > 0 for r in base] == [False, True, True, True]
    for r in base:
        assert r["bookkeeping_s"] > 0 and r["begin"] > 0 and r["close"] > 0
        assert (r["pagein_arrays"] > 0) == (r["resumed"] > 0) and r["pagein_arrays"] % 8 == 0
        # every byte the page-in copied was allocated, from the pool or new (rounded up, never less)
        assert r.get("pagein_pool_bytes", 0) + r.get("pagein_fresh_bytes", 0) >= r.get("pagein_bytes", 0)
    assert any(r.get("pagein_pool_bytes", 0) + r.get("pagein_fresh_bytes", 0) > 0 for r in base)
    assert [r["resumed"] for r in got[True]] == [r["resumed"] for r in base] and first[True] == first[False]
    assert all(x["pagein_arrays"] <= r["pagein_arrays"] for x, r in zip(got[True], base))
    assert sum(x["pagein_arrays"] for x in got[True]) < sum(r["pagein_arrays"] for r in base)
    assert "| **sum** " in pagein_split.table(base)
    book, moved = (sum(r.get(k, 0.0) for r in base for k in keys) for keys in (("bookkeeping_s",), pagein_split.COPIES))
    assert 0 < moved < book and sum(r["restore"] for r in base) > 0
    assert pagein_split.shares(base).startswith(f"bookkeeping {book * 1e3:.1f} ms (")
    assert f"+ the rest {(book - moved) * 1e3:.1f} ms (" in pagein_split.shares(base)


def test_bookkeeping_split_accounts_for_each_rows_figure():
    """python -m bench.bookkeeping --split: each row's split is made of that row's own requests (the
    records are told apart by budget), so its bookkeeping and forward sums give back the row's figure;
    the timed parts cover the bookkeeping (what is left is the timers' own cost and a check or two,
    far below `begin`'s share, the largest part); only the tight row evicts. The timers are removed
    afterwards."""
    from bench import bookkeeping
    from impl.prefix_cache import PrefixCache

    evict, begin, restore = PrefixCache._evict, PrefixCache.begin, PrefixCache._restore
    rows = bookkeeping.measure("qwen3next", ["chat"], 1, split=True, scale="quick")
    assert PrefixCache._evict is evict and PrefixCache.begin is begin and PrefixCache._restore is restore
    assert [(w, b) for w, _, b, *_ in rows] == [("chat", "ample"), ("chat", "tight")]
    for _, _, budget, median, runs, sp in rows:
        assert median == runs[0] > 0
        assert sp["requests"] == 6                        # quick chat: 2 conversations x 3 turns, one run
        assert 100 * sp["bookkeeping"] / sp["forward"] == pytest.approx(median, rel=1e-9)
        assert abs(sp["other"]) < 0.25 * sp["bookkeeping"], sp
        assert sp["begin"] > 0 and sp["close"] > 0 and sp["prefilled"] > 0
        assert sp["evict"] > 0                            # (the budget test runs on every verb)
        assert (sp["evictions"] > 0) == (budget == "tight"), (budget, sp)
        assert 0 < sp["restore"] < sp["begin"]            # chat switches conversations: begin restores
        assert sp["copies"] == pytest.approx(sp["restore"] + sp["before_write"] + sp["pagein_eval"])
        assert sp["rest"] == pytest.approx(sp["bookkeeping"] - sp["copies"]) and sp["rest"] > 0
    assert bookkeeping.split_of([]) == {}


def test_scale_layers_and_pagein_split_stream_copies(tmp_path):
    """bench.scale --layers N: the size's model with N layers, cached apart from the size's own; and
    bench.pagein_split --stream-copies: the views copied with MLX's stream as on a GPU, so on the CPU the
    page-in evaluates copies (a multiple of N x K/V arrays a resume) where host copies make none;
    host_rows' setting is restored afterwards."""
    import json

    from bench import pagein_split, scale
    from impl.caches import host_rows

    assert scale.model_dir("llama", "smoke", "float32", 6) != scale.model_dir("llama", "smoke", "float32")
    assert len(scale.build("llama", "smoke", layers=6).layer_kinds) == 6
    before, out = host_rows.ENABLED, tmp_path / "records.json"
    assert pagein_split.main(["--stream-copies", "--json", str(out), "--", "--smoke", "--arch", "llama", "--layers",
                              "6", "--runner", "ours", "--conversations", "2", "--turns", "2",
                              "--report", str(tmp_path)]) == 0
    assert host_rows.ENABLED is before
    recs = json.loads(out.read_text())
    resumed = [r for r in recs if r["engine"] == recs[-1]["engine"] and r["resumed"] > 0]
    assert resumed and all(r["pagein_arrays"] % 12 == 0 for r in resumed), resumed
    assert sum(r["pagein_arrays"] for r in resumed) > 0
    assert next(tmp_path.glob("scale-llama-smoke-6layers-smoke-ours.json"))

