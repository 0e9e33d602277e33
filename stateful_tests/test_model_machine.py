"""The model machine: the prefix-cache contract on a real small model.

Requests come from a small pool of conversations so prefixes really repeat:
new conversations, continuations with all, part or none of the response,
regenerations, edits of an earlier turn, rewinds, media items, cancels and
budget squeezes. Each request runs on impl's Engine (rule assertions on) and,
with the same keys, on the spec with the model's real layer kinds and byte
costs. After every request:
  - the trie of impl equals the spec's (shape, offsets, user flags, clock,
    which layers hold snapshots over which range, lazy flags, bytes);
  - every spec rule holds on the spec, every impl assertion on impl;
  - C1, exactly where same-schedule replays are bit-identical (fuzz/replay.py):
    the first decode logits equal, bit for bit, a cold replay on mlx-lm's stock
    caches of forwards that wrote the restored prefix plus this request's own,
    and the greedy tokens are that replay's argmax. Elsewhere the first logits
    and greedy tokens equal a cold run with stock caches (text) or a fresh
    engine (media) within the calibrated tolerance, unless the cold path cut
    where this request's forwards were cut reproduces ours and itself differs
    from one forward (fuzz.cold.chunking_tie).
CI runs the hybrid model (qwen3next); the nightly profile adds SmolLM2.
"""
from __future__ import annotations

import os

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule
from mlx_lm.models.cache import make_prompt_cache

from fuzz.calibrate import tolerance
from fuzz.cold import chunking_tie
from fuzz.replay import Replay, replay_is_exact
from impl.engine import Engine
import impl.media
from impl.models import load
from spec.cache import PrefixCache as SpecCache
from spec.media import MediaItem
from spec.rules import check
from spec.trie import Layer

WORDS = list(range(1000, 1012))
PLACEHOLDER = 999
CHUNK, INTERVAL, NEAR_END = 8, 16, 4


