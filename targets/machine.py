"""A Hypothesis state machine over any Target, with spec's PrefixCache alongside.

Both sides run the same program: begin(tokens, media) / prefill(max_chunks) /
step(key) / close() / set_budget(b). After every target operation the target's
view is judged by spec.rules (through targets.viewcheck), restricted to the
rules the target declares. A violation fails the example with RuleViolation,
carrying the program that produced it; Hypothesis shrinks it (`shrink=True`)
or, by default, `minimize` reduces it by replaying the target.

Differences between spec and target that break no rule are *policy
differences* (resume offsets, trie shape, snapshot placement, byte counts):
tallied per kind with a first example, never failures. A target whose views
key token pairs (`pairs`, Ollama's draft look-ahead) is not compared by trie
shape; a target's `PARTIAL` (rule -> view transform) has those rules judged
on the transformed view (targets.viewcheck.check_view).

Invariants:
  - every example starts with target.reset(...) (one process serves all);
  - the program recorded is the target's operations, in order, as JSON-able
    dicts (`ops`), replayable with `replay`;
  - within one Hypothesis run only the first rule seen fails examples
    (`Hunt.rule`), so shrinking keeps to that rule; rules already found
    (`Hunt.found`) are ignored by later runs; `Hunt.seen` records when each
    rule was first broken by any example;
  - `minimize` keeps programs in pipeline order (`well_formed`): it never
    steps after a prefill that did not complete, and a request's first step
    is its seed (the prompt's last key: a harness feeds whatever key it gets,
    so a program that dropped the seed step would judge a stream no
    pipeline evaluates); `replay_checked` refuses both.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, assume, settings
from hypothesis.errors import HypothesisException
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from spec.cache import PrefixCache as SpecCache
from spec.media import MediaItem, keys_of, noncausal_spans
from targets.ollama.target import TargetPanic, wire_key
from targets.viewcheck import as_op, check_op, check_view


class RuleViolation(AssertionError):
    def __init__(self, rule: str, message: str, ops: list):
        super().__init__(f"{rule}: {message}")
        self.rule, self.message, self.ops = rule, message, list(ops)


@dataclass
class Hunt:
    """State shared by the runs of one campaign."""
    rules: frozenset
    found: dict = field(default_factory=dict)      # rule -> seconds when its hunt began (hunted rules)
    seen: dict = field(default_factory=dict)       # rule -> seconds to first detection (any example)
    rule: str | None = None                        # the rule this run hunts (first seen)
    t0: float = field(default_factory=time.monotonic)
    policy: dict = field(default_factory=dict)     # kind -> [count, first example]
    steps: int = 0
    notes: list = field(default_factory=list)      # runs that ended in a Hypothesis error


TOK = st.integers(1, 6)


class TargetMachine(RuleBasedStateMachine):
    """Subclassed per target/layout by `machine_for` (target, hunt, config)."""
    target = None
    hunt: Hunt = None
    config: dict = {}

    @initialize(budget=st.sampled_from([1 << 40, 1 << 40, 64, 160, 400]))
    def setup(self, budget):
        self.ops, self.streams, self.before = [], [], None
        self.open, self.prefilled, self.seeded = False, False, False
        self.keys = ()
        self.target.reset(budget=budget, **self.config)
        self.ops.append(dict(op="reset", budget=budget, **self.config))
        v = self.target.view()
        self.spec = SpecCache(v.layers, budget=budget, interval=self.config["interval"],
                              near_end=self.config["near_end"], chunk=self.config["chunk"])
        self.judge(None)

    # --------------------------------------------------------------- judging
    def judge(self, op):
        view = self.target.view()
        self.hunt.steps += 1
        vs = check_view(view, rules=self.hunt.rules, partial=getattr(self.target, "PARTIAL", None))
        if op is not None:
            wire = dict(op, keys=view.request.keys) if op["op"] == "begin" and view.request else op
            vs += check_op(self.before, as_op(wire, self.target.outcome), view, self.target.merges,
                           rules=self.hunt.rules)
        self.before = view
        now = time.monotonic() - self.hunt.t0
        for v in vs:
            self.hunt.seen.setdefault(v.rule, now)
        for v in vs:
            if v.rule in self.hunt.found and v.rule != self.hunt.rule:
                continue
            if self.hunt.rule is None:
                self.hunt.rule = v.rule
                self.hunt.found[v.rule] = time.monotonic() - self.hunt.t0
            if v.rule == self.hunt.rule:
                raise RuleViolation(v.rule, f"{v.where}: {v.message}", self.ops)
        self.compare(view)

    def compare(self, view):
        wire_key = getattr(self.target, "wire", int)
        s = self.spec.view()
        diffs = {}
        if s.request and view.request and s.request.resume != view.request.resume:
            diffs["resume"] = f"spec resumes at {s.request.resume}, target at {view.request.resume}"
        shape = lambda v, w: {(tuple(w(k) for k in n.keys), n.start) for n in v.nodes.values()}
        if getattr(self.target, "pairs", False):
            pass                              # keys are token pairs (a draft look-ahead): not the spec's trie
        elif shape(s, wire_key) != shape(view, int):
            diffs["trie shape"] = "node sets differ (capture cadence or compaction extent)"
        elif {tuple(wire_key(k) for k in n.keys): set(n.snaps) for n in s.nodes.values()} != \
                {n.keys: set(n.snaps) for n in view.nodes.values()}:
            diffs["snapshot placement"] = "a node holds different layers"
        if s.counter != view.counter:
            diffs["byte counter"] = "lazy views (spec) vs the fakes' eager copies, or different nodes kept"
        for kind, text in diffs.items():
            entry = self.hunt.policy.setdefault(kind, [0, None])
            entry[0] += 1
            if entry[1] is None:
                entry[1] = dict(example=text, ops=list(self.ops))

    def run(self, op: dict, target_call, spec_call):
        self.ops.append(op)
        try:
            result = target_call()
        except TargetPanic as e:
            self.hunt.steps += 1
            if "PANIC" not in self.hunt.found or self.hunt.rule == "PANIC":
                if self.hunt.rule is None:
                    self.hunt.rule = "PANIC"
                    self.hunt.found["PANIC"] = time.monotonic() - self.hunt.t0
                if self.hunt.rule == "PANIC":
                    raise RuleViolation("PANIC", f"the cache panicked: {e}", self.ops) from None
            assume(False)              # a panic already reported: drop the example
        try:
            spec_call()
        except ValueError:
            pass                                  # the spec refuses what the target took: a policy matter
        self.judge(op)
        return result

    # ------------------------------------------------------------------ ops
    @precondition(lambda self: not self.open)
    @rule(data=st.data())
    def begin(self, data):
        kind = data.draw(st.sampled_from(["fresh", "extend", "prefix", "same"] if self.streams else ["fresh"]))
        _, base, media = data.draw(st.sampled_from(self.streams)) if self.streams and kind != "fresh" else ((), (), ())
        if kind == "prefix":
            base = base[:data.draw(st.integers(1, len(base)))]
        media = [m for m in media if m.end <= len(base)]          # a stored item comes whole or not at all
        # a prompt diverging from a stored one adds a turn: long enough for a capture after the resume
        tail = data.draw(st.lists(TOK, min_size=4 if kind == "prefix" else 0 if base else 1, max_size=8))
        tokens = list(base) + tail
        if data.draw(st.booleans()) and len(tokens) - len(base) >= 4:
            p = data.draw(st.integers(len(base), len(tokens) - 3))
            e = data.draw(st.integers(p + 1, len(tokens) - 2))
            tokens[p:e] = [0] * (e - p)
            media.append(MediaItem(p, e - p, data=bytes([data.draw(st.integers(0, 2))]),
                                   causal=data.draw(st.sampled_from([False, False, True]))))
        if any(not m.causal and m.end >= len(tokens) for m in media):
            tokens.append(1)                    # the decode seed is never inside a non-causal item
        self.tokens, self.media = list(tokens), media
        keys = keys_of(tokens, media)
        spans = noncausal_spans(media)
        self.open, self.prefilled, self.seeded, self.keys = True, False, False, keys
        wire = getattr(self.target, "wire", int)
        self.run(dict(op="begin", keys=[wire(k) for k in keys], spans=[list(s) for s in spans],
                      tokens=tokens, media=[[m.pos, m.length, m.data.hex(), m.causal] for m in media]),
                 lambda: self.target.begin(keys, spans), lambda: self.spec.begin(tokens, media))

    @precondition(lambda self: self.open and not self.prefilled)
    @rule(all_chunks=st.booleans())
    def prefill(self, all_chunks):
        mc = None if all_chunks else 1
        done = self.run(dict(op="prefill", max_chunks=mc or 0), lambda: self.target.prefill(mc),
                        lambda: self.spec.prefill(mc))
        self.prefilled = bool(done)

    @precondition(lambda self: self.prefilled)
    @rule(gen=st.lists(TOK, min_size=0, max_size=4), follow=st.integers(0, 4))
    def decode(self, gen, follow):
        """Evaluate the seed (first time), then `gen`; with follow > 0, first
        the next `follow` keys of a stored stream this one is a prefix of (a
        response that repeats, or stops short of, an earlier one)."""
        seq = tuple(self.spec.seq) + (() if self.seeded else (self.keys[-1],))
        known = [k for k, _, _ in self.streams if len(k) > len(seq) and k[:len(seq)] == seq]
        again = list(known[-1][len(seq):len(seq) + follow]) if known and follow else []
        again = [k if k < 1 << 31 else 0 for k in again]
        keys = ([] if self.seeded else [self.keys[-1]]) + again + gen
        self.seeded = True
        self.tokens += again + gen
        for k in keys:
            self.run(dict(op="step", key=k), lambda: self.target.step(k), lambda: self.spec.step(k))

    @precondition(lambda self: self.open)
    @rule()
    def close(self):
        self.run(dict(op="close"), self.target.close, self.spec.close)
        self.open = self.prefilled = False
        n = len(self.spec.seq)
        if n:
            self.streams.append((tuple(self.spec.seq), tuple(self.tokens[:n]), [m for m in self.media if m.end <= n]))
        self.streams = self.streams[-4:]

    @rule(budget=st.sampled_from([0, 64, 160, 400, 1 << 40]))
    def set_budget(self, budget):
        self.run(dict(op="set_budget", budget=budget), lambda: self.target.set_budget(budget),
                 lambda: self.spec.set_budget(budget))


def machine_for(target, hunt: Hunt, config: dict):
    return type("TargetMachine_" + config.get("layout", "x"), (TargetMachine,),
                dict(target=target, hunt=hunt, config=config))


def hunt_once(target, hunt: Hunt, config: dict, max_examples: int = 40, steps: int = 15, shrink: bool = True):
    """One Hypothesis run: returns a RuleViolation (shrunk unless `shrink` is
    False; `minimize` then reduces it by replay, much faster) or None."""
    hunt.rule = None
    cls = machine_for(target, hunt, config)
    s = settings(max_examples=max_examples, stateful_step_count=steps, deadline=None, database=None,
                 suppress_health_check=list(HealthCheck), print_blob=False,
                 phases=list(Phase) if shrink else [Phase.explicit, Phase.generate])
    try:
        run_state_machine_as_test(cls, settings=s)
    except RuleViolation as e:
        return e
    except HypothesisException as e:         # e.g. a flaky shrink: the run found nothing it can show
        hunt.notes.append(f"{type(e).__name__}: {str(e).splitlines()[0]}")
    return None


def send(target, op: dict) -> None:
    """One operation of a saved program (its wire form) to a target."""
    name = op["op"]
    if name == "reset":
        target.reset(**{k: v for k, v in op.items() if k != "op"})
    elif name == "begin":
        target.begin(op["keys"], [tuple(s) for s in op["spans"]])
    elif name == "prefill":
        target.prefill(op["max_chunks"] or None)
    elif name == "step":
        target.step(op["key"])
    elif name == "close":
        target.close()
    elif name == "set_budget":
        target.set_budget(op["budget"])


def replay(target, ops: list) -> list:
    """Run a saved program on a target; returns the violations seen (rule, message)."""
    found, before = [], None
    for op in ops:
        name = op["op"]
        send(target, op)
        view = target.view()
        wire = dict(op, keys=view.request.keys) if name == "begin" and view.request else op
        vs = check_view(view, partial=getattr(target, "PARTIAL", None)) + \
            check_op(before, as_op(wire, target.outcome), view, target.merges)
        before = view
        found += [(v.rule, str(v)) for v in vs if v.rule in target.RULES]
    return found


def is_seed(key: int, begin: dict) -> bool:
    """The request's first step evaluates its prompt's last key (`begin` records keys in the
    target's wire alphabet, a step the key itself)."""
    last = begin["keys"][-1]
    return key == last or wire_key(key) == last


def well_formed(ops: list) -> bool:
    """The pipeline's order: reset first; begin, prefill*, step*, close per
    request (a step only after a prefill that completed, the first one the
    seed); set_budget anywhere."""
    if not ops or ops[0]["op"] != "reset":
        return False
    state = "idle"
    for o in ops[1:]:
        n = o["op"]
        if n == "begin":
            if state != "idle":
                return False
            state = "begun"
        elif n == "prefill":
            if state != "begun":
                return False
        elif n == "step":
            if state not in ("begun", "stepping"):
                return False
            state = "stepping"
        elif n == "close":
            if state == "idle":
                return False
            state = "idle"
        elif n == "reset":
            return False
    try:
        seeds_checked(ops)
    except ValueError:
        return False
    return True


def reproduces(target, ops: list, rule: str) -> bool:
    if not well_formed(ops):
        return False
    try:
        return any(r == rule for r, _ in replay_checked(target, ops))
    except (TargetPanic, KeyError, ValueError, IndexError):
        return rule == "PANIC"


def seeds_checked(ops: list) -> None:
    """ValueError unless each request's first step is its seed."""
    begun, seeded = None, True
    for o in ops:
        if o["op"] == "begin":
            begun, seeded = o, False
        elif o["op"] == "step" and not seeded:
            if not is_seed(o["key"], begun):
                raise ValueError(f"the first step evaluates {o['key']}, not the seed {begun['keys'][-1]}")
            seeded = True


def replay_checked(target, ops: list) -> list:
    """replay, refusing a step after a prefill that did not complete, or a first step that is not
    the seed (not a pipeline order)."""
    seeds_checked(ops)
    done = True
    out = []
    for i, o in enumerate(ops):
        if o["op"] == "begin":
            done = False
        if o["op"] == "step" and not done:
            raise ValueError("step before the prefill completed")
        if o["op"] == "prefill":
            out = replay(target, ops[:i + 1])
            done = bool(target.outcome and target.outcome[0])
    return replay(target, ops)


def removals(ops: list):
    """The ranges [a, b) a greedy reduction tries to drop from `ops`, in order: each whole request
    (begin to close), then runs of consecutive operations after the first (the reset), of halving
    lengths down to 3, 2 and 1. Single operations alone get stuck where only several go together (two
    decode steps whose keys the trie's shape needs in pairs)."""
    for s in (i for i, o in enumerate(ops) if o["op"] == "begin"):
        e = next((j for j in range(s, len(ops)) if ops[j]["op"] == "close"), len(ops) - 1)
        yield s, e + 1
    lengths, k = {3, 2, 1}, (len(ops) - 1) // 2
    while k > 3:
        lengths.add(k)
        k //= 2
    for k in sorted(lengths, reverse=True):
        for a in range(len(ops) - k, 0, -1):
            yield a, a + k


def reduce_ops(ops: list, keeps) -> list:
    """Drop ranges (``removals``) while ``keeps(program)`` holds, until none can go."""
    best, changed = list(ops), True
    while changed:
        changed = False
        for a, b in removals(best):
            cand = best[:a] + best[b:]
            if keeps(cand):
                best, changed = cand, True
                break
    return best


def minimize(target, ops: list, rule: str) -> list:
    """Greedy reduction after Hypothesis's shrink (``reduce_ops``): the program stays well formed and
    still breaks `rule`."""
    return reduce_ops(ops, lambda cand: reproduces(target, cand, rule))
