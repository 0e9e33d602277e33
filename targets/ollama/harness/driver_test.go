// Harness driver (written for this project, copied into a temporary build of
// Ollama's x/mlxrunner package next to its own prefix_cache_test.go, whose fake
// caches it uses as layer caches).
//
// Protocol: one JSON operation per stdin line, one JSON answer per stdout line.
//   {"op":"reset","layout":L,"budget":B,"interval":I,"near_end":N,"chunk":C,"cost":{"kv":16,...}}
//   {"op":"begin","keys":[...],"spans":[[p,e],...]}   -> "outcome":[matched,resume]
//   {"op":"prefill","max_chunks":k}  (k<=0: all)     -> "outcome":[done]
//   {"op":"step","key":k}   {"op":"close"}   {"op":"set_budget","budget":B}
// Every answer: {"ok":true,"view":{...spec.view JSON...},"merges":[...]} or
// {"ok":false,"panic":"..."} (the cache panicked; send reset next).
//
// Invariants the driver keeps (so that what the view shows is Ollama's doing):
//   - it only calls the prefix cache the way Ollama's pipeline does: begin,
//     schedulePrefillSnapshots (periodic offsets and n-near_end), chunked feeds
//     of every cache, attachPrefillSnapshots, outputs, close;
//   - the fakes are fed effective keys (fold values across media), so snapshot
//     contents are comparable with the trie's key paths;
//   - snapshot sizes are set when a snapshot is made (before any node holds it):
//     KV cost*positions, windowed cost*min(W,positions), recurrent cost.
//   - in a "-lazy" layout (e.g. "hybrid-lazy"), a KV snapshot taken from the
//     live rows is a lazy view, as Ollama's KVCache makes them: it owns 0
//     bytes until a write overwrites its rows or the cache is freed, and then
//     materialises through its hook (the fake's materialize). Two adjacent
//     views merge, and a view splits, into views; any other KV merge copies
//     out its inputs first. A refused Restore copies nothing. A windowed
//     layer's captures inside a batched write (past its start) are views too,
//     as RotatingKVCache makes them; its next write, an owned restore or Free
//     copies them out, and its own view restored stays a view.
//   - in a "-draft" layout (e.g. "hybrid-draft"), a draft KV cache follows the
//     layout's caches and the prefix cache keys token pairs (draftLookahead 1);
//     draft_test.go drives the drafter and speculative rounds as Ollama's runner
//     does, and the view's keys are the pairs.
package mlxrunner

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/x/mlxrunner/cache"
)

type hLayer struct {
	Kind   *string `json:"kind"`
	Cost   int     `json:"cost"`
	Window int     `json:"window"`
}

type hMerge struct {
	Layer int    `json:"layer"`
	First [2]int `json:"first"`
	Then  [2]int `json:"then"`
}

// sized wraps one fake cache: it sizes the snapshots the fake returns and
// records KV merges whose halves are not adjacent (G1 evidence).
type sized struct {
	cache.Cache
	h     *harness
	layer int
	views map[*fakeSnapshot]bool // outstanding lazy views of the live rows ("-lazy" layouts, KV layers)
}

func (c *sized) lazyKV() bool { return c.h.lazy && *c.h.layers[c.layer].Kind == "kv" }

// lazyWindow: a windowed layer of a "-lazy" layout, whose captures inside a batched write are lazy
// views of the linearised buffer (RotatingKVCache.lazyRotatingSnapshot); every other snapshot it
// makes (the write's start boundary, a single-token write, Snapshot) is an owned clone.
func (c *sized) lazyWindow() bool { return c.h.lazy && *c.h.layers[c.layer].Kind == "windowed" }

// mark registers a snapshot as a lazy view: it owns nothing until copied out.
func (c *sized) mark(s cache.Snapshot) {
	if fs, ok := s.(*fakeSnapshot); ok && fs != nil {
		fs.byteSize = 0
		c.views[fs] = true
	}
}

// view makes a snapshot just taken from the live rows a lazy view: it owns nothing yet. (A KV
// layer's snapshots all are; a windowed layer's views are marked when its write makes them.)
func (c *sized) view(s cache.Snapshot) cache.Snapshot {
	if fs, ok := s.(*fakeSnapshot); ok && fs != nil && (c.lazyKV() || c.views[fs]) {
		c.mark(fs)
	}
	return s
}

// bytes is what a snapshot owns once copied out.
func (c *sized) bytes(fs *fakeSnapshot) int {
	l := c.h.layers[c.layer]
	switch *l.Kind {
	case "kv":
		return l.Cost * len(fs.tokens)
	case "windowed":
		return l.Cost * min(len(fs.tokens), l.Window)
	}
	return l.Cost
}

func (c *sized) isView(s cache.Snapshot) bool {
	fs, ok := s.(*fakeSnapshot)
	return ok && fs != nil && c.views[fs] && fs.closeCount == 0
}

