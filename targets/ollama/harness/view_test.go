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
	Content []uint64 `json:"content"`
	Ident   int      `json:"ident"`
}

// content is layer i's tokens, which end at position `end`, in the view's key alphabet: the token
// itself, or on a "-draft" layout the pair a key packs (draft_test.go: enc).
func (h *harness) content(i int, toks []int32, end int, ref []uint64) []uint64 {
	l := h.layers[i]
	if *l.Kind == "windowed" && len(toks) > l.Window {
		toks = toks[len(toks)-l.Window:]
	}
	out := make([]uint64, len(toks))
	for j, t := range toks {
		if h.d != nil {
			out[j] = h.d.enc(i, t, end-len(toks)+j, ref)
		} else {
			out[j] = uint64(uint32(t))
		}
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
	pathKeys := func(n *trieNode) []uint64 { // a pair key (draft look-ahead) is shown whole, as a uint64
		var parts [][]trieKey
		for m := n; m != nil; m = m.parent {
			parts = append(parts, m.tokens)
		}
		out := []uint64{}
		for i := len(parts) - 1; i >= 0; i-- {
			for _, k := range parts[i] {
				out = append(out, uint64(k))
			}
		}
		return out
	}
	nodes := []map[string]any{}
	var clock int64
	walkNodes(h.pc.root, func(n *trieNode) bool {
		snaps := []hSnap{}
		keys := pathKeys(n)
		for i, s := range n.snapshots {
			fs, ok := s.(*fakeSnapshot)
			if !ok || fs == nil || i >= len(h.layers) || h.layers[i].Kind == nil {
				continue
			}
			l := h.layers[i]
			sv := hSnap{Layer: i, Kind: *l.Kind, Start: fs.from, End: fs.to, Bytes: fs.Size(),
				Content: h.content(i, fs.tokens, fs.to, keys), Ident: ident[fs], Lazy: h.wrapped[i].isView(fs)}
			if *l.Kind != "kv" {
				sv.Start = fs.to
			}
			snaps = append(snaps, sv)
		}
		sort.Slice(snaps, func(a, b int) bool { return snaps[a].Layer < snaps[b].Layer })
		lu := lastUsed(n)
		clock = max(clock, lu)
		nodes = append(nodes, map[string]any{"keys": keys, "start": n.startOffset(), "user": n.user,
			"last_used": lu, "snaps": snaps})
		return true
	})
	path := [][]uint64{}
	for _, n := range h.pc.activePath {
		path = append(path, pathKeys(n))
	}
	seq := h.liveKeys()
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
		live = append(live, h.content(i, toks, len(toks), seq))
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
		req = map[string]any{"keys": h.requestKeys(), "spans": spans, "matched": h.matched, "resume": h.resume,
			"schedule": sched, "chunks": chunks, "prefilled": h.prefilled, "pending": pending}
	}
	return map[string]any{"layers": layers, "nodes": nodes, "path": path, "offset": h.pc.minCacheOffset(),
		"seq": seq, "live": live, "counter": h.pc.pagedOutBytes, "budget": maxPagedOutBytes, "clock": clock,
		"request": req, "released": released, "created": created, "live_offsets": offs}
}
