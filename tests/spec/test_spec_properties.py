"""Property tests on the spec alone: random layer mixes and random request
sequences built from a small pool of conversations (so prefixes repeat);
no rule predicate ever fires.

Volume follows the Hypothesis profile (root conftest.py): each example runs
up to OPS operations, each operation a whole request (begin, prefill or a
cancelled prefill, decode steps, close) or a budget change, with `check`
after every begin, prefill, decode step and close.
"""
from __future__ import annotations

from hypothesis import event, given, note
from hypothesis import strategies as st

from spec.cache import PrefixCache
from spec.media import MediaItem
from spec.rules import check
from spec.trie import Layer

OPS = 20
VOCAB = 6          # a tiny vocabulary: accidental shared prefixes everywhere

layer_st = st.one_of(
    st.builds(Layer, st.just("kv"), st.integers(1, 3)),
    st.builds(Layer, st.just("windowed"), st.integers(1, 3), st.integers(1, 8)),
    st.builds(Layer, st.just("recurrent"), st.integers(1, 12)),
    st.just(Layer(None)),
)
config_st = st.fixed_dictionaries({
    "layers": st.lists(layer_st, min_size=1, max_size=4),
    "budget": st.sampled_from([0, 5, 20, 60, 1 << 40]),
    "interval": st.sampled_from([0, 0, 3, 5, 8]),
    "near_end": st.integers(0, 4),
    "chunk": st.integers(1, 9),
})
tokens_st = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)


def assert_ok(pc, where):
    violations = check(pc)
    assert violations == [], f"after {where}: " + "; ".join(map(str, violations))


def draw_media(data, prefix_len, new_len, total):
    """Maybe one media item in the new part of the prompt, causal or not."""
    if new_len < 1 or not data.draw(st.booleans(), label="media?"):
        return None
    pos = prefix_len + data.draw(st.integers(0, new_len - 1), label="media pos")
    causal = data.draw(st.booleans(), label="causal")
    room = total - pos - 1     # the decode seed stays a plain token (driver: step(tokens[-1]))
    if room < 1:
        return None
    length = data.draw(st.integers(1, min(room, 5)), label="media len")
    return MediaItem(pos=pos, length=length, data=bytes([data.draw(st.integers(0, 2), label="media data")]),
                     causal=causal)


@given(config=config_st, data=st.data())
def test_no_rule_ever_fires(config, data):
    pc = PrefixCache(config["layers"], budget=config["budget"], interval=config["interval"],
                     near_end=config["near_end"], chunk=config["chunk"])
    convos = [[] for _ in range(3)]    # per conversation: list of (tokens, media, generated)
    current = 0
    for _ in range(data.draw(st.integers(1, OPS), label="ops")):
        op = data.draw(st.sampled_from(["extend", "extend", "extend", "regenerate", "edit", "switch", "budget"]),
                       label="op")
        if op == "budget":
            pc.set_budget(data.draw(st.sampled_from([0, 5, 20, 60, 1 << 40]), label="budget"))
            assert_ok(pc, "set_budget")
            continue
        if op == "switch":
            current = data.draw(st.integers(0, len(convos) - 1), label="convo")
            op = "extend"
        turns = convos[current]
        if not turns or op == "extend":
            base, media = [], []
            if turns:
                prev, prev_media, gen = turns[-1]
                keep = data.draw(st.sampled_from([len(gen), 0, len(gen) // 2]), label="response kept")
                base, media = prev + gen[:keep], list(prev_media)
        elif op == "regenerate":
            base, media, _ = turns[-1]
            base, media = list(base), list(media)
        else:  # edit an earlier turn: cut somewhere inside the last prompt
            prev, prev_media, _ = turns[data.draw(st.integers(0, len(turns) - 1), label="turn")]
            cut = data.draw(st.integers(0, len(prev)), label="cut")
            base = prev[:cut]
            media = [m for m in prev_media if m.end <= cut]
        new = [] if op == "regenerate" else data.draw(tokens_st, label="new tokens")
        tokens = base + new
        if not tokens:
            tokens = [0]
        item = draw_media(data, len(base), len(new), len(tokens))
        if item is not None:
            media.append(item)
        # a shortened prompt may leave a non-causal item covering its last position
        media = [m for m in media if m.end < len(tokens)]
        gen = data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4), label="generated")
        note(f"{op}: tokens={tokens} media={media} gen={gen}")
        event(f"op: {op}")

        pc.begin(tokens, media)
        assert_ok(pc, "begin")
        cancel = data.draw(st.sampled_from([None, None, None, 0, 1, 2]), label="cancel after chunks")
        if pc.prefill(max_chunks=cancel):
            assert_ok(pc, "prefill")
            pc.step(tokens[-1])
            for g in gen[:-1]:
                pc.step(g)
                assert_ok(pc, "step")
            turns.append((tokens, media, gen))
        else:
            assert_ok(pc, "cancelled prefill")
            turns.append((tokens, media, []))
        pc.close()
        assert_ok(pc, "close")



# ------------------------------------------------------------------------
# A finer-grained machine: begin, partial prefills, decode steps, close and
# budget changes are separate rules, so budgets change mid-request, a
# request can be cancelled at any point and prefill resumed chunk by chunk.
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule  # noqa: E402


class SpecMachine(RuleBasedStateMachine):
    @initialize(config=config_st)
    def setup(self, config):
        self.pc = PrefixCache(config["layers"], budget=config["budget"], interval=config["interval"],
                              near_end=config["near_end"], chunk=config["chunk"])
        self.history = [[0, 1, 2]]          # past live sequences: new prompts share their prefixes
        self.prompt = None

    @precondition(lambda self: self.pc.request is None)
    @rule(data=st.data())
    def begin(self, data):
        base = data.draw(st.sampled_from(self.history), label="base")
        cut = data.draw(st.integers(0, len(base)), label="cut")
        tokens = list(base[:cut]) + data.draw(st.lists(st.integers(0, VOCAB - 1), max_size=5), label="new")
        tokens = tokens or [0]
        media = []
        if len(tokens) > 2 and data.draw(st.booleans(), label="media?"):
            pos = data.draw(st.integers(0, len(tokens) - 2), label="media pos")
            length = data.draw(st.integers(1, len(tokens) - 1 - pos), label="media len")
            media = [MediaItem(pos=pos, length=length, data=b"m", causal=data.draw(st.booleans(), label="causal"))]
        note(f"begin {tokens} {media}")
        self.pc.begin(tokens, media)
        self.prompt, self.tokens = tokens, list(tokens)    # token ids by position (seq holds folds)

    @precondition(lambda self: self.pc.request is not None and not self.pc.request.prefilled)
    @rule(k=st.sampled_from([None, 1, 2]))
    def prefill(self, k):
        if self.pc.prefill(max_chunks=k):
            self.pc.step(self.prompt[-1])

    @precondition(lambda self: self.pc.request is not None and self.pc.request.prefilled)
    @rule(g=st.integers(0, VOCAB - 1))
    def step(self, g):
        self.pc.step(g)
        self.tokens.append(g)

    @precondition(lambda self: self.pc.request is not None)
    @rule()
    def close(self):
        self.pc.close()
        self.history.append(self.tokens[:self.pc.offset])

    @rule(budget=st.sampled_from([0, 5, 20, 60, 1 << 40]))
    def set_budget(self, budget):
        self.pc.set_budget(budget)

    @invariant()
    def rules_hold(self):
        if hasattr(self, "pc"):
            violations = check(self.pc)
            assert violations == [], "; ".join(map(str, violations))


TestSpecMachine = SpecMachine.TestCase
