"""Export a failing program as a Go test file an Ollama maintainer can paste into
x/mlxrunner as it is (next to prefix_cache_test.go, whose fakes, feedAll and
snapshotTracker it uses), to see it fail and, once fixed, pass.

The test replays the program through the prefix cache the way the harness
drives it (begin, the pipeline's snapshot schedule, chunked feeds honouring
non-causal items, attach, outputs, close, eviction) and checks the rule the
program broke where the machine judged it.

Invariants:
  - every operation of the program is a statement; none is left as a comment.
    The budget is Ollama's own constant (maxPagedOutBytes, 8 GiB): the test
    sizes the snapshots instead, as a real cache's arrays would be sized (a
    wrapper over each fake, tracking shapes only, allocating nothing): one
    program byte is `unit` real bytes, unit = maxPagedOutBytes / budget (budget
    0: maxPagedOutBytes + 1), so `counter > budget` holds in program bytes
    exactly when it holds in real bytes (budgets below ~92k program bytes). A
    budget change rescales the sizes of every snapshot made so far and the
    counter with them, then runs enforceEvictionPolicy;
  - every name a file defines is prefixed by its test's name, so the exports of
    several rules can be pasted side by side;
  - the generated text is ours; it calls only names of Ollama's package.
"""
from __future__ import annotations

from targets.ollama.gochecks import CHECKS, COVERAGE, DEEPEST, E1, E3, KEYOF, S4
from targets.ollama.gotemplates import SETUP, WRAPPER
from targets.ollama.target import COST

LAYOUT = {                       # newXEnv's layers: (kind, fake)
    "transformer": [("kv", "&fakeRewindableCache{tracker: tr}")],
    "sliding": [("kv", "&fakeRewindableCache{tracker: tr}"),
                ("windowed", "&fakeSlidingWindowCache{maxSize: 4, tracker: tr}")],
    "recurrent": [("kv", "&fakeRewindableCache{tracker: tr}"), ("recurrent", "&fakeRecurrentCache{tracker: tr}")],
    "stateless": [("recurrent", "&fakeRecurrentCache{tracker: tr}"), (None, "nil"),
                  ("kv", "&fakeRewindableCache{tracker: tr}"), (None, "nil")],
    "hybrid": [("recurrent", "&fakeRecurrentCache{tracker: tr}"), ("kv", "&fakeRewindableCache{tracker: tr}"),
               ("recurrent", "&fakeRecurrentCache{tracker: tr}"), ("kv", "&fakeRewindableCache{tracker: tr}"),
               ("kv", "&fakeRewindableCache{tracker: tr}")],
}
LAYOUT_GO = {k: ", ".join(f for _, f in v) for k, v in LAYOUT.items()}

def schedule(n: int, interval: int, near_end: int) -> list:
    offs = [o for o in range(interval, n, interval)] if interval > 0 else []
    return offs + ([n - near_end] if n - near_end > 0 else [])


def go_int(x: int) -> str:
    return str(int(x) if x < 1 << 31 else int(x) - (1 << 32))


def go_ints(xs) -> str:
    return "{" + ", ".join(go_int(x) for x in xs) + "}"


