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

WRAPPER = """// {N}Layer wraps one of prefix_cache_test.go's fakes and sizes each snapshot it makes the way a real
// cache's arrays are sized, tracking shapes only (nothing is allocated): a KV or window row costs `cost`
// program bytes (a window holds at most 4 rows), a recurrent state `cost`; one program byte is *unit real
// bytes, so that the real maxPagedOutBytes stands for the program's budget. It also records every KV merge
// whose halves are not adjacent (rule G1).
type {N}Layer struct {
	cache.Cache
	kind   string
	cost   int64
	unit   *int64
	units  map[*fakeSnapshot]int64
	merges *[]string
}

func (c *{N}Layer) size(s cache.Snapshot) cache.Snapshot {
	if fs, ok := s.(*fakeSnapshot); ok && fs != nil {
		u := c.cost
		switch c.kind {
		case "kv":
			u = c.cost * int64(len(fs.tokens))
		case "windowed":
			u = c.cost * int64(min(len(fs.tokens), 4))
		}
		c.units[fs] = u
		fs.byteSize = int(u * *c.unit)
	}
	return s
}

func (c *{N}Layer) Snapshot(from int) cache.Snapshot {
	return c.size(c.Cache.Snapshot(from))
}

func (c *{N}Layer) TakeSnapshots() []cache.Snapshot {
	out := c.Cache.TakeSnapshots()
	for _, s := range out {
		c.size(s)
	}
	return out
}

func (c *{N}Layer) Split(s cache.Snapshot, at int) (cache.Snapshot, cache.Snapshot) {
	a, b := c.Cache.Split(s, at)
	return c.size(a), c.size(b)
}

func (c *{N}Layer) Merge(p, ch cache.Snapshot) cache.Snapshot {
	pf, ok1 := p.(*fakeSnapshot)
	cf, ok2 := ch.(*fakeSnapshot)
	if c.kind == "kv" && ok1 && ok2 && pf != nil && cf != nil && pf.to != cf.from {
		*c.merges = append(*c.merges, fmt.Sprintf("merged KV [%d,%d) with [%d,%d), not adjacent", pf.from, pf.to, cf.from, cf.to))
	}
	return c.size(c.Cache.Merge(p, ch))
}
"""

SETUP = """	tr := &snapshotTracker{}
	// The program's budget is {B} program bytes; the cache keeps its own maxPagedOutBytes, and the
	// snapshots are sized so that it stands for that budget.
	unitFor := func(budget int64) int64 {
		if budget == 0 {
			return maxPagedOutBytes + 1
		}
		return maxPagedOutBytes / budget
	}
	unit := unitFor({B})
	units := map[*fakeSnapshot]int64{}
	var merges []string
	fakes := []cache.Cache{{FAKES}}
	kinds := []string{{KINDS}}
	costs := []int64{{COSTS}}
	layers := make([]cache.Cache, len(fakes))
	for i, f := range fakes {
		if f != nil {
			layers[i] = &{N}Layer{Cache: f, kind: kinds[i], cost: costs[i], unit: &unit, units: units, merges: &merges}
		}
	}
	pc := &prefixCache{caches: layers}
	pc.ensureRoot()
	var s *cacheSession
	var items []mediaItem
	var keys []int32
	seeded, broken := false, false
	fail := func(format string, args ...any) {
		if !broken {
			broken = true
			t.Errorf(format, args...)
		}
	}
	// setBudget: the program changes its budget; the sizes change instead of the constant.
	setBudget := func(budget int64) {
		unit = unitFor(budget)
		for sn, u := range units {
			if sn.closeCount == 0 {
				sn.byteSize = int(u * unit)
			}
		}
		pc.pagedOutBytes = 0
		walkNodes(pc.root, func(n *trieNode) bool { pc.pagedOutBytes += n.snapshotBytes(); return true })
		pc.enforceEvictionPolicy()
	}
	prefill := func(maxChunks int) {
		target, done := len(keys)-1, 0
		for pc.minCacheOffset() < target && (maxChunks <= 0 || done < maxChunks) {
			p := pc.minCacheOffset()
			q := min(p+{CHUNK}, target)
			for _, it := range items {
				if it.pos < q && q < it.pos+it.length {
					if it.pos > p {
						q = it.pos
					} else {
						q = min(it.pos+it.length, target)
					}
				}
			}
			feedAll(fakes, keys[p:q])
			done++
		}
		if pc.minCacheOffset() >= target {
			s.attachPrefillSnapshots()
		}
	}
	step := func(k int32) {
		feedAll(fakes, []int32{k})
		if seeded {
			s.outputs = append(s.outputs, k)
		}
		seeded = true
	}
"""

