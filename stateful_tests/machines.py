"""Conformance state machines: impl's PrefixCache, driven on tracer caches,
against spec's PrefixCache, one operation at a time (issue 6).

Every rule performs the same operation on both sides:

    spec                                  impl (on stateful_tests.tracer caches)
    begin(tokens, media)                  begin(keys_of(tokens, media), noncausal_spans(media))
    prefill(max_chunks=1)                 next_chunk(chunk) -> forward -> evaluated(keys) [-> prefilled()]
    step(key)                             forward [key] -> evaluated([key])
    close()                               close()        (mid-prefill: a cancellation)
    set_budget(b)                         set_budget(b)

and after every step the invariants check, in this order (Hypothesis runs
invariants in name order, so the names carry the order):

    c1_live_equals_cold_prefill   C1: each layer's decoded live content is a cold
                                  prefill of the evaluated keys (impl and spec)
    impl_own_invariants           impl.invariants.violations(impl) is empty
    rules_hold_on_impl            spec.rules.check(abstract(impl)) is empty
    rules_hold_on_spec            spec.rules.check(spec) is empty
    spec_equals_impl              canon(abstract(impl)) == canon(spec), field by
                                  field (tree, live content, path, counter, clock,
                                  evictions…)

then the checks of what impl reports to people (after the rules, so that a
broken rule is reported as such):

    tooling_bookkeeping_time_is_measured    bookkeeping_s starts at 0, never
                                            decreases, grows by at most the wall
                                            time passed
    tooling_close_reports_the_spec_figures  the Stats of the request closed last
                                            (total, matched, resumed, prefilled,
                                            captures, evictions) are the spec's
    tooling_dumps_describe_the_spec_trie    dump() and dump_json() show the spec's
                                            trie node for node

A failure prints the steps as a runnable program (Hypothesis does this for
state machines); the arguments are plain lists, ints, and `Media(...)`
values, so the program pastes into a test as is (see test_conformance.py for
a kept example).

Layer mixes are one machine class each (`MACHINES`); the capture interval,
near-end distance, chunk size and budget are drawn in `configure`.
"""
from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from impl.invariants import violations as impl_violations
from impl.prefix_cache import PrefixCache as ImplCache
from spec.cache import PrefixCache as SpecCache
from spec.media import TOKEN_LIMIT, MediaItem, keys_of, noncausal_spans
from spec.rules import c1_cold_equivalence, check
from spec.trie import Layer, match
from stateful_tests.abstraction import abstract, canon, snap_bytes
from stateful_tests.tracer import Tracer

# Byte costs of the tracer's layers (stateful_tests/tracer.py): a KV or windowed row is
# [code, pos] float32 for K and for V = 16 bytes per position; a recurrent state is 3 x uint32.
ROW, STATE = 16, 12


def kv() -> Layer:
    return Layer("kv", ROW)


def windowed(w: int) -> Layer:
    return Layer("windowed", ROW, window=w)


def recurrent() -> Layer:
    return Layer("recurrent", STATE)


NONE = Layer(None)

# name -> layer stack. Stateless layers (Layer(None)) sit between stateful ones.
MIXES = {
    "kv": (kv(),),
    "kv_kv": (kv(), NONE, kv()),
    "kv_recurrent": (NONE, kv(), NONE, recurrent()),
    "recurrent": (recurrent(),),
    "kv_windowed": (kv(), windowed(5)),
    "windowed": (NONE, windowed(4)),
    "hybrid": (kv(), windowed(6), NONE, recurrent()),
}

VOCAB = 4              # token ids 1..VOCAB: a tiny vocabulary, so prefixes are shared everywhere
PLACEHOLDER = 0        # the token id under a media item's run (keys_of replaces it by the fold)
CHUNKS = (1, 2, 3, 5, 8)
INTERVALS = (0, 1, 2, 3, 4, 6, 10)
NEAR_ENDS = (0, 2, 4)
BUDGETS = (0, 60, 150, 400, 1 << 40)   # bytes; a 10-token KV edge is 160 B


