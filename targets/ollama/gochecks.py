"""Each rule's check as Go code, for an exported test (targets/ollama/gotest.py
puts the one its rule needs into the test; gotemplates.py holds the setup the
checks read: pc, fakes, kinds, keys, items, unit, merges, fail). Each mirrors
the spec's predicate of the same rule (spec/rules*.py) and is judged where the
machine judges it.

Invariants: written for this project (no Ollama code); every check reports
through `fail`; placeholders as in gotemplates.py ({RULE}).
"""
from __future__ import annotations

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
