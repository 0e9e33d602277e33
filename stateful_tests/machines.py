"""Conformance state machines: impl's PrefixCache, driven on tracer caches,
against spec's PrefixCache, one operation at a time.

Every rule performs the same operations on both sides, each through
`ConformanceMachine.operation`, the one place where the views before and
after an operation are taken and the operation rules judge them:

    spec                                  impl (on stateful_tests.tracer caches)
    begin(tokens, media, boundaries)      begin(keys_of(tokens, media), noncausal_spans(media), boundaries)
    prefill(max_chunks=1)                 next_chunk(chunk) -> forward -> evaluated(keys) [-> prefilled()]
    step(key)  (= evaluated((key,)))      forward [key] -> evaluated([key])
    close(), set_budget(b)                close() (mid-prefill: a cancellation), set_budget(b)

After every rule the one invariant, `checks`, runs the checks of CHECKS in
that order (the order is ours, not Hypothesis's): C1 on both sides, impl's
own checked rules, spec.rules on the abstraction of impl and on the spec,
conformance field by field, then what impl reports to people
(stateful_tests.checks), so a broken rule is reported as such first.
E2 and S1 are also judged where impl decides them (checks.DecisionJudges).
A failure prints a runnable program (plain lists, ints, `Media(...)`).
One machine class per layer mix (`MACHINES`); docs/stateful_tests.md.
"""
from __future__ import annotations

import contextlib
import time

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

import impl.media
import spec.rules
from impl.prefix_cache import PrefixCache as ImplCache
from impl.trie import walk as impl_walk
from spec.cache import PrefixCache as SpecCache
from spec.media import TOKEN_LIMIT, keys_of
from spec.trie import match
from spec.view import Op
from stateful_tests.abstraction import abstract
from stateful_tests.requests import (BUDGETS, CHUNKS, CLOCKS, INTERVALS, MIXES, NEAR_ENDS, PLACEHOLDER, VOCAB,
                                     BytesOnlyItem, Conv, Media, Open, compose, impl_item, kv, media_st,
                                     nonempty_text_st, recurrent, text_st, windowed)
from stateful_tests.checks import DecisionJudges, RuleChecks, ToolingChecks
from stateful_tests.tracer import Tracer

__all__ = ["ConformanceMachine", "INVARIANTS", "MACHINES", "MIXES", "Media", "kv", "machine_for", "recurrent",
           "windowed"]