@dataclass(frozen=True)
class Media:
    """A media item placed relative to the new text of a prompt: it starts
    `at` keys into the new text, runs `length` keys (clipped to the prompt;
    a non-causal item never covers the prompt's last key, the decode seed,
    which spec.media.validate_request forbids), and folds `data`."""
    at: int
    length: int
    data: bytes
    causal: bool


@dataclass(frozen=True)
class Conv:
    """A conversation so far: its transcript (the last prompt followed by the
    response), the media items of that prompt, where the prompt ends, and the
    ends of its turns (every turn's transcript is a prefix of this one)."""
    tokens: tuple
    media: tuple
    prompt_len: int
    turns: tuple

    def prefix(self, n: int) -> tuple:
        """The first n tokens and the media items that lie inside them."""
        return self.tokens[:n], tuple(m for m in self.media if m.end <= n)

    def __repr__(self) -> str:
        return f"Conv({len(self.tokens)} tokens, prompt {self.prompt_len}, turns {self.turns})"


@dataclass
class Open:
    """The open request: its prompt and what decoding has produced so far."""
    tokens: tuple
    media: tuple
    keys: tuple
    spans: list
    turns: tuple
    produced: list = field(default_factory=list)
    prefilled: bool = False
    evictions: int = 0         # the spec's eviction count before begin


def compose(base_tokens, base_media, text, media) -> tuple:
    """The prompt base + text, with `media` placed inside the new text."""
    tokens = list(base_tokens) + list(text)
    if not tokens:
        tokens = [1]
    items = list(base_media)
    for m in sorted(media, key=lambda m: m.at):
        pos = len(base_tokens) + m.at
        room = len(tokens) - pos - (0 if m.causal else 1)
        length = min(m.length, room)
        if length < 1 or any(pos < it.end and it.pos < pos + length for it in items):
            continue
        items.append(MediaItem(pos=pos, length=length, data=m.data, causal=m.causal))
    for it in items:
        tokens[it.pos:it.end] = [PLACEHOLDER] * it.length
    # a shortened prompt may leave a non-causal item covering its last key (the decode seed)
    items = [it for it in items if it.causal or it.end < len(tokens)]
    return tuple(tokens), tuple(sorted(items, key=lambda it: it.pos))


# ------------------------------------------------------------- strategies
text_st = st.lists(st.integers(1, VOCAB), max_size=8)
nonempty_text_st = st.lists(st.integers(1, VOCAB), min_size=1, max_size=12)
media_st = st.lists(st.builds(Media, at=st.integers(0, 8), length=st.integers(1, 5),
                              data=st.sampled_from([b"a", b"b"]), causal=st.booleans()), max_size=3)

STATS = {"steps": 0, "seconds": 0.0, "runs": 0}


def _first_difference(a, b, path="tree"):
    """Where two canon trees first differ, as a readable string."""
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and len(a) == 6 \
            and isinstance(a[0], int) and isinstance(b[0], int):
        here = f"{path}/[{a[0]},{a[0] + len(a[1])})"
        names = ("start", "edge", "user", "last_used", "snapshots", "children")
        for name, x, y in zip(names, a, b):
            if name == "children":
                if len(x) != len(y):
                    return f"{here} children: spec {[c[:2] for c in x]}, impl {[c[:2] for c in y]}"
                for cx, cy in zip(x, y):
                    if cx != cy:
                        return _first_difference(cx, cy, here)
            elif x != y:
                return f"{here} {name}: spec {x!r}, impl {y!r}"
    return f"{path}: spec {a!r}, impl {b!r}"


