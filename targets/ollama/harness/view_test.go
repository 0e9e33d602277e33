// Harness view (written for this project, copied next to driver_test.go): the
// state of the prefix cache and its fakes as the JSON of spec/view.py.
package mlxrunner

import (
	"sort"

	"github.com/ollama/ollama/x/mlxrunner/cache"
)

type hSnap struct {
	Layer   int      `json:"layer"`
	Kind    string   `json:"kind"`
	Start   int      `json:"start"`
	End     int      `json:"end"`
	Bytes   int      `json:"bytes"`
	Lazy    bool     `json:"lazy"`
	Content []uint32 `json:"content"`
	Ident   int      `json:"ident"`
}

func content(toks []int32, l hLayer) []uint32 {
	if *l.Kind == "windowed" && len(toks) > l.Window {
		toks = toks[len(toks)-l.Window:]
	}
	out := make([]uint32, len(toks))
	for i, t := range toks {
		out[i] = uint32(t)
	}
	return out
}

func (h *harness) view() map[string]any {
	ident := map[*fakeSnapshot]int{}
	created, released := []int{}, []int{}
	for i, s := range h.tracker.all {
		ident[s] = i
		created = append(created, i)
		for j := 0; j < s.closeCount; j++ {
			released = append(released, i)
		}
	}
	lastUsed := func(n *trieNode) int64 { return n.lastUsed.Sub(h.start).Nanoseconds() }
	pathKeys := func(n *trieNode) []uint32 {
		var parts [][]trieKey
		for m := n; m != nil; m = m.parent {
			parts = append(parts, m.tokens)
		}
		out := []uint32{}
		for i := len(parts) - 1; i >= 0; i-- {
			for _, k := range parts[i] {
				out = append(out, uint32(k))
			}
		}
		return out
	}
	nodes := []map[string]any{}
	var clock int64
	walkNodes(h.pc.root, func(n *trieNode) bool {
		snaps := []hSnap{}
		for i, s := range n.snapshots {
			fs, ok := s.(*fakeSnapshot)
			if !ok || fs == nil || i >= len(h.layers) || h.layers[i].Kind == nil {
				continue
			}
			l := h.layers[i]
			sv := hSnap{Layer: i, Kind: *l.Kind, Start: fs.from, End: fs.to, Bytes: fs.Size(),
				Content: content(fs.tokens, l), Ident: ident[fs], Lazy: h.wrapped[i].isView(fs)}
			if *l.Kind != "kv" {
				sv.Start = fs.to
			}
			snaps = append(snaps, sv)
		}
		sort.Slice(snaps, func(a, b int) bool { return snaps[a].Layer < snaps[b].Layer })
		lu := lastUsed(n)
		clock = max(clock, lu)
		nodes = append(nodes, map[string]any{"keys": pathKeys(n), "start": n.startOffset(), "user": n.user,
			"last_used": lu, "snaps": snaps})
		return true
	})
	path := [][]uint32{}
	for _, n := range h.pc.activePath {
		path = append(path, pathKeys(n))
	}
	live, offs := []any{}, []int{}
	for i, f := range h.fakes {
		if f == nil {
			live = append(live, nil)
			continue
		}
		var toks []int32
		switch c := f.(type) {
		case *fakeRewindableCache:
			toks = c.tokens
		case *fakeSlidingWindowCache:
			toks = c.tokens
		case *fakeRecurrentCache:
			toks = c.tokens
		}
		live = append(live, content(toks, h.layers[i]))
		offs = append(offs, f.Offset())
	}
	layers := []map[string]any{}
	for _, l := range h.layers {
		layers = append(layers, map[string]any{"kind": l.Kind, "cost": l.Cost, "window": l.Window})
	}
	var req any
	if h.session != nil {
		sched := h.schedule
		if sched == nil {
			sched = [][2]any{}
		}
		spans, chunks := h.spans, h.chunks
		if spans == nil {
			spans = [][2]int{}
		}
		if chunks == nil {
			chunks = [][2]int{}
		}
		pending := []int{}
		for _, f := range h.fakes {
			var caps []cache.Snapshot
			switch c := f.(type) {
			case *fakeRewindableCache:
				caps = c.pending.captured
			case *fakeSlidingWindowCache:
				caps = c.pending.captured
			case *fakeRecurrentCache:
				caps = c.pending.captured
			}
			for _, s := range caps {
				if fs, ok := s.(*fakeSnapshot); ok && fs != nil {
					pending = append(pending, ident[fs])
				}
			}
		}
		req = map[string]any{"keys": h.keys, "spans": spans, "matched": h.matched, "resume": h.resume,
			"schedule": sched, "chunks": chunks, "prefilled": h.prefilled, "pending": pending}
	}
	seq := h.seq
	if seq == nil {
		seq = []uint32{}
	}
	return map[string]any{"layers": layers, "nodes": nodes, "path": path, "offset": h.pc.minCacheOffset(),
		"seq": seq, "live": live, "counter": h.pc.pagedOutBytes, "budget": maxPagedOutBytes, "clock": clock,
		"request": req, "released": released, "created": created, "live_offsets": offs}
}

