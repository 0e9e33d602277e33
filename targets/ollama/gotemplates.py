"""The Go text of an exported test (targets/ollama/gotest.py fills it in): the
wrapper that sizes Ollama's fake snapshots and the replay's setup (the rules'
checks are in gochecks.py). Placeholders: {N} the test's name prefix, {B} the program's
budget, {CHUNK} the prefill chunk, {FAKES}/{KINDS}/{COSTS} the layout, {RULE}.

Invariants: written for this project (no Ollama code); every check reports
through `fail`, once per test; every name defined at package level starts
with {N}.
"""
from __future__ import annotations

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