class ConformanceMachine(RuleBasedStateMachine):
    """impl and spec, side by side. Subclasses fix LAYERS (one per mix)."""

    LAYERS: tuple = MIXES["kv"]
    IMPL_CHECK = True          # impl's own checked assertions inside operations (RuleViolation)
    conversations = Bundle("conversations")

    def __init__(self):
        super().__init__()
        self.sp = self.ip = self.tracer = None
        self.req: Open | None = None
        self._abs = None
        self._closed_stats = None     # (impl's, spec's) figures of the request closed last
        self._t0 = time.perf_counter()
        self.steps = 0

    # ------------------------------------------------------------ set-up
    @initialize(chunk=st.sampled_from(CHUNKS), interval=st.sampled_from(INTERVALS),
                near_end=st.sampled_from(NEAR_ENDS), budget=st.sampled_from(BUDGETS))
    def configure(self, chunk, interval, near_end, budget):
        """One model (this class's layer mix) with its live caches, both sides
        empty; captures every `interval` keys and `near_end` before a prompt's
        end (section 2, step 2); prefill chunks of `chunk` keys."""
        self.chunk = chunk
        self._bookkeeping = (0.0, time.perf_counter())
        self._born = time.monotonic()                # node ages in the dumps are at most this old
        self.sp = SpecCache(self.LAYERS, budget=budget, interval=interval, near_end=near_end, chunk=chunk)
        self.tracer = Tracer(self.LAYERS)
        self.ip = ImplCache(self.tracer.caches, budget=budget, interval=interval, near_end=near_end,
                            check=self.IMPL_CHECK)

    def _stepped(self):
        self._abs = None
        self.steps += 1
        STATS["steps"] += 1

    def teardown(self):
        STATS["runs"] += 1
        STATS["seconds"] += time.perf_counter() - self._t0
        type(self).last_run_steps = self.steps

    # ----------------------------------------------------- preconditions
    def idle(self):
        return self.req is None

    def prefilling(self):
        return self.req is not None and not self.req.prefilled

    def decoding(self):
        return self.req is not None and self.req.prefilled

    # ------------------------------------------------- begin: the prompts
    def _begin(self, base: tuple, base_media: tuple, text, media, turns) -> None:
        """Section 2, step 1 (T3, M3, P1, E5): both sides begin the same prompt;
        they must agree on (matched, resume) and on the capture schedule (M2)."""
        tokens, items = compose(base, base_media, text, media)
        keys, spans = keys_of(tokens, items), noncausal_spans(items)
        evictions = self.sp.evictions
        a = self.sp.begin(list(tokens), list(items))
        b = self.ip.begin(keys, spans)
        inside = lambda x: any(p < x < e for p, e in spans)
        assert a == b, f"conformance mismatch in begin (matched, resume): spec {a}, impl {b}" + (
            " (M3: impl's match or resume is strictly inside a non-causal item)" if any(map(inside, b)) else "")
        sa, sb = list(self.sp.request.schedule), list(self.ip.request.schedule)
        assert sa == sb, f"conformance mismatch in request.schedule: spec {sa}, impl {sb}" + (
            " (M2: impl schedules a capture strictly inside a non-causal item)"
            if any(inside(c) for c, _ in sb) else "")
        self.req = Open(tokens, items, keys, spans, tuple(t for t in turns if t <= len(base)),
                        evictions=evictions)
        self._stepped()

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
    @rule(conv=conversations, item=st.integers(0, 3), length=st.integers(1, 6), causal=st.booleans(),
          text=text_st)
    def resend_media(self, conv, item, length, causal, text):
        """Re-send the prompt up to one of `conv`'s media items with that item's
        bytes again, `length` keys long and causal or not: a match running up
        to (M3) or diverging at an item, captures falling inside it (M2). (Since
        folds hash the run length and causality, a match can no longer end
        strictly inside an item through requests alone.)"""
        if not conv.media:
            return self.new_conversation(text or [1], [])
        m = conv.media[item % len(conv.media)]
        base, base_media = conv.prefix(m.pos)
        self._begin(base, base_media, [PLACEHOLDER] * length + list(text),
                    [Media(at=0, length=length, data=m.data, causal=causal)], conv.turns)

    # --------------------------------------------------------- prefill
    @precondition(prefilling)
    @rule()
    def prefill_chunk(self):
        """Section 2, step 3 (M1, captures, whole-state cuts): one chunk on both
        sides; on the last one, captures attach (step 4: advance, split, clip,
        compact, S1, S4, P2)."""
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
        self._stepped()

    @precondition(prefilling)
    @rule()
    def prefill_rest(self):
        """Prefill chunk by chunk to the end of the prompt (the common case;
        prefill_chunk interleaves budget changes and cancels with chunks)."""
        while self.req.prefilled is False:
            self.prefill_chunk()

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
        self._stepped()

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
        self._stepped()

    @precondition(decoding)
    @rule(target=conversations)
    def close(self):
        """Close (section 2, step 6; S3, P2, E1-E4): advance over the produced
        tokens, page out the frontier, compact, enforce the budget."""
        return self._close()

    def _close(self) -> Conv:
        r, sr = self.req, self.sp.request
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
        self._stepped()
        return Conv(tokens, r.media, len(r.tokens), r.turns + (len(tokens),))

    # ---------------------------------------------------------- budget
    @rule(budget=st.sampled_from(BUDGETS))
    def set_budget(self, budget):
        """A budget change, at rest or mid-request, that may force eviction
        (E1 budget, E2 protection, E3 order, E4 leaf removal / merge, G2)."""
        self.sp.set_budget(budget)
        self.ip.set_budget(budget)
        self._stepped()

    # ------------------------------------------------------ invariants
    def abstraction(self):
        if self._abs is None:
            self._abs = abstract(self.ip, self.LAYERS, self.tracer, self.chunk)
        return self._abs

    @invariant()
    def tooling_bookkeeping_time_is_measured(self):
        """impl's bookkeeping_s (the overhead figure the benchmarks report)
        starts at 0, never decreases, and grows by at most the wall time that
        passed since the last check."""
        if self.ip is None:
            return
        (before, since), now, b = self._bookkeeping, time.perf_counter(), self.ip.bookkeeping_s
        assert before <= b <= before + (now - since), \
            f"bookkeeping_s went from {before} to {b} in {now - since:.6f} s of wall time"
        self._bookkeeping = (b, now)

    @invariant()
    def c1_live_equals_cold_prefill(self):
        """C1: every layer's live content (decoded from the real caches) equals
        a cold prefill of the keys evaluated so far; the spec's too."""
        if self.ip is None:
            return
        v = c1_cold_equivalence(self.abstraction()) + [f"(spec) {x}" for x in c1_cold_equivalence(self.sp)]
        assert not v, "C1 violated: " + "; ".join(map(str, v))

    @invariant()
    def tooling_close_reports_the_spec_figures(self):
        """The Stats close() returned (what the Engine and the benchmarks
        report) are the spec's figures for that request."""
        if self._closed_stats is not None:
            (got, want), self._closed_stats = self._closed_stats, None
            assert got == want, f"request stats from close: impl {got}, spec {want}"

    @invariant()
    def tooling_dumps_describe_the_spec_trie(self):
        """The dumps a maintainer reads (GET /trie as text and as JSON) tell
        the truth: node for node, the spec's offsets, bytes, flags, clock and
        snapshots; the header's offset, paged-out counter and budget."""
        if self.ip is None:
            return
        want_json, want_text = spec_dump_view(self.sp)
        got = self.ip.dump_json()
        head = {k: got[k] for k in ("offset", "paged_out", "budget", "clock")}
        assert head == want_json["head"], f"dump_json header {head}, spec {want_json['head']}"
        assert json_dump_nodes(got["root"]) == want_json["nodes"], \
            f"dump_json nodes {json_dump_nodes(got['root'])}, spec {want_json['nodes']}"
        text, ages = text_dump_view(self.ip.dump())
        alive = time.monotonic() - self._born + 0.0005       # taken after both dumps; .3f rounds up to 0.5 ms
        assert text == want_text, f"dump text {text}, spec {want_text}"
        ages += json_dump_ages(got["root"])
        assert all(0 <= a <= alive for a in ages), f"node ages {ages} outside [0, {alive:.3f}] s"

    @invariant()
    def impl_own_invariants(self):
        """impl's own checked rules (impl/invariants.py) hold."""
        if self.ip is None:
            return
        v = impl_violations(self.ip)
        assert not v, "impl invariants violated: " + "; ".join(v)

    @invariant()
    def rules_hold_on_impl(self):
        """Every static rule of spec.rules holds on the abstraction of impl."""
        if self.ip is None:
            return
        v = check(self.abstraction())
        assert not v, "rules violated by impl (abstracted): " + "; ".join(map(str, v))

    @invariant()
    def rules_hold_on_spec(self):
        """... and on the spec itself (a failure here is a spec bug)."""
        if self.sp is None:
            return
        v = check(self.sp)
        assert not v, "rules violated by the spec: " + "; ".join(map(str, v))

    @invariant()
    def spec_equals_impl(self):
        """Conformance: the abstraction of impl equals the spec, field by field."""
        if self.ip is None:
            return
        ca, cs = canon(self.abstraction()), canon(self.sp)
        if ca != cs:
            diffs = []
            for k in cs:
                if ca[k] != cs[k]:
                    diffs.append(_first_difference(cs[k], ca[k]) if k == "tree"
                                 else f"{k}: spec {cs[k]!r}, impl {ca[k]!r}")
            raise AssertionError("conformance mismatch in " + ", ".join(repr(k) for k in cs if ca[k] != cs[k])
                                 + ":\n  " + "\n  ".join(diffs))


