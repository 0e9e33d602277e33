// Harness draft look-ahead (written for this project, copied next to driver_test.go): the "-draft"
// layouts, Ollama's layer caches plus one draft KV cache, last, with prefixCache.draftLookahead = 1,
// as runner.go and mtp.go set them up for a model with an MTP draft head.
//
// What Ollama's runner does, and what the harness does in its place (the runner's MLX-bound code,
// mtp.go and pipeline.go, cannot be built here; speculate.go's scheduleSpeculation and
// commitSpeculation are Ollama's own, copied from the checkout by build.py):
//   - the draft cache's slot S pairs the target's hidden state at S with the token at S+1, so a
//     state at offset k depends on k+1 tokens; the trie's keys pack (token i, token i+1). Here the
//     draft fake holds, per slot, the id of the pair (token S, token S+1) it was written from;
//   - prefill: the model's caches take each chunk; the drafter's pairs lag one slot and are written
//     when it settles: at the end of the prompt with the seed (Runner.prefill: settle, then
//     attachPrefillSnapshots) and on a cancel with the next prompt token. The harness settles at the
//     end of every prefill operation (the prefix cache is not called between chunks, so an earlier
//     write is the same write: same rows, same captures);
//   - decode (speculativeDecoder with the MTP drafter): each round the draft head writes its own
//     slots past the committed range (pairs (specMark, draft)), the model forwards the current token
//     and the drafts, commitSpeculation rolls the model's caches back to the kept prefix, and the
//     next round's settle rewinds the draft cache to its committed offset and writes the pairs of the
//     validated tokens (mtpDraftSession.flush). The harness runs that settle at the end of the round
//     (nothing touches the prefix cache in between), so every view shows the drafter level;
//   - a step operation is a sampled token. The first is the seed (the prompt's last token, not yet
//     forwarded: the first round forwards it). Later ones cycle through three kinds of round so the
//     program decides the tokens and the harness the acceptance: a round rejecting both drafts (the
//     token is its residual), then a token held back, then a round accepting the held token as its
//     first draft and rejecting the second (the token is its residual). A close with a token held runs
//     the rejecting round for it first. Rejected drafts are tokens no stream holds (rejectedBase+).
//
// The view's key alphabet on these layouts is the pair a trie key packs (shown whole, as a uint64):
// node keys are Ollama's own keys; the request's keys are the prompt's pairs plus, for its last slot,
// the pair with pairNone (its look-ahead is the first generated token, unknown at begin); the live
// keys pair the forwarded tokens with the next one. The draft fake's slots decode to their pairs; a
// model cache's slot holds a token and depends on no look-ahead, so it shows as the pair of its token
// with the look-ahead of the key it is compared under (its token is judged, its look-ahead is not).
package mlxrunner

import (
	"fmt"
	"slices"
)

const (
	pairNone     uint32 = 0xFFFFFFFF // the look-ahead of a slot whose next token is not known yet
	specMark     uint32 = 0x7FFFFFFE // a draft-cache slot the draft head wrote from its own state
	rejectedBase        = 1_000_000  // rejected draft tokens: no stream the machine makes holds them
)

type draftState struct {
	h         *harness
	idx       int              // the draft cache's index in pc.caches (the last)
	pairOf    []uint64         // pair id -> the pair (token S, token S+1), packed as trie keys pack it
	pairID    map[uint64]int32 // and back
	la        uint32           // the token after the live offset: the current (sampled, not forwarded) one
	committed int              // the draft cache's committed offset (mtpDraftSession.committedDraftOffset)
	held      []uint32         // a sampled token the next accepting round takes as its first draft
	steps     int              // steps after the seed, this request
	rounds    int              // rounds run since reset (numbers the rejected drafts)
}

func newDraftState(h *harness, idx int) *draftState {
	if !harnessSetLookahead(h.pc, 1) {
		panic("this checkout's prefixCache has no draftLookahead: the -draft layouts need a newer x/mlxrunner")
	}
	return &draftState{h: h, idx: idx, pairOf: []uint64{0}, pairID: map[uint64]int32{}}
}

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

func (d *draftState) id(a, b uint32) int32 {
	k := pairKey(a, b)
	if v, ok := d.pairID[k]; ok {
		return v
	}
	d.pairOf = append(d.pairOf, k)
	d.pairID[k] = int32(len(d.pairOf) - 1)
	return d.pairID[k]
}

// forwarded is the offset the next forward writes at: the model's caches' (a draft cache lags).
func (h *harness) forwarded() int {
	if h.d == nil {
		return h.pc.minCacheOffset()
	}
	return len(h.seq)
}