class ConformanceMachine(DecisionJudges, RuleChecks, ToolingChecks, RuleBasedStateMachine):
    """impl and spec, side by side. Subclasses fix LAYERS (one per mix)."""

    LAYERS: tuple = MIXES["kv"]
    IMPL_CHECK = True          # impl's own checked assertions inside operations (RuleViolation)
    # The checks the one invariant runs, in this order.
    CHECKS = ("c1_live_equals_cold_prefill", "impl_own_invariants", "rules_hold_on_impl", "rules_hold_on_spec",
              "spec_equals_impl", "tooling_bookkeeping_time_is_measured", "tooling_close_reports_the_spec_figures",
              "tooling_dumps_describe_the_spec_trie")
    conversations = Bundle("conversations")

    def __init__(self):
        super().__init__()
        self.sp = self.ip = self.tracer = None
        self.req: Open | None = None
        self._abs = None
        self._views = None            # (spec view, impl view) after the last operation
        self._impl_victims = []       # key paths of the nodes impl's eviction chose, in order
        self._closed_stats = None     # (impl's, spec's) figures of the request closed last
        self.steps = 0

    # ------------------------------------------------------------ set-up
    @initialize(chunk=st.sampled_from(CHUNKS), interval=st.sampled_from(INTERVALS),
                near_end=st.sampled_from(NEAR_ENDS), budget=st.sampled_from(BUDGETS), clock=st.sampled_from(CLOCKS))
    def configure(self, chunk, interval, near_end, budget, clock="touch"):
        """One model (this class's layer mix) with its live caches, both sides
        empty; captures every `interval` keys and `near_end` before a prompt's
        end (section 2, step 2); prefill chunks of `chunk` keys. `clock`
        "operation": the clock ticks once per operation (a coarse wall clock,
        as last-used times are in a real server), so the nodes one operation
        touches tie and eviction breaks the ties (E3: deeper, then larger)."""
        self.chunk, self.clock_mode = chunk, clock
        self._bookkeeping = (0.0, time.perf_counter())
        self._born = time.monotonic()                # node ages in the dumps are at most this old
        self.sp = SpecCache(self.LAYERS, budget=budget, interval=interval, near_end=near_end, chunk=chunk)
        self.tracer = Tracer(self.LAYERS)
        self.ip = ImplCache(self.tracer.caches, budget=budget, interval=interval, near_end=near_end,
                            check=self.IMPL_CHECK)
        choose, compact = self.ip._victim, self.ip._compact    # judged where impl decides (see below)
        self.ip._victim = lambda: self._victim_chosen(choose())
        self.ip._compact = lambda: (self._before_compaction(), compact())

    def teardown(self):
        type(self).last_run_steps = self.steps

    # ----------------------------------------------------- preconditions
    def idle(self):
        return self.req is None

    def prefilling(self):
        return self.req is not None and not self.req.prefilled

    def decoding(self):
        return self.req is not None and self.req.prefilled

    # ------------------------------------------- one operation, both sides
    @contextlib.contextmanager
    def operation(self, name: str, *args):
        """One operation of the alphabet (spec.view.Op) on both sides, run by
        the body. The one place where the views before it are taken, and
        after it the operation rules (spec.rules.check_step) judge spec and
        the abstraction of impl with the victims each side evicted. Yields a
        dict the body sets each side's outcome in (begin's (matched, resume)):
        "spec" and "impl"."""
        before = self.views()
        sv, iv = len(self.sp.victims), len(self._impl_victims)
        ticks = (self.sp.clock, self.ip.clock)
        result = {"spec": None, "impl": None}
        yield result
        self._abs = None
        self.steps += 1
        if self.clock_mode == "operation":
            self._one_tick(ticks)
        gone = (self.sp.victims[sv:], self._impl_victims[iv:])
        assert gone[0] == gone[1], f"conformance mismatch in 'victims' of {name} (the nodes evicted, in " \
            f"order, as key paths: E2 protection, E3 order): spec {gone[0]}, impl {gone[1]}"
        after = (self.sp.view(), self.abstraction().view())
        if hasattr(spec.rules, "check_step"):
            for side, before, now, evicted, outcome in (
                    ("the spec", before[0], after[0], gone[0], result["spec"]),
                    ("impl (abstracted)", before[1], after[1], gone[1], result["impl"])):
                op = Op(name, tuple(args), outcome, tuple(evicted))
                v = spec.rules.check_step(before, op, now)
                assert not v, f"operation rules violated by {side} in {name}{tuple(args)!r}: " + \
                    "; ".join(map(str, v))
        self._views = after

    def views(self) -> tuple:
        """(spec's view, the view of the abstraction of impl) of the current
        state: taken after each operation, read by the next one and by the
        checks (nothing changes the state between them)."""
        if self._views is None:
            self._views = (self.sp.view(), self.abstraction().view())
        return self._views

    def _one_tick(self, ticks: tuple) -> None:
        """A clock that ticked once during the operation: every node touched
        in it (last used after the clock before it) gets the same time; each
        side from its own clock (a side that touched nothing keeps its clock)."""
        for nodes, cache, t in ((self.sp.trie.nodes(), self.sp, ticks[0]),
                                (impl_walk(self.ip.root), self.ip, ticks[1])):
            for n in nodes:
                if n.last_used > t:
                    n.last_used = t + 1
            cache.clock = min(cache.clock, t + 1)

    # ------------------------------------------------- begin: the prompts
    def _begin(self, base: tuple, base_media: tuple, text, media, turns) -> None:
        """Section 2, step 1 (T3, M3, P1, E5): both sides begin the same prompt,
        impl with the keys and spans impl's own media code makes (section 1:
        folds); they must agree on the keys, on (matched, resume) and on the
        capture schedule (M2)."""
        tokens, items = compose(base, base_media, text, media)
        mine = impl.media.validate_media([impl_item(it) for it in items], len(tokens))
        keys, spans = impl.media.keys_of(tokens, mine), impl.media.noncausal_spans(mine)
        want = keys_of(tokens, items)
        assert keys == want, "conformance mismatch in 'keys' (section 1, media folds): spec " \
            f"{[k for k, j in zip(want, keys) if k != j][:3]}, impl {[j for k, j in zip(want, keys) if k != j][:3]}"
        evictions = self.sp.evictions
        self.ip.check = self.IMPL_CHECK and not any(isinstance(it, BytesOnlyItem) for it in items)
        marks = tuple(t for t in turns if 0 < t <= len(base))     # earlier turns' ends: message boundaries (§2.2)
        with self.operation("begin", keys, tuple(spans), marks) as op:
            a = op["spec"] = self.sp.begin(list(tokens), list(items), boundaries=marks)
            b = op["impl"] = self.ip.begin(keys, spans, marks)
        inside = lambda x: any(p < x < e for p, e in spans)
        assert a == b, f"conformance mismatch in begin (matched, resume): spec {a}, impl {b}" + (
            " (M3: impl's match or resume is strictly inside a non-causal item)" if any(map(inside, b)) else "")
        sa, sb = list(self.sp.request.schedule), list(self.ip.request.schedule)
        assert sa == sb, f"conformance mismatch in request.schedule: spec {sa}, impl {sb}" + (
            " (M2: impl schedules a capture strictly inside a non-causal item)"
            if any(inside(c) for c, _ in sb) else "")
        self.req = Open(tokens, items, keys, spans, tuple(t for t in turns if t <= len(base)),
                        evictions=evictions)

    @precondition(idle)
    @rule(text=nonempty_text_st, media=media_st)
    def new_conversation(self, text, media):
        """A fresh prompt, maybe sharing a prefix with stored ones by chance."""
        self._begin((), (), text, media, ())

    @precondition(idle)
    @rule(conv=conversations, keep=st.integers(0, 6), text=text_st, media=media_st)
    def extend(self, conv, keep, text, media):
        """The next turn of `conv` (or of another conversation: switching is
        picking another one): its prompt, `keep` tokens of its response (all,
        part or none; the rest was not kept by the client), then new text."""
        base, base_media = conv.prefix(conv.prompt_len + keep)
        self._begin(base, base_media, text, media, conv.turns)

    @precondition(idle)
    @rule(conv=conversations)
    def regenerate(self, conv):
        """The same prompt again (a full match backs off by one, section 2.1)."""
        base, base_media = conv.prefix(conv.prompt_len)
        self._begin(base, base_media, [], [], conv.turns)

    @precondition(idle)
    @rule(conv=conversations, at=st.integers(0, 40), text=nonempty_text_st, media=media_st)
    def edit(self, conv, at, text, media):
        """Edit an earlier turn: keep the first `at` keys of the transcript and
        diverge there, usually inside a stored edge (P1, S4)."""
        base, base_media = conv.prefix(min(at, len(conv.tokens)))
        self._begin(base, base_media, text, media, conv.turns)

    @precondition(idle)
    @rule(conv=conversations, turn=st.integers(0, 5), text=text_st, media=media_st)
    def rewind(self, conv, turn, text, media):
        """Go back to the end of an old turn of `conv` and continue from there
        (E5: a turn eviction folded away resumes at an older checkpoint)."""
        end = conv.turns[turn % len(conv.turns)] if conv.turns else 0
        base, base_media = conv.prefix(end)
        self._begin(base, base_media, text, media, conv.turns)

    @precondition(idle)
    @rule(conv=conversations, item=st.integers(0, 3), longer=st.integers(-2, 3), causal=st.booleans(),
          text=text_st)
    def resend_media(self, conv, item, longer, causal, text):
        """Re-send the prompt up to one of `conv`'s media items with that item's
        bytes again, `longer` keys longer (or shorter; at least 1) and causal or
        not: a match running up to (M3) or diverging at an item, captures
        falling inside it (M2). With
        a bytes-only fold the match runs into the new item and can end strictly
        inside it: M3 floors it to the item's start, and the capture at the
        item's end, starting there, is clipped to its node's edge (S1)."""
        if not conv.media:
            return self.new_conversation(text or [1], [])
        m = conv.media[item % len(conv.media)]
        length = max(1, m.length + longer)
        base, base_media = conv.prefix(m.pos)
        self._begin(base, base_media, [PLACEHOLDER] * length + list(text),
                    [Media(at=0, length=length, data=m.data, causal=causal,
                           bytes_only=isinstance(m, BytesOnlyItem))], conv.turns)

    # --------------------------------------------------------- prefill
    @precondition(prefilling)
    @rule()
    def prefill_chunk(self):
        """Section 2, step 3 (M1, captures, whole-state cuts): one chunk on both
        sides; on the last one, captures attach (step 4: advance, split, clip,
        compact, S1, S4, P2)."""
        with self.operation("prefill", 1):
            self._chunk()

    @precondition(prefilling)
    @rule()
    def prefill_rest(self):
        """Prefill chunk by chunk to the end of the prompt (the common case;
        prefill_chunk interleaves budget changes and cancels with chunks):
        one operation, prefill(max_chunks=None), compared chunk by chunk."""
        with self.operation("prefill", None):
            while self.req.prefilled is False:
                self._chunk()

    def _chunk(self) -> None:
        r = self.req
        before = len(self.sp.request.chunks)
        spec_done = self.sp.prefill(max_chunks=1)
        spec_chunk = self.sp.request.chunks[before] if len(self.sp.request.chunks) > before else None
        ch = self.ip.next_chunk(self.chunk)
        if ch is not None:
            p, q = ch
            self.tracer.forward(p, r.keys[p:q], r.spans)
            self.ip.evaluated(r.keys[p:q])
        impl_done = self.ip.next_chunk(self.chunk) is None
        assert spec_chunk == ch, f"conformance mismatch in the prefill chunk (M1): spec {spec_chunk}, impl {ch}"
        assert spec_done == impl_done, f"conformance mismatch in prefill completion: spec {spec_done}, impl {impl_done}"
        if impl_done:
            self.ip.prefilled()
            r.prefilled = True

    @precondition(prefilling)
    @rule(target=conversations)
    def cancel(self):
        """Cancel mid-prefill: close keeps the captures the forward crossed
        (section 2, step 6) and pages out the frontier (S3); nothing produced."""
        return self._close()

    # ---------------------------------------------------------- decode
    def _produce(self, token) -> None:
        r = self.req
        prev = r.produced[-1] if r.produced else r.keys[-1]
        with self.operation("step", prev):
            self.sp.step(prev)
            self.tracer.forward(self.ip.offset, [prev])
            self.ip.evaluated([prev])
        r.produced.append(token)

    @precondition(decoding)
    @rule(tokens=st.lists(st.integers(1, VOCAB), min_size=1, max_size=3))
    def produce(self, tokens):
        """Decode (section 2, step 5): each token is produced by one forward
        over the previous one (the prompt's last key first); the last produced
        token is never evaluated."""
        for t in tokens:
            self._produce(t)

    def stored_next(self):
        """The key the spec's trie holds right after everything this request
        has evaluated or produced so far (None if the stored path ends or
        diverges there)."""
        r = self.req
        if r is None or not r.prefilled:
            return None
        seq = tuple(r.keys) + tuple(r.produced)
        walked, k = match(self.sp.root, seq)
        if k < len(seq):
            return None
        last = walked[-1]
        if last.end > len(seq):
            nxt = last.edge[len(seq) - last.start]
        else:
            nxt = min((c.edge[0] for c in last.children), default=None, key=repr)
        return nxt if nxt is not None and nxt < TOKEN_LIMIT else None   # a media fold is not a token

    @precondition(lambda self: self.stored_next() is not None)
    @rule(count=st.integers(1, 3))
    def produce_as_before(self, count):
        """Decode up to `count` tokens the way a stored path continues, as greedy
        decoding of a regenerated prompt does: the response is a prefix of a
        stored one, so close lands inside an existing edge and splits it (S3, S4)."""
        for _ in range(count):
            t = self.stored_next()
            if t is None:
                break
            self._produce(t)

    @precondition(decoding)
    @rule(target=conversations)
    def close(self):
        """Close (section 2, step 6; S3, P2, E1-E4): advance over the produced
        tokens, page out the frontier, compact, enforce the budget."""
        return self._close()

    def _close(self) -> Conv:
        r, sr = self.req, self.sp.request
        with self.operation("close"):
            self.sp.close()
            stats = self.ip.close()
        self.req = None
        # The spec's figures for the request. A capture attaches once the forward has crossed it, and
        # the offset never moves back within a request: "crossed" is "at or below the offset at close".
        want = {"total": len(sr.keys), "matched": sr.matched, "resumed": sr.resume,
                "prefilled": sum(q - p for p, q in sr.chunks),
                "captures": sum(c <= self.sp.offset for c, _ in sr.schedule),
                "evictions": self.sp.evictions - r.evictions}
        self._closed_stats = ({k: getattr(stats, k) for k in want}, want)
        tokens = r.tokens + tuple(r.produced)
        return Conv(tokens, r.media, len(r.tokens), r.turns + (len(tokens),))

    # ---------------------------------------------------------- budget
    @rule(budget=st.runner().flatmap(lambda self: st.sampled_from([b for b in BUDGETS if b != self.sp.budget])))
    def set_budget(self, budget):
        """A budget change, at rest or mid-request, that may force eviction
        (E1 budget, E2 protection, E3 order, E4 leaf removal / merge, G2).
        Always a change: the current budget is not drawn, so a shrunk program
        has no no-op set_budget steps left for Hypothesis to remove."""
        with self.operation("set_budget", budget):
            self.sp.set_budget(budget)
            self.ip.set_budget(budget)

    # ------------------------------------------------------ the checks
    def abstraction(self):
        if self._abs is None:
            self._abs = abstract(self.ip, self.LAYERS, self.tracer, self.chunk)
        return self._abs

    @invariant()
    def checks(self):
        """Every check of CHECKS, in that order."""
        if self.ip is None:
            return
        for name in self.CHECKS:
            getattr(self, name)()


def machine_for(name: str, base=ConformanceMachine, **attrs) -> type:
    """A machine class for the layer mix `name`."""
    title = "".join(part.title() for part in name.split("_"))
    return type(f"{title}Machine", (base,), {"LAYERS": MIXES[name], "__module__": __name__, **attrs})


INVARIANTS = ConformanceMachine.CHECKS     # the checks, in the order the invariant runs them

MACHINES = {name: machine_for(name) for name in MIXES}
KvMachine = MACHINES["kv"]
KvKvMachine = MACHINES["kv_kv"]
KvRecurrentMachine = MACHINES["kv_recurrent"]
RecurrentMachine = MACHINES["recurrent"]
KvWindowedMachine = MACHINES["kv_windowed"]
WindowedMachine = MACHINES["windowed"]
HybridMachine = MACHINES["hybrid"]
