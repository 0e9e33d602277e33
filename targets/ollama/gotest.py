"""Export a failing program as a Go test an Ollama maintainer can paste into
x/mlxrunner (next to prefix_cache_test.go, whose fakes and feedAll it uses).

The test replays the program through the prefix cache the way the harness
drives it (begin, the pipeline's snapshot schedule, chunked feeds honouring
non-causal items, attach, outputs, close) and ends with the check of the rule
the program broke. Generated text is ours; it calls only names that Ollama's
x/mlxrunner package and its test file define.

Budget operations cannot be replayed as such (maxPagedOutBytes is a constant
there): they are left as comments, and so is the snapshot sizing.
"""
from __future__ import annotations

LAYOUT_GO = {
    "transformer": "&fakeRewindableCache{tracker: tr}",
    "sliding": "&fakeRewindableCache{tracker: tr}, &fakeSlidingWindowCache{maxSize: 4, tracker: tr}",
    "recurrent": "&fakeRewindableCache{tracker: tr}, &fakeRecurrentCache{tracker: tr}",
    "stateless": "&fakeRecurrentCache{tracker: tr}, nil, &fakeRewindableCache{tracker: tr}, nil",
    "hybrid": "&fakeRecurrentCache{tracker: tr}, &fakeRewindableCache{tracker: tr}, "
              "&fakeRecurrentCache{tracker: tr}, &fakeRewindableCache{tracker: tr}, &fakeRewindableCache{tracker: tr}",
}

CHECKS = {
    "S3": """	if f := pc.activePath[len(pc.activePath)-1]; !hasAllSnapshots(f, pc.caches) {
		t.Errorf("S3: frontier [%d,%d) misses a layer after close", f.startOffset(), f.endOffset)
	}""",
    "P1": """	if f := pc.activePath[len(pc.activePath)-1]; f.endOffset != pc.minCacheOffset() {
		t.Errorf("P1: frontier ends at %d, live offset %d", f.endOffset, pc.minCacheOffset())
	}""",
    "M2": """	for _, p := range s.pendingSnapshots {
		for _, it := range items {
			if it.pos < p.offset && p.offset < it.pos+it.length {
				t.Errorf("M2: capture at %d inside media [%d,%d)", p.offset, it.pos, it.pos+it.length)
			}
		}
	}""",
    "M3": """	for _, it := range items {
		if o := pc.minCacheOffset(); it.pos < o && o < it.pos+it.length {
			t.Errorf("M3: resumed at %d inside media [%d,%d)", o, it.pos, it.pos+it.length)
		}
	}""",
}
CHECKS["T3"] = CHECKS["P1"]
COVERAGE = """	walkNodes(pc.root, func(n *trieNode) bool {
		for i, sn := range n.snapshots {
			if _, kv := pc.caches[i].(*fakeRewindableCache); kv && sn != nil {
				f := sn.(*fakeSnapshot)
				if f.from != n.startOffset() || f.to != n.endOffset || len(f.tokens) != f.to-f.from {
					t.Errorf("%s: node [%d,%d) layer %d holds [%d,%d) (%d tokens)", rule, n.startOffset(), n.endOffset, i, f.from, f.to, len(f.tokens))
				}
			}
		}
		return true
	})"""


def schedule(n: int, interval: int, near_end: int) -> list:
    offs = [o for o in range(interval, n, interval)] if interval > 0 else []
    return offs + ([n - near_end] if n - near_end > 0 else [])


def go_ints(xs) -> str:
    return "{" + ", ".join(str(int(x) if x < 1 << 31 else int(x) - (1 << 32)) for x in xs) + "}"


def export(rule: str, ops: list, name: str | None = None) -> str | None:
    """The program as a Go test; None on a "-lazy" layout, whose lazy views Ollama's fakes cannot express."""
    reset = ops[0]
    if reset["layout"] not in LAYOUT_GO:
        return None
    body = [f"\ttr := &snapshotTracker{{}}",
            f"\tpc := &prefixCache{{caches: []cache.Cache{{{LAYOUT_GO[reset['layout']]}}}}}",
            "\tvar s *cacheSession",
            "\tvar items []mediaItem",
            "\tvar keys []int32",
            "\tseeded := false",
            f"\trule := {rule!r}".replace("'", '"'),
            "\t_ = rule",
            "\tprefill := func(maxChunks int) {",
            "\t\ttarget, done := len(keys)-1, 0",
            "\t\tfor pc.minCacheOffset() < target && (maxChunks <= 0 || done < maxChunks) {",
            f"\t\t\tp := pc.minCacheOffset()\n\t\t\tq := min(p+{reset['chunk']}, target)",
            "\t\t\tfor _, it := range items {",
            "\t\t\t\tif it.pos < q && q < it.pos+it.length {",
            "\t\t\t\t\tif it.pos > p { q = it.pos } else { q = min(it.pos+it.length, target) }",
            "\t\t\t\t}",
            "\t\t\t}",
            "\t\t\tfeedAll(pc.caches, keys[p:q])",
            "\t\t\tdone++",
            "\t\t}",
            "\t\tif pc.minCacheOffset() >= target {",
            "\t\t\ts.attachPrefillSnapshots()",
            "\t\t}",
            "\t}"]
    if reset.get("budget", 1 << 40) < 1 << 40:
        body.append(f"\t// the program ran with a budget of {reset['budget']} bytes (maxPagedOutBytes), snapshot sizes"
                    " 16 B per KV/window row, 12 B per recurrent state")
    for op in ops[1:]:
        name_ = op["op"]
        if name_ == "begin":
            ks = [k for k in op["keys"]]
            body.append(f"\tkeys = []int32{go_ints(ks)}")
            its = ", ".join(f"{{pos: {p}, length: {e - p}, fold: uint32(keys[{p}])}}" for p, e in op["spans"])
            body.append(f"\titems = []mediaItem{{{its}}}")
            body.append("\ts = pc.begin(keys, items)\n\tseeded = false")
            body.append(f"\ts.schedulePrefillSnapshots([]int{go_ints(schedule(len(ks), reset['interval'], reset['near_end']))})")
        elif name_ == "prefill":
            body.append(f"\tprefill({op['max_chunks'] or 0})")
        elif name_ == "step":
            k = op["key"] if op["key"] < 1 << 31 else op["key"] - (1 << 32)
            body.append(f"\tfeedAll(pc.caches, []int32{{{k}}})")
            body.append(f"\tif seeded {{ s.outputs = append(s.outputs, {k}) }}\n\tseeded = true")
        elif name_ == "close":
            body.append("\ts.close()")
        elif name_ == "set_budget":
            body.append(f"\t// set_budget({op['budget']}): maxPagedOutBytes = {op['budget']}; pc.enforceEvictionPolicy()")
    body.append(CHECKS.get(rule, COVERAGE))
    body.append("\tcheckTrieInvariants(t, pc.root)\n\t_, _, _, _ = s, items, prefill, seeded")
    fn = name or f"TestPrefixTrie{rule}Found"
    return f"func {fn}(t *testing.T) {{\n" + "\n".join(body) + "\n}\n"