def _go_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def export(rule: str, ops: list, name: str | None = None) -> str | None:
    """The program as a Go test file; None on a "-lazy" layout, whose lazy views Ollama's fakes cannot express."""
    reset = ops[0]
    if reset["layout"] not in LAYOUT:
        return None
    fn = name or f"TestPrefixTrie{rule}Found"
    prefix = fn[4].lower() + fn[5:] if fn.startswith("Test") else "x" + fn
    layout = LAYOUT[reset["layout"]]
    budget = int(reset.get("budget", 1 << 40))
    sub = {"{N}": prefix, "{B}": str(budget), "{CHUNK}": str(int(reset["chunk"])),
           "{FAKES}": LAYOUT_GO[reset["layout"]],
           "{KINDS}": ", ".join(_go_str(k or "") for k, _ in layout),
           "{COSTS}": ", ".join(str(COST[k] if k else 0) for k, _ in layout), "{RULE}": _go_str(rule)}

    def fill(text: str) -> str:
        for k, v in sub.items():
            text = text.replace(k, v)
        return text

    body = [fill(SETUP)]
    if rule in ("C2", "E5"):
        body.append(DEEPEST)
    if rule == "E1":
        body.append(E1)
    if rule in ("E3", "S4"):
        body.append(KEYOF)
        body.append(E3 if rule == "E3" else S4)
    around = {"E3": "e3", "S4": "s4"}.get(rule)

    def emit(stmt: str, label: str, growing: bool = False) -> None:
        """One operation; E3 and S4 are judged around it."""
        if around:
            body.append(f"\t{around}({_go_str(label)}, {str(growing).lower()}, func() {{ {stmt.strip()} }})")
        else:
            body.append(stmt)

    phase = "idle"                    # spec.view.View.phase: E1 is judged at rest (idle, or begun before a chunk)
    for i, op in enumerate(ops[1:], 1):
        name_ = op["op"]
        phase = {"begin": "begun", "prefill": "prefilled", "step": "decoding", "close": "idle"}.get(name_, phase)
        label = f"operation {i} ({'setBudget' if name_ == 'set_budget' else name_})"
        if name_ == "begin":
            ks = list(op["keys"])
            body.append(f"\tkeys = []int32{go_ints(ks)}")
            its = ", ".join(f"{{pos: {p}, length: {e - p}, fold: uint32(keys[{p}])}}" for p, e in op["spans"])
            body.append(f"\titems = []mediaItem{{{its}}}")
            if rule in ("C2", "E5"):
                body.append("\tif m, r := deepest(); true {")
            begin = "s = pc.begin(keys, items)"
            emit(f"\t{begin}", label)
            body.append("\tseeded = false")
            if rule == "C2":
                body.append(f"\t\tif got := pc.minCacheOffset(); got != r {{\n\t\t\tfail(\"C2 at {label}: "
                            "resumed at %d, the trie serves %d\", got, r)\n\t\t}\n\t\t_ = m\n\t}")
            elif rule == "E5":
                body.append(f"\t\tif got := pc.minCacheOffset(); r < m && got != r {{\n\t\t\tfail(\"E5 at {label}: "
                            "resumed at %d, the newest surviving checkpoint before %d is %d\", got, m, r)\n\t\t}\n\t}")
            body.append(f"\ts.schedulePrefillSnapshots([]int{go_ints(schedule(len(ks), reset['interval'], reset['near_end']))})")
            if rule == "E1":
                body.append(f"\te1({_go_str(label)})")
        elif name_ == "prefill":
            emit(f"\tprefill({op['max_chunks'] or 0})", label, growing=True)
        elif name_ == "step":
            body.append(f"\tstep({go_int(op['key'])})")
        elif name_ == "close":
            emit("\ts.close()", label, growing=True)
            if rule == "E1":
                body.append(f"\te1({_go_str(label)})")
        elif name_ == "set_budget":
            emit(f"\tsetBudget({int(op['budget'])})", label)
            if rule == "E1" and phase in ("idle", "begun"):
                body.append(f"\te1({_go_str(label)})")
    check = CHECKS.get(rule)
    body.append(fill(COVERAGE) if check is None else check)
    body.append("\tcheckTrieInvariants(t, pc.root)\n\t_, _, _, _, _ = s, items, prefill, step, setBudget")
    head = (f"package mlxrunner\n\n// Generated by prefix-trie-mlx (check-ollama): a program that broke rule {rule} on the "
            f"{reset['layout']} layout.\n// Save as x/mlxrunner/{prefix}_test.go and run: go test ./x/mlxrunner -run '^{fn}$'\n\n"
            "import (\n\t\"fmt\"\n\t\"testing\"\n\n\t\"github.com/ollama/ollama/x/mlxrunner/cache\"\n)\n\n")
    return head + fill(WRAPPER) + f"\nfunc {fn}(t *testing.T) {{\n" + "\n".join(body) + "\n}\n"