// own copies a view out: it then owns its rows, and its hook reports them.
func (c *sized) own(fs *fakeSnapshot) {
	delete(c.views, fs)
	fs.materialize(c.bytes(fs))
}

// materialise copies out every view overlapping rows [p, q) before they are overwritten.
func (c *sized) materialise(p, q int) {
	for fs := range c.views {
		if fs.closeCount > 0 {
			delete(c.views, fs)
		} else if fs.from < q && fs.to > p {
			c.own(fs)
		}
	}
}

func (c *sized) fix(s cache.Snapshot) cache.Snapshot {
	if fs, ok := s.(*fakeSnapshot); ok && fs != nil {
		fs.byteSize = c.bytes(fs)
	}
	return s
}

func (c *sized) Snapshot(from int) cache.Snapshot { return c.view(c.fix(c.Cache.Snapshot(from))) }
func (c *sized) TakeSnapshots() []cache.Snapshot {
	out := c.Cache.TakeSnapshots()
	for _, s := range out {
		c.view(c.fix(s))
	}
	return out
}
func (c *sized) Split(s cache.Snapshot, at int) (cache.Snapshot, cache.Snapshot) {
	lazy := c.isView(s)
	a, b := c.Cache.Split(s, at)
	c.fix(a)
	c.fix(b)
	if lazy { // a view splits into views (arithmetic; a window is returned whole, still a view)
		delete(c.views, s.(*fakeSnapshot))
		c.mark(a)
		c.mark(b)
	}
	return a, b
}
func (c *sized) Merge(p, ch cache.Snapshot) cache.Snapshot {
	pf, ok1 := p.(*fakeSnapshot)
	cf, ok2 := ch.(*fakeSnapshot)
	if ok1 && ok2 && pf != nil && cf != nil && *c.h.layers[c.layer].Kind == "kv" && pf.to != cf.from {
		c.h.merges = append(c.h.merges, hMerge{c.layer, [2]int{pf.from, pf.to}, [2]int{cf.from, cf.to}})
	}
	// Two views of the live rows merge by arithmetic only when adjacent (KVCache.Merge checks
	// p.to == ch.from); any other pair, two non-adjacent views included, is copied out first.
	kv := *c.h.layers[c.layer].Kind == "kv"
	lazy := kv && c.isView(p) && c.isView(ch) && pf.to == cf.from
	if kv && !lazy { // an owned merge copies its inputs out first (Ollama's KVCache.Merge)
		for _, s := range []cache.Snapshot{p, ch} {
			if c.isView(s) {
				c.own(s.(*fakeSnapshot))
			}
		}
	}
	m := c.fix(c.Cache.Merge(p, ch))
	if lazy { // two views of the live rows merge into one view (arithmetic)
		delete(c.views, pf)
		delete(c.views, cf)
		c.mark(m)
	}
	if c.isView(m) { // a window's merge is its child, copied nothing: still a view
		c.mark(m)
	}
	return m
}
func (c *sized) Restore(s cache.Snapshot, target int) bool {
	if s != nil && !c.isView(s) && c.lazyKV() { // an owned snapshot's rows are written back, all of them
		fs, ok := s.(*fakeSnapshot) // (KVCache.Restore appends them, then clamps)
		// KVCache.Restore checks its preconditions before it copies anything: a refused restore
		// materialises nothing.
		if ok && fs != nil && target >= 0 && target <= fs.to && c.Offset() >= fs.from {
			c.materialise(fs.from, fs.to)
		}
	}
	if s != nil && c.lazyWindow() {
		// RotatingKVCache.Restore, past its checks: its own view is re-pointed and stays a view, every
		// other outstanding view is copied out (the buffer is replaced).
		fs, ok := s.(*fakeSnapshot)
		w := c.h.layers[c.layer].Window
		if ok && fs != nil && target >= 0 && target <= fs.to && !(target < fs.to && fs.to > w) {
			keep := c.isView(fs)
			for v := range c.views {
				if v.closeCount > 0 {
					delete(c.views, v)
				} else if v != fs || !keep {
					c.own(v)
				}
			}
		}
	}
	return c.Cache.Restore(s, target)
}
func (c *sized) Free() {
	if c.lazyKV() || c.lazyWindow() {
		c.materialise(0, 1<<62)
	}
	c.Cache.Free()
}

type harness struct {
	pc       *prefixCache
	tracker  *snapshotTracker
	fakes    []cache.Cache
	layers   []hLayer
	start    time.Time
	interval int
	nearEnd  int
	chunk    int
	merges   []hMerge
	lazy     bool        // a "-lazy" layout: KV snapshots of the live rows are lazy views
	wrapped  []*sized    // the fakes as the prefix cache sees them
	d        *draftState // a "-draft" layout: a draft KV cache with one token of look-ahead (draft_test.go)

	session   *cacheSession
	keys      []uint32
	spans     [][2]int
	seq       []uint32
	matched   int
	resume    int
	schedule  [][2]any
	chunks    [][2]int
	prefilled bool
	seeded    bool
}