# C2/E5: the deepest offset the trie can serve before a begin (spec/rules_eviction.deepest_restore).
DEEPEST = """	// deepest: the match m (after the decode-seed back-off and the media floor) and the deepest offset
	// r <= m every stateful layer can be brought to from the live caches or the matched path's snapshots.
	deepest := func() (int, int) {
		tk := pc.key(effectiveKeyTokens(keys, items))
		m, node := 0, pc.root
		var path []*trieNode
		for m < len(tk) {
			var next *trieNode
			for _, c := range node.children {
				if len(c.tokens) > 0 && c.tokens[0] == tk[m] {
					next = c
				}
			}
			if next == nil {
				break
			}
			k := 0
			for k < len(next.tokens) && m+k < len(tk) && next.tokens[k] == tk[m+k] {
				k++
			}
			path, m = append(path, next), m+k
			if k < len(next.tokens) {
				break
			}
			node = next
		}
		m = min(m, len(tk)-1)
		for _, it := range items {
			if it.pos < m && m < it.pos+it.length {
				m = it.pos
			}
		}
		off := pc.minCacheOffset()
		var live []int32
		for _, f := range fakes {
			switch c := f.(type) {
			case *fakeRewindableCache:
				live = c.tokens
			case *fakeRecurrentCache:
				live = c.tokens
			case *fakeSlidingWindowCache:
				live = c.tokens
			}
			if live != nil {
				break
			}
		}
		common := 0
		for common < len(live) && common < len(keys) && live[common] == keys[common] {
			common++
		}
		common = min(common, off)
		snap := func(n *trieNode, i int) *fakeSnapshot {
			if i < len(n.snapshots) && n.snapshots[i] != nil {
				return n.snapshots[i].(*fakeSnapshot)
			}
			return nil
		}
		reach := func(i, x int) bool {
			if x == 0 {
				return true
			}
			if kinds[i] == "kv" {
				for _, n := range path {
					if n.startOffset() < m && n.startOffset() < x && min(n.endOffset, x) > common && snap(n, i) == nil {
						return false
					}
				}
				return true
			}
			unwrapped := func(end int) bool { return kinds[i] == "windowed" && end <= 4 }
			if x <= common && off >= x && (off == x || unwrapped(off)) {
				return true
			}
			for _, n := range path {
				if sn := snap(n, i); n.startOffset() < m && sn != nil && (sn.to == x || (unwrapped(sn.to) && x <= sn.to)) {
					return true
				}
			}
			return false
		}
		for x := m; x > 0; x-- {
			ok := true
			for _, it := range items {
				if it.pos < x && x < it.pos+it.length {
					ok = false
				}
			}
			for i := range fakes {
				ok = ok && (kinds[i] == "" || reach(i, x))
			}
			if ok {
				return m, x
			}
		}
		return m, 0
	}
"""

E1 = """	// E1: at rest, paged-out bytes stay within the budget unless every node left is protected (the root,
	// the frontier, branch points).
	e1 := func(at string) {
		if pc.pagedOutBytes <= maxPagedOutBytes || len(pc.activePath) == 0 {
			return
		}
		frontier := pc.activePath[len(pc.activePath)-1]
		walkNodes(pc.root, func(n *trieNode) bool {
			if n != pc.root && n != frontier && len(n.children) < 2 {
				fail("E1 after %s: %d bytes paged out (%d program bytes) over maxPagedOutBytes %d, and node [%d,%d) is evictable",
					at, pc.pagedOutBytes, pc.pagedOutBytes/max(unit, 1), maxPagedOutBytes, n.startOffset(), n.endOffset)
				return false
			}
			return true
		})
	}
"""

KEYOF = """	// keyOf: a node's identity, the keys from the root to its end.
	keyOf := func(n *trieNode) string {
		var parts []string
		for m := n; m != nil; m = m.parent {
			edge := ""
			for _, k := range m.tokens {
				edge += fmt.Sprintf("%d,", k)
			}
			parts = append(parts, edge)
		}
		out := ""
		for i := len(parts) - 1; i >= 0; i-- {
			out += parts[i]
		}
		return out
	}
"""

E3 = """	// E3: eviction takes the least recently used node first (ties: deeper, then larger). Around each
	// operation: no node it evicted was ahead, in that order, of an evictable node that survived it.
	type e3node struct {
		used, bytes     int64
		start, end      int
		evictable, leaf bool
	}
	e3state := func() (map[string]e3node, string, int) {
		nodes := map[string]e3node{}
		if len(pc.activePath) == 0 {
			return nodes, "", 0
		}
		frontier := pc.activePath[len(pc.activePath)-1]
		walkNodes(pc.root, func(n *trieNode) bool {
			nodes[keyOf(n)] = e3node{n.lastUsed.UnixNano(), n.snapshotBytes(), n.startOffset(), n.endOffset,
				n != pc.root && n != frontier && len(n.children) < 2, n != pc.root && len(n.children) == 0}
			return true
		})
		return nodes, keyOf(frontier), frontier.endOffset
	}
	e3 := func(at string, growing bool, run func()) {
		before, f0, f0end := e3state()
		run()
		after, f1, _ := e3state()
		protected := map[string]bool{f0: true, f1: true}
		if growing {
			for _, n := range pc.activePath {
				if n.endOffset > f0end {
					protected[keyOf(n)] = true
				}
			}
		}
		less := func(a, b e3node) bool {
			if a.used != b.used {
				return a.used < b.used
			}
			if a.end != b.end {
				return a.end > b.end
			}
			return a.bytes > b.bytes
		}
		for gk, g := range before {
			if _, ok := after[gk]; ok || !g.leaf {
				continue
			}
			merged := false
			for ak := range after {
				merged = merged || (len(ak) > len(gk) && ak[:len(gk)] == gk)
			}
			if merged {
				continue
			}
			for ak, a := range after {
				b, ok := before[ak]
				if ok && !protected[ak] && a.evictable && b.evictable && b.start == a.start && less(a, g) {
					fail("E3 at %s: node [%d,%d) was evicted before node [%d,%d), which was used earlier (or tied and deeper/larger)",
						at, g.start, g.end, a.start, a.end)
				}
			}
		}
	}
"""