def spec_dump_view(sp) -> tuple:
    """What impl's dump_json() and dump() must show for the spec state `sp`:
    ({"head": ..., "nodes": Counter of node rows}, (header, Counter of text rows)).
    Rows are (depth, start, end, ...) so that sibling order does not matter."""
    active, frontier = {id(n) for n in sp.path}, sp.path[-1]
    rows, text = Counter(), Counter()

    def visit(n, depth):
        snaps = tuple(None if (s := n.snaps.get(i)) is None else (s.kind, s.start, s.end, s.lazy, snap_bytes(sp, i, s))
                      for i in range(len(sp.layers)))
        nbytes = sum(x[4] for x in snaps if x is not None)
        rows[(depth, n.start, n.end, len(n.edge), nbytes, n.user, id(n) in active, n.last_used, snaps)] += 1
        kinds = "".join("-" if x is None else "v" if x[0] == "kv" and x[3] else x[0][0]
                        for x, layer in zip(snaps, sp.layers) if layer.kind is not None)
        flags = frozenset(f for f, on in (("user", n.user), ("active", id(n) in active),
                                          ("frontier", n is frontier)) if on)
        text[(depth, None if n is sp.store.root else (n.start, n.end, len(n.edge), nbytes, kinds), flags)] += 1
        for c in n.children:
            visit(c, depth + 1)
    visit(sp.store.root, 0)
    head = {"offset": sp.offset, "paged_out": sp.store.counter, "budget": sp.budget, "clock": sp.clock}
    header = (sp.offset, sp.store.counter, sp.budget, sum(text.values()))
    return {"head": head, "nodes": rows}, (header, text)