// begin: mtpDrafter.open syncs the committed offset to the draft cache's restored one.
func (d *draftState) begin(keys []uint32, resume int) {
	d.committed = d.h.pc.caches[d.idx].Offset()
	d.la = pairNone
	if resume < len(keys) {
		d.la = keys[resume]
	}
	d.held, d.steps = nil, 0
}

// settle writes the pairs of the slots from the committed offset to the model's offset, the last
// paired with next (mtpDraftSession.settle + flush): a flush with anything to write first rewinds
// the draft cache to its committed offset, dropping the draft head's own slots.
func (d *draftState) settle(next uint32) {
	h := d.h
	end := len(h.seq)
	if end <= d.committed {
		return // nothing pending: flush writes (and rewinds) nothing
	}
	dc := h.pc.caches[d.idx]
	if dc.Offset() > d.committed && !dc.Restore(nil, d.committed) {
		panic(fmt.Sprintf("mtp: draft cache rewind to %d failed", d.committed))
	}
	stream := append(slices.Clone(h.seq), next)
	ids := make([]int32, 0, end-d.committed)
	for s := d.committed; s < end; s++ {
		ids = append(ids, d.id(stream[s], stream[s+1]))
	}
	h.feedOne(d.idx, ids)
	d.committed = end
	d.la = next
}

// round is one speculative round from the current token: two drafts, the first len(accepted) of
// them accepted (they are `accepted`), the rest rejected; next is the token sampled after them.
func (d *draftState) round(accepted []uint32, next uint32) {
	h := d.h
	const n = 2
	drafts := slices.Clone(accepted)
	for len(drafts) < n {
		drafts = append(drafts, uint32(rejectedBase+n*d.rounds+len(drafts)))
	}
	d.rounds++
	before, cur := len(h.seq), d.la
	// propose: the head's steps after the first write its own slots, one per draft but the last
	own := make([]int32, 0, n-1)
	for _, t := range drafts[:n-1] {
		own = append(own, d.id(specMark, t))
	}
	h.feedOne(d.idx, own)
	// accept: one forward of the current token and the drafts, then Ollama's rollback
	targets := h.pc.caches[:d.idx]
	scheduleSpeculation(targets, before+1, n)
	h.write(append([]uint32{cur}, drafts...))
	commitSpeculation(targets, len(accepted), n, before+1)
	h.seq = append(append(h.seq, cur), accepted...)
	for _, t := range accepted {
		h.session.outputs = append(h.session.outputs, int32(t))
	}
	h.session.outputs = append(h.session.outputs, int32(next))
	d.settle(next)
}

// step is one sampled token (the first: the seed, already current).
func (d *draftState) step(k uint32) {
	if !d.h.seeded {
		d.h.seeded = true
		return
	}
	switch d.steps % 3 {
	case 0:
		d.round(nil, k)
	case 1:
		d.held = []uint32{k}
	case 2:
		d.round(d.held, k)
		d.held = nil
	}
	d.steps++
}

// close: the decoder's close settles the drafter (done by each round); a held token is the
// residual of a last, rejecting round.
func (d *draftState) close() {
	if len(d.held) > 0 {
		held := d.held[0]
		d.held = nil
		d.round(nil, held)
	}
}

// enc is the view key of slot `pos` of layer i holding t: the draft cache's pair, or a model
// cache's token paired with the look-ahead of ref's key at pos (pairNone past ref).
func (d *draftState) enc(i int, t int32, pos int, ref []uint64) uint64 {
	if i == d.idx {
		if t > 0 && int(t) < len(d.pairOf) {
			return d.pairOf[t]
		}
		return pairKey(specMark, pairNone)
	}
	la := pairNone
	if pos >= 0 && pos < len(ref) {
		la = uint32(ref[pos])
	}
	return pairKey(uint32(t), la)
}

// liveKeys are the view's keys of the live positions.
func (h *harness) liveKeys() []uint64 {
	out := make([]uint64, len(h.seq))
	for i, k := range h.seq {
		if h.d == nil {
			out[i] = uint64(k)
			continue
		}
		next := h.d.la
		if i+1 < len(h.seq) {
			next = h.seq[i+1]
		}
		out[i] = pairKey(k, next)
	}
	return out
}

// requestKeys are the view's keys of the open request's prompt.
func (h *harness) requestKeys() []uint64 {
	out := make([]uint64, len(h.keys))
	for i, k := range h.keys {
		if h.d == nil {
			out[i] = uint64(k)
			continue
		}
		next := pairNone
		if i+1 < len(h.keys) {
			next = h.keys[i+1]
		}
		out[i] = pairKey(k, next)
	}
	return out
}