S4 = """	// S4: a node split out of an existing edge gets KV halves: around each operation, every node it
	// split (same keys, later start) holds the rest of each KV snapshot the edge had, and the head the
	// first part.
	type s4node struct {
		start, end int
		kv         map[int][]int32
	}
	s4state := func() map[string]s4node {
		out := map[string]s4node{}
		walkNodes(pc.root, func(n *trieNode) bool {
			kv := map[int][]int32{}
			for i, sn := range n.snapshots {
				if f, ok := sn.(*fakeSnapshot); ok && f != nil && kinds[i] == "kv" {
					kv[i] = append([]int32(nil), f.tokens...)
				}
			}
			out[keyOf(n)] = s4node{n.startOffset(), n.endOffset, kv}
			return true
		})
		return out
	}
	same := func(a []int32, b []int32, ok bool) bool {
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if a[i] != b[i] {
				return false
			}
		}
		return true
	}
	s4 := func(at string, _ bool, run func()) {
		before := s4state()
		run()
		after := s4state()
		for k, b := range before {
			tail, ok := after[k]
			if k == "" || !ok || tail.start <= b.start {
				continue
			}
			var head s4node
			found := false
			for hk, h := range after {
				if h.start == b.start && h.end == tail.start && len(hk) < len(k) && k[:len(hk)] == hk {
					head, found = h, true
				}
			}
			if !found {
				continue
			}
			for i, content := range b.kv {
				n := min(tail.start-b.start, len(content))
				got, ok := head.kv[i]
				if !same(got, content[:n], ok) {
					fail("S4 at %s: layer %d head [%d,%d) is not its half of the split KV snapshot", at, i, head.start, head.end)
				}
				got, ok = tail.kv[i]
				if !same(got, content[n:], ok) {
					fail("S4 at %s: layer %d tail [%d,%d) is not its half of the split KV snapshot", at, i, tail.start, tail.end)
				}
			}
		}
	}
"""

CHECKS = {
    "S3": """	if f := pc.activePath[len(pc.activePath)-1]; !hasAllSnapshots(f, pc.caches) {
		fail("S3: frontier [%d,%d) misses a layer after close", f.startOffset(), f.endOffset)
	}""",
    "P1": """	if f := pc.activePath[len(pc.activePath)-1]; f.endOffset != pc.minCacheOffset() {
		fail("P1: frontier ends at %d, live offset %d", f.endOffset, pc.minCacheOffset())
	}""",
    "M2": """	for _, p := range s.pendingSnapshots {
		for _, it := range items {
			if it.pos < p.offset && p.offset < it.pos+it.length {
				fail("M2: capture at %d inside media [%d,%d)", p.offset, it.pos, it.pos+it.length)
			}
		}
	}""",
    "M3": """	for _, it := range items {
		if o := pc.minCacheOffset(); it.pos < o && o < it.pos+it.length {
			fail("M3: resumed at %d inside media [%d,%d)", o, it.pos, it.pos+it.length)
		}
	}""",
    "G1": """	if len(merges) > 0 {
		fail("G1: %s", merges[0])
	}""",
    "E1": "",
    "E3": "",
    "S4": "",
    "C2": "",
    "E5": "",
}
CHECKS["T3"] = CHECKS["P1"].replace('"P1: ', '"T3: ')
COVERAGE = """	walkNodes(pc.root, func(n *trieNode) bool {
		for i, sn := range n.snapshots {
			if _, kv := fakes[i].(*fakeRewindableCache); kv && sn != nil {
				f := sn.(*fakeSnapshot)
				if f.from != n.startOffset() || f.to != n.endOffset || len(f.tokens) != f.to-f.from {
					fail("%s: node [%d,%d) layer %d holds [%d,%d) (%d tokens)", {RULE}, n.startOffset(), n.endOffset, i, f.from, f.to, len(f.tokens))
				}
			}
		}
		return true
	})"""


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