def json_dump_nodes(root) -> Counter:
    """impl's dump_json()["root"] as the rows of spec_dump_view."""
    rows = Counter()

    def visit(d, depth):
        snaps = tuple(None if s is None else (s["kind"], s["start"], s["end"], s["lazy"], s["bytes"])
                      for s in d["snapshots"])
        rows[(depth, d["start"], d["end"], d["tokens"], d["bytes"], d["user"], d["active"], d["last_used"],
              snaps)] += 1
        for c in d["children"]:
            visit(c, depth + 1)
    visit(root, 0)
    return rows


def json_dump_ages(root) -> list:
    """Every node's age_s in dump_json(): a float in seconds, to the microsecond."""
    ages, stack = [], [root]
    while stack:
        d = stack.pop()
        a = d["age_s"]
        assert isinstance(a, float) and round(a, 6) == a, f"age_s {a!r} is not seconds to the microsecond"
        ages.append(a)
        stack.extend(d["children"])
    return ages


_DUMP_HEADER = re.compile(r"^prefix cache: offset (\d+), paged out (\d+) B \(budget (\d+)\), nodes (\d+)$")
_DUMP_LINE = re.compile(r"^(?P<indent> *)(?:root|\[(\d+),(\d+)\) (\d+)t (\d+)B ([-kvwr]*)) age (?P<age>-?\d+\.\d{3})s"
                        r"(?: \((?P<flags>[a-z, ]+)\))?$")