type feeder interface{ feed([]int32) }

func kindPtr(s string) *string { return &s }

// layout builds the fakes the way Ollama's test constructors do.
func (h *harness) layout(name string, cost map[string]int) {
	tr := &snapshotTracker{}
	h.tracker = tr
	name, h.lazy = strings.CutSuffix(name, "-lazy")
	name, draft := strings.CutSuffix(name, "-draft")
	kv := func() cache.Cache { return &fakeRewindableCache{tracker: tr} }
	rec := func() cache.Cache { return &fakeRecurrentCache{tracker: tr} }
	var fakes []cache.Cache
	switch name {
	case "transformer": // newTransformerEnv
		fakes = []cache.Cache{kv()}
	case "sliding": // newSlidingWindowEnv
		fakes = []cache.Cache{kv(), &fakeSlidingWindowCache{maxSize: 4, tracker: tr}}
	case "recurrent": // newRecurrentEnv
		fakes = []cache.Cache{kv(), rec()}
	case "stateless": // newStatelessLayerEnv
		fakes = []cache.Cache{rec(), nil, kv(), nil}
	case "hybrid": // newHybridEnv's layers, without the draft look-ahead
		fakes = []cache.Cache{rec(), kv(), rec(), kv(), kv()}
	default:
		panic("unknown layout " + name)
	}
	if draft { // runner.go: newPrefixCache(slices.Concat(caches, draftCaches)), the draft KV last
		fakes = append(fakes, kv())
	}
	h.fakes = fakes
	h.layers = nil
	wrapped := make([]cache.Cache, len(fakes))
	h.wrapped = make([]*sized, len(fakes))
	for i, f := range fakes {
		switch f.(type) {
		case nil:
			h.layers = append(h.layers, hLayer{nil, 0, 0})
			continue
		case *fakeRewindableCache:
			h.layers = append(h.layers, hLayer{kindPtr("kv"), cost["kv"], 0})
		case *fakeSlidingWindowCache:
			h.layers = append(h.layers, hLayer{kindPtr("windowed"), cost["windowed"], 4})
		default:
			h.layers = append(h.layers, hLayer{kindPtr("recurrent"), cost["recurrent"], 0})
		}
		h.wrapped[i] = &sized{Cache: f, h: h, layer: i, views: map[*fakeSnapshot]bool{}}
		wrapped[i] = h.wrapped[i]
	}
	h.pc = &prefixCache{caches: wrapped}
	h.pc.ensureRoot()
	if draft {
		h.d = newDraftState(h, len(fakes)-1)
	}
}

// feed is a forward of the given keys: every cache the model writes takes them (a draft cache is
// written by its drafter, draft_test.go), and the live stream grows by them.
func (h *harness) feed(keys []uint32) {
	h.write(keys)
	h.seq = append(h.seq, keys...)
}

// write feeds the model's caches (not a draft cache) without recording the keys as live.
func (h *harness) write(keys []uint32) {
	toks := make([]int32, len(keys))
	for i, k := range keys {
		toks[i] = int32(k)
	}
	for i := range h.fakes {
		if h.d == nil || i != h.d.idx {
			h.feedOne(i, toks)
		}
	}
}

// feedOne writes tokens into fake i (lazy views over the rows it overwrites are copied out first).
func (h *harness) feedOne(i int, toks []int32) {
	f := h.fakes[i]
	if fd, ok := f.(feeder); ok {
		w := h.wrapped[i]
		if w.lazyKV() { // the write overwrites rows [offset, offset+n)
			w.materialise(w.Offset(), w.Offset()+len(toks))
		}
		sw, window := f.(*fakeSlidingWindowCache)
		var before []cache.Snapshot
		start := f.Offset()
		if window && w.lazyWindow() { // concat and update copy every outstanding view out first
			w.materialise(0, 1<<62)
			before = slices.Clone(sw.pending.captured)
		}
		fd.feed(toks)
		if window && w.lazyWindow() && len(toks) > 1 { // a batched write: captures past its start are views
			for j, s := range sw.pending.captured {
				if fs, ok := s.(*fakeSnapshot); ok && fs != nil && (j >= len(before) || before[j] == nil) && fs.to != start {
					w.mark(fs)
				}
			}
		}
	}
}

type hOp struct {
	Op        string         `json:"op"`
	Layout    string         `json:"layout"`
	Budget    int64          `json:"budget"`
	Interval  int            `json:"interval"`
	NearEnd   int            `json:"near_end"`
	Chunk     int            `json:"chunk"`
	Cost      map[string]int `json:"cost"`
	Keys      []uint32       `json:"keys"`
	Spans     [][2]int       `json:"spans"`
	MaxChunks int            `json:"max_chunks"`
	Key       uint32         `json:"key"`
}