def spec_layers(engine) -> list:
    """The model's layer kinds with the byte costs impl's snapshots report."""
    probe = engine.loaded.make_caches()
    engine.model(mx.array([[1, 2]]), cache=probe)
    layers = []
    for c in probe:
        if c is None:
            layers.append(Layer(None))
        elif c.kind == "kv":
            layers.append(Layer("kv", cost=c.keys.nbytes // c.keys.shape[2] * 2))
        elif c.kind == "windowed":
            layers.append(Layer("windowed", cost=c.keys.nbytes // c.keys.shape[2] * 2, window=c.window))
        else:
            layers.append(Layer("recurrent", cost=c.nbytes))
    return layers


def structure(root, layers) -> tuple:
    """A node's shape with snapshot ranges and sizes (no content)."""
    def size(i, s):
        return s.size if hasattr(s, "size") and not callable(getattr(s, "size")) else s.size(layers[i])

    def snaps(n):
        items = n.snaps.items() if isinstance(n.snaps, dict) else ((i, s) for i, s in enumerate(n.snaps) if s is not None)
        return tuple((i, s.kind, s.start, s.end, s.lazy, size(i, s)) for i, s in sorted(items, key=lambda x: x[0]))

    def kids(n):
        cs = n.children.values() if isinstance(n.children, dict) else n.children
        return tuple(visit(c) for c in sorted(cs, key=lambda c: c.edge[0]))

    def visit(n):
        return (n.start, tuple(n.edge), n.user, n.last_used, snaps(n), kids(n))
    return visit(root)


class ModelMachine(RuleBasedStateMachine):
    model_name = "qwen3next"

    def __init__(self):
        super().__init__()
        self.lm = load(self.model_name)
        self.engine = Engine(self.lm, check_rules=True, chunk_size=CHUNK, capture_interval=INTERVAL,
                             near_end=NEAR_END)
        self.layers = spec_layers(self.engine)
        self.spec = SpecCache(self.layers, interval=INTERVAL, near_end=NEAR_END, chunk=CHUNK)
        self.cold_cache: dict = {}
        self.exact = replay_is_exact(self.lm)
        self.replay = Replay(self.lm)

    conversations = Bundle("conversations")

    # ------------------------------------------------------------ requests
    def request(self, tokens, max_tokens, media=(), cancel_after=None):
        calls = [0]

        def cancel():
            calls[0] += 1
            return cancel_after is not None and calls[0] > cancel_after
        r = self.engine.generate(list(tokens), max_tokens=max_tokens, media=list(media), cancel=cancel,
                                 stop_at_eos=False)
        items = [MediaItem(m.pos, m.length, m.data, m.dims, m.causal) for m in media]
        self.spec.begin(list(tokens), items)
        done = self.spec.prefill(max_chunks=cancel_after)
        if done and max_tokens > 0:
            self.spec.step(self.spec.request.keys[-1])
            for t in r.tokens[:-1]:
                self.spec.step(t)
        self.spec.close()
        if self.exact:
            v = self.replay.judge(tokens, list(media), r, engine=self.engine)
            assert v.ok, f"{v.signature}: {v.message}"
        elif done and max_tokens > 0 and len(r.tokens) == max_tokens:
            self.check_c1(tokens, media, r)
        return r

    def check_c1(self, tokens, media, r):
        key = (tuple(tokens), tuple(media), len(r.tokens))
        if key not in self.cold_cache:
            if media:
                fresh = Engine(self.lm, chunk_size=4096, capture_interval=0)
                c = fresh.generate(list(tokens), max_tokens=len(r.tokens), media=list(media), stop_at_eos=False)
                self.cold_cache[key] = (c.first_logits, c.tokens)
            else:
                cache = make_prompt_cache(self.lm.model)
                logits = self.lm.model(mx.array([list(tokens)]), cache=cache)
                first, out = logits[0, -1], []
                for _ in range(len(r.tokens)):
                    out.append(int(mx.argmax(logits[0, -1]).item()))
                    logits = self.lm.model(mx.array([[out[-1]]]), cache=cache)
                self.cold_cache[key] = (first, out)
        first, out = self.cold_cache[key]
        diff = float(mx.max(mx.abs(first - r.first_logits)).item())
        if diff > tolerance(self.lm):
            ours = np.array(r.first_logits.astype(mx.float32))
            tie = chunking_tie(self.lm, list(tokens), list(media), r, ours, tolerance(self.lm))
            assert tie is not None, f"C1: first logits differ from cold by {diff} (calibrated tolerance)"
            return                        # the model has no single cold answer here; the tokens follow ours
        assert r.tokens == out, f"C1: greedy tokens {r.tokens} != cold {out}"

    @initialize(target=conversations, words=st.lists(st.sampled_from(WORDS), min_size=3, max_size=20))
    def first_conversation(self, words):
        """A fresh prompt (shared system-prompt-like prefix from the pool)."""
        r = self.request(words, 3)
        return list(words) + r.tokens

    @rule(target=conversations, words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=20),
          max_tokens=st.integers(0, 4))
    def new_conversation(self, words, max_tokens):
        r = self.request(words, max_tokens)
        return list(words) + r.tokens

    @rule(target=conversations, conv=consumes(conversations), keep=st.integers(0, 6),
          question=st.lists(st.sampled_from(WORDS), min_size=1, max_size=6), max_tokens=st.integers(1, 4))
    def continue_conversation(self, conv, keep, question, max_tokens):
        """Extend a conversation with all, part or none of its last response."""
        base = conv[:max(1, len(conv) - keep)]
        prompt = base + question
        r = self.request(prompt, max_tokens)
        return prompt + r.tokens

    @rule(conv=conversations, max_tokens=st.integers(1, 5))
    def regenerate(self, conv, max_tokens):
        """The same prompt again (a response that may be a prefix of the stored one)."""
        self.request(conv[:max(1, len(conv) - 2)], max_tokens)

    @rule(target=conversations, conv=conversations, at=st.integers(1, 30),
          edit=st.lists(st.sampled_from(WORDS), min_size=1, max_size=5))
    def edit_earlier_turn(self, conv, at, edit):
        """Diverge inside a stored edge."""
        prompt = conv[:min(at, len(conv) - 1)] + edit
        r = self.request(prompt, 2)
        return prompt + r.tokens

    @rule(conv=conversations, at=st.integers(1, 40))
    def rewind(self, conv, at):
        self.request(conv[:min(at, len(conv))], 2)

    @rule(conv=conversations, at=st.integers(0, 10), length=st.integers(1, 6), data=st.binary(min_size=1, max_size=2),
          causal=st.booleans(), tail=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4))
    def with_media(self, conv, at, length, data, causal, tail):
        """A media placeholder run at a random place; the rest follows."""
        at = min(at, len(conv))
        prompt = conv[:at] + [PLACEHOLDER] * length + tail
        self.request(prompt, 2, media=[impl.media.MediaItem(at, length, data, (length,), causal)])

    @rule(conv=conversations, k=st.integers(0, 2), extra=st.lists(st.sampled_from(WORDS), min_size=8, max_size=30))
    def cancel_mid_prefill(self, conv, k, extra):
        self.request(conv + extra, 2, cancel_after=k)

    @rule(budget=st.sampled_from([0, 20_000, 100_000, 1 << 40]))
    def squeeze_budget(self, budget):
        self.engine.set_budget(budget)
        self.spec.set_budget(budget)

    # ---------------------------------------------------------- invariants
    @invariant()
    def impl_equals_spec(self):
        impl_tree = structure(self.engine.pc.root, self.layers)
        spec_tree = structure(self.spec.root, self.layers)
        assert impl_tree == spec_tree, "impl trie differs from spec"
        assert self.engine.pc.counter == self.spec.trie.counter
        assert [n.end for n in self.engine.pc.path] == [n.end for n in self.spec.path]

    @invariant()
    def spec_rules_hold(self):
        assert check(self.spec) == []


class SmolLM2Machine(ModelMachine):
    model_name = "smollm2"


NIGHTLY = os.environ.get("HYPOTHESIS_PROFILE") == "nightly"

TestModelMachine = ModelMachine.TestCase
TestModelMachine.settings = settings(settings.default, max_examples=60 if NIGHTLY else 16,
                                     stateful_step_count=30 if NIGHTLY else 20)

TestSmolLM2Machine = SmolLM2Machine.TestCase
TestSmolLM2Machine.settings = settings(settings.default, max_examples=20, stateful_step_count=20)
TestSmolLM2Machine = pytest.mark.skipif(not NIGHTLY, reason="the SmolLM2 model machine runs in the nightly profile")(
    TestSmolLM2Machine)