def text_dump_view(dump: str) -> tuple:
    """impl's dump() text as the (header, rows) of spec_dump_view, and the node ages."""
    first, *lines = dump.splitlines()
    m = _DUMP_HEADER.match(first)
    assert m, f"dump header unreadable: {first!r}"
    rows, ages = Counter(), []
    for line in lines:
        d = _DUMP_LINE.match(line)
        assert d, f"dump line unreadable: {line!r}"
        start, end, tokens, nbytes, kinds = d.groups()[1:6]
        node = None if start is None else (int(start), int(end), int(tokens), int(nbytes), kinds)
        flags = frozenset(d.group("flags").split(", ")) if d.group("flags") else frozenset()
        rows[(len(d.group("indent")) // 2, node, flags)] += 1
        ages.append(float(d.group("age")))
    return (tuple(int(x) for x in m.groups()), rows), ages


def machine_for(name: str, base=ConformanceMachine, **attrs) -> type:
    """A machine class for the layer mix `name`."""
    title = "".join(part.title() for part in name.split("_"))
    return type(f"{title}Machine", (base,), {"LAYERS": MIXES[name], "__module__": __name__, **attrs})


# The invariants' names, in the order Hypothesis runs them (name order).
INVARIANTS = tuple(sorted(name for name, f in vars(ConformanceMachine).items()
                          if hasattr(f, "hypothesis_stateful_invariant")))

MACHINES = {name: machine_for(name) for name in MIXES}
KvMachine = MACHINES["kv"]
KvKvMachine = MACHINES["kv_kv"]
KvRecurrentMachine = MACHINES["kv_recurrent"]
RecurrentMachine = MACHINES["recurrent"]
KvWindowedMachine = MACHINES["kv_windowed"]
WindowedMachine = MACHINES["windowed"]
HybridMachine = MACHINES["hybrid"]


def bench(seconds: float = 5.0, names=None) -> dict:
    """Steps per second of each machine (Hypothesis generation included),
    failures ignored: runs random examples until `seconds` have passed."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test
    out = {}
    for name in names or MIXES:
        cls = MACHINES[name]
        STATS.update(steps=0, seconds=0.0, runs=0)
        t0 = time.perf_counter()
        failures = 0
        while time.perf_counter() - t0 < seconds:
            try:
                run_state_machine_as_test(cls, settings=settings(
                    max_examples=20, stateful_step_count=40, deadline=None, database=None,
                    phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
            except Exception:
                failures += 1
        wall = time.perf_counter() - t0
        out[name] = {"steps": STATS["steps"], "runs": STATS["runs"], "wall_s": round(wall, 2),
                     "steps_per_s": round(STATS["steps"] / wall), "failing_runs": failures}
    return out


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(bench(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0, sys.argv[2:] or None), indent=1))