func (h *harness) do(op hOp) any {
	switch op.Op {
	case "reset":
		*h = harness{start: time.Now(), interval: op.Interval, nearEnd: op.NearEnd, chunk: max(op.Chunk, 1)}
		h.layout(op.Layout, op.Cost)
		maxPagedOutBytes = op.Budget
	case "begin":
		inputs := make([]int32, len(op.Keys))
		for i, k := range op.Keys {
			inputs[i] = int32(k)
		}
		var items []mediaItem
		for _, s := range op.Spans {
			items = append(items, mediaItem{pos: s[0], length: s[1] - s[0], fold: op.Keys[s[0]]})
		}
		keys := h.pc.key(effectiveKeyTokens(inputs, items))
		_, m := findBestMatch(h.pc.root, keys)
		if m == len(inputs) && m > 0 {
			_, m = findBestMatch(h.pc.root, keys[:m-1])
		}
		h.session = h.pc.begin(inputs, items)
		h.keys, h.spans, h.matched = op.Keys, op.Spans, m
		h.resume = h.pc.minCacheOffset()
		h.seq = append([]uint32(nil), op.Keys[:h.resume]...)
		h.chunks, h.prefilled, h.seeded = nil, false, false
		if h.d != nil {
			h.d.begin(op.Keys, h.resume)
		}
		n := len(op.Keys)
		var offs []int
		for o := h.interval; h.interval > 0 && o < n; o += h.interval {
			offs = append(offs, o)
		}
		if e := n - h.nearEnd; e > 0 {
			offs = append(offs, e)
		}
		h.session.schedulePrefillSnapshots(offs)
		h.schedule = nil
		for _, p := range h.session.pendingSnapshots {
			h.schedule = append(h.schedule, [2]any{p.offset, p.user})
		}
		return []int{h.matched, h.resume}
	case "prefill":
		target := len(h.keys) - 1
		done := 0
		for h.forwarded() < target {
			if op.MaxChunks > 0 && done >= op.MaxChunks {
				if h.d != nil { // Runner.prefill on a cancel: settle the drafter with the next prompt token
					h.d.settle(h.keys[h.forwarded()])
				}
				return []int{0}
			}
			p := h.forwarded()
			q := min(p+h.chunk, target)
			for _, s := range h.spans { // the pipeline's extendChunk for atomic items
				if s[0] < q && q < s[1] {
					if s[0] > p {
						q = s[0]
					} else {
						q = min(s[1], target)
					}
				}
			}
			h.feed(h.keys[p:q])
			h.chunks = append(h.chunks, [2]int{p, q})
			done++
		}
		if h.d != nil { // Runner.prefill: settle with the seed before attaching
			h.d.settle(h.keys[target])
		}
		h.session.attachPrefillSnapshots()
		h.prefilled = true
		return []int{1}
	case "step":
		if h.d != nil {
			h.d.step(op.Key)
			break
		}
		h.feed([]uint32{op.Key})
		if h.seeded {
			h.session.outputs = append(h.session.outputs, int32(op.Key))
		}
		h.seeded = true
	case "close":
		if h.d != nil {
			h.d.close()
		}
		h.session.close()
		h.session = nil
	case "set_budget":
		maxPagedOutBytes = op.Budget
		h.pc.enforceEvictionPolicy()
	default:
		panic("unknown op " + op.Op)
	}
	return nil
}

func (h *harness) answer(line []byte) (out map[string]any) {
	defer func() {
		if r := recover(); r != nil {
			out = map[string]any{"ok": false, "panic": fmt.Sprint(r)}
		}
	}()
	var op hOp
	if err := json.Unmarshal(line, &op); err != nil {
		return map[string]any{"ok": false, "error": "bad operation: " + err.Error()}
	}
	h.merges = nil
	outcome := h.do(op)
	merges := h.merges
	if merges == nil {
		merges = []hMerge{}
	}
	return map[string]any{"ok": true, "outcome": outcome, "merges": merges, "view": h.view()}
}

// TestPrefixHarness serves the protocol when PREFIX_HARNESS=1; otherwise it skips.
func TestPrefixHarness(t *testing.T) {
	if os.Getenv("PREFIX_HARNESS") != "1" {
		t.Skip("harness driver: set PREFIX_HARNESS=1")
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	out := bufio.NewWriterSize(os.Stdout, 1<<20)
	enc := json.NewEncoder(out)
	h := &harness{}
	for {
		line, err := in.ReadBytes('\n')
		if len(line) > 1 {
			enc.Encode(h.answer(line))
			out.Flush()
		}
		if err != nil {
			return
		}
	}
}
