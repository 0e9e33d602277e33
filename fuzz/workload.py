"""Deterministic request workloads for the fuzz campaign, and the case format they produce.

A *case* is one engine's life: engine settings plus a list of concrete operations, each either

    {"op": "generate", "tokens": [...], "media": [{"pos", "length", "data" (hex), "dims", "causal"}],
     "max_tokens": k, "cancel_after": null | c, "kind": "turn" | "edit" | ...}
    {"op": "set_budget", "bytes": b, "kind": "squeeze" | "restore"}

``cancel_after = c`` makes the request's cancel callable return True on its (c+1)-th call: the
engine polls it before every prefill chunk and after every decoded token, so c chunks are
prefilled and the request stops (mid-prefill, or mid-decode when the prompt had fewer chunks).

The generator (`Workload`) is interactive but deterministic for a seed: it decides the next
operation from a ``random.Random(seed)`` and from what the model answered so far (a multi-turn
chat carries the model's real replies). Every operation it emits is concrete (token ids, not
text), so a case replays without the generator and any subset of it is again a valid case.

What it produces (REFERENCE section 2 paths it aims at):
  turn      a new user turn in the current conversation (real English text through the chat
            template of SmolLM2's tokenizer, which every model shares)
  new_conv  a new conversation under one of a few shared system prompts
  switch    back to another open conversation
  regen     the same prompt again (full match: begin backs off by one key)
  edit      an earlier user turn rewritten (branch inside the stored conversation)
  rewind    an old turn's prompt re-requested exactly, then continued as a new branch
  prefix    a response that is a prefix of a stored one (same prompt, smaller max_tokens: close
            lands on a head split off a stored edge, S3), or a prompt that contains part of a
            stored response and then diverges (resume inside an edge, P1)
  media     a turn with a media item (causal or non-causal; a run of a reserved placeholder token
            id whose keys are the item's fold); items come from a small pool so they recur
  long      a long user message crossing several periodic captures
  squeeze   set_budget to 0, to half the paged-out bytes, or to one checkpoint (eviction on and
            off the active path), restored after 0-3 requests
  any generate may carry a cancel point.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from impl.media import MediaItem

CASE_FORMAT = "prefix-trie-fuzz-case/1"
PLACEHOLDER_TOKEN = "<empty_output>"      # a reserved control token of SmolLM2's vocabulary

SYSTEM_PROMPTS = [
    None,    # the template's own default system prompt
    "You are a concise assistant. Answer in one or two sentences and never use lists.",
    "You are a patient tutor for a student learning about physics, chemistry and biology. "
    "Explain every step, define technical words, and check the student's understanding at the end.",
    "You are a travel agent. Recommend places, list opening hours when you know them, and warn about "
    "crowds in the summer months.",
]

QUESTIONS = [
    "What is the capital of France?",
    "Why is the sky blue during the day and red at sunset?",
    "Can you explain how a bicycle stays upright when it moves?",
    "Write a short poem about the sea in winter.",
    "What is the difference between a virus and a bacterium?",
    "How do I make a simple tomato sauce for pasta?",
    "Summarise the plot of Romeo and Juliet in three sentences.",
    "What are prime numbers, and why do they matter in cryptography?",
    "Tell me about the history of the city of Paris and its bridges.",
    "How does a refrigerator keep food cold?",
    "Give me three tips for sleeping better.",
    "What causes the seasons on Earth?",
    "Explain recursion to a ten year old.",
    "Which planets in the solar system have rings?",
    "How do bees make honey?",
    "What is the tallest mountain in Africa, and can you climb it without ropes?",
    "Translate 'good morning, how are you' into Spanish and German.",
    "Why do cats purr?",
    "What should I pack for a weekend hiking trip in the mountains?",
    "How does compound interest work?",
    "Describe the water cycle.",
    "What is a black hole?",
    "Suggest a name for a small bakery by the harbour.",
    "How many legs does a spider have, and how many eyes?",
]

FOLLOW_UPS = [
    "Can you say more about that?",
    "Thanks! And why is that?",
    "Please give me an example.",
    "Could you make it shorter?",
    "That is interesting. What else should I know?",
    "Are you sure? Please check again.",
    "Now explain it as if I were five.",
    "What is the most surprising fact about it?",
]

SENTENCES = [
    "The river runs through the old town, past the market square and under seven stone bridges.",
    "In the spring the orchards bloom and the hills turn white and pink for a few short weeks.",
    "Our team met every Monday morning to plan the week and review what had gone wrong.",
    "The recipe calls for two cups of flour, one egg, a pinch of salt and a little warm milk.",
    "Scientists measured the temperature of the lake every hour for three consecutive summers.",
    "When the train finally arrived, the platform was crowded with tired travellers and their bags.",
    "The library keeps its oldest maps in a cool, dark room on the top floor of the east wing.",
    "A good password is long, unique for every site, and stored in a password manager.",
    "The committee postponed its decision until the engineers had finished the safety report.",
    "Birds that migrate south in autumn often return to the very same nest the following year.",
    "The first chapter introduces the family, their farm, and the drought that changes everything.",
    "Please remember to water the plants on the balcony while we are away for the holidays.",
    "The museum's new exhibition shows how people cooked, ate and shared food a thousand years ago.",
    "Each student must submit a short essay and a reading list before the end of the month.",
]

MEDIA_MARK = re.compile(r"<MEDIA:(\d+)>")


def media_to_json(m: MediaItem) -> dict:
    return {"pos": m.pos, "length": m.length, "data": bytes(m.data).hex(), "dims": list(m.dims),
            "causal": bool(m.causal)}


def media_from_json(d: dict) -> MediaItem:
    return MediaItem(int(d["pos"]), int(d["length"]), bytes.fromhex(d["data"]), tuple(d.get("dims", ())),
                 bool(d.get("causal", False)))


# ------------------------------------------------------------------------------------ budgets
def checkpoint_bytes(loaded, interval: int) -> int:
    """One checkpoint of this model: the bytes a capture every `interval` tokens stores, i.e.
    the whole-state of every windowed and recurrent layer plus `interval` rows of every
    full-attention layer's K and V. Measured with mlx-lm's stock caches after a forward of
    `interval` tokens (interval 0 counts as 32)."""
    import mlx.core as mx
    from mlx_lm.models import cache as stock

    n = interval if interval > 0 else 32
    caches = stock.make_prompt_cache(loaded.model)
    loaded.model(mx.array([[100 + (i * 37) % 4000 for i in range(n)]]), cache=caches)
    total = 0
    for c in caches:
        if c is None:
            continue
        if type(c) is stock.KVCache:
            k, v = c.keys, c.values
            total += n * (k.nbytes // k.shape[2] + v.nbytes // v.shape[2])
        elif type(c) is stock.RotatingKVCache:
            rows = min(n, c.max_size)
            total += rows * (c.keys.nbytes // c.keys.shape[2] + c.values.nbytes // c.values.shape[2])
        elif isinstance(c, (stock.CacheList, stock.ChunkedKVCache)):
            total += c.nbytes            # a composite's or a chunked layer's whole state (an upper bound)
        else:
            total += sum(a.nbytes for a in c.cache if a is not None)
    del caches
    return int(total)


def parse_budget(spec, per_ckpt: int) -> int:
    """'123456' or 123456 -> bytes; '8ckpt' -> 8 x checkpoint_bytes; '2.5MiB', '1GB' -> bytes."""
    if isinstance(spec, int):
        return spec
    s = str(spec).strip().lower()
    m = re.fullmatch(r"([0-9.]+)\s*(ckpt|kib|mib|gib|kb|mb|gb|b)?", s)
    if not m:
        raise ValueError(f"budget {spec!r}: expected bytes, '<n>ckpt' or '<n>MiB'")
    x, unit = float(m.group(1)), m.group(2) or "b"
    mult = {"b": 1, "kb": 1000, "mb": 10 ** 6, "gb": 10 ** 9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
            "ckpt": per_ckpt}[unit]
    return int(x * mult)


# ------------------------------------------------------------------------------------ workload
@dataclass
class Conversation:
    system: str | None
    messages: list = field(default_factory=list)      # [(role, content)]
    media: list = field(default_factory=list)         # [(data, dims, length, causal)] for <MEDIA:k>


@dataclass
class Profile:
    """Per-model sizes: SmolLM2 (135M parameters) is ~50x slower per token than the hybrids."""
    max_prompt: int
    max_tokens: tuple
    long_sentences: tuple


PROFILES = {
    "smollm2": Profile(max_prompt=320, max_tokens=(1, 2, 3, 4, 6), long_sentences=(4, 8)),
    "default": Profile(max_prompt=900, max_tokens=(1, 2, 4, 6, 8, 12), long_sentences=(8, 20)),
}

WEIGHTS = {"turn": 26, "new_conv": 7, "switch": 8, "regen": 8, "edit": 8, "rewind": 6, "prefix": 10,
           "media": 9, "long": 6, "squeeze": 6}


class Workload:
    """Deterministic interactive generator for one model's case."""

    def __init__(self, seed: int, tokenizer, model_name: str, ckpt_bytes: int, budget: int):
        self.rng = random.Random(seed)
        self.tok = tokenizer
        self.profile = PROFILES.get(model_name, PROFILES["default"])
        self.ckpt, self.budget = ckpt_bytes, budget
        self.placeholder = tokenizer.token_to_id(PLACEHOLDER_TOKEN)
        self.convs: list[Conversation] = []
        self.cur = -1
        self.history: list = []            # generate ops issued, with their produced tokens
        self.pending_restore: int | None = None
        self.media_pool = [(self.rng.randbytes(16), (self.rng.choice((2, 3, 4)), self.rng.choice((2, 4))))
                           for _ in range(4)]
        self._last_conv_prompt: dict = {}

    # ------------------------------------------------------------ text
    def _question(self) -> str:
        return self.rng.choice(QUESTIONS if self.rng.random() < 0.7 else FOLLOW_UPS)

    def _long(self) -> str:
        lo, hi = self.profile.long_sentences
        k = self.rng.randint(lo, hi)
        return "Please read this and answer the question at the end. " + " ".join(
            self.rng.choice(SENTENCES) for _ in range(k)) + " " + self.rng.choice(QUESTIONS)

    def render(self, conv: Conversation) -> tuple[list, list]:
        """Chat template over the conversation (ending with a generation prompt); media markers
        become placeholder runs with Media items at their positions."""
        msgs = ([{"role": "system", "content": conv.system}] if conv.system else []) + \
               [{"role": r, "content": c} for r, c in conv.messages]
        text = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        tokens, media = self._encode(text, conv)
        self.boundaries = []                           # where each message ends (REFERENCE section 2 step 2)
        for k in range(1, len(msgs) + 1):
            head, _ = self._encode(self.tok.apply_chat_template(msgs[:k], add_generation_prompt=False,
                                                                tokenize=False), conv)
            if 0 < len(head) < len(tokens) and head == tokens[:len(head)]:
                self.boundaries.append(len(head))
        return tokens, media

    def _encode(self, text: str, conv: Conversation) -> tuple[list, list]:
        tokens, media = [], []
        pos = 0
        for m in MEDIA_MARK.finditer(text):
            tokens += self.tok.encode(text[pos:m.start()])
            data, dims, length, causal = conv.media[int(m.group(1))]
            media.append(MediaItem(len(tokens), length, data, dims, causal))
            tokens += [self.placeholder] * length
            pos = m.end()
        tokens += self.tok.encode(text[pos:])
        return tokens, media

    # ------------------------------------------------------------ ops
    def _gen(self, tokens, media, kind: str, max_tokens: int | None = None, conv: int | None = None,
             marks=()) -> dict:
        if max_tokens is None:
            max_tokens = self.rng.choice(self.profile.max_tokens)
            if self.rng.random() < 0.03:
                max_tokens = 0
        cancel = self.rng.randint(0, 3) if self.rng.random() < 0.1 else None
        marks = sorted(set(b for b in marks if b < len(tokens)))
        return {"op": "generate", "tokens": list(map(int, tokens)), "media": [media_to_json(m) for m in media],
                "boundaries": marks, "max_tokens": int(max_tokens), "cancel_after": cancel, "kind": kind,
                "_conv": conv}

    def _new_conv(self) -> int:
        self.convs.append(Conversation(self.rng.choice(SYSTEM_PROMPTS)))
        return len(self.convs) - 1

    def _turn(self, ci: int, content: str, kind: str, media_item=None) -> dict:
        conv = self.convs[ci]
        if media_item is not None:
            conv.media.append(media_item)
            content = content.replace("<MEDIA>", f"<MEDIA:{len(conv.media) - 1}>")
        conv.messages.append(("user", content))
        tokens, media = self.render(conv)
        if len(tokens) > self.profile.max_prompt:      # too long: start over in a new conversation
            conv.messages.pop()
            ci = self._new_conv()
            self.convs[ci].messages.append(("user", self._question()))
            tokens, media = self.render(self.convs[ci])
            kind = "new_conv"
        self.cur = ci
        return self._gen(tokens, media, kind, conv=ci, marks=self.boundaries)

    def next_op(self, counter: int) -> dict:
        """The next operation; `counter` is the engine's paged-out byte count (for squeezes)."""
        if self.pending_restore is not None:
            self.pending_restore -= 1
            if self.pending_restore < 0:
                self.pending_restore = None
                return {"op": "set_budget", "bytes": int(self.budget), "kind": "restore"}
        if not self.convs:
            return self._turn(self._new_conv(), self._question(), "new_conv")
        kinds, weights = zip(*WEIGHTS.items())
        kind = self.rng.choices(kinds, weights)[0]
        if kind == "squeeze" and self.pending_restore is None:
            target = self.rng.choice((0, counter // 2, self.ckpt))
            self.pending_restore = self.rng.randint(0, 3)
            return {"op": "set_budget", "bytes": int(target), "kind": "squeeze"}
        if kind == "new_conv" or kind == "squeeze":
            return self._turn(self._new_conv(), self._question(), "new_conv")
        if kind == "switch" and len(self.convs) > 1:
            ci = self.rng.choice([i for i in range(len(self.convs))[-6:] if i != self.cur])
            return self._turn(ci, self._question(), "switch")
        if kind == "regen" and self.history:
            h = self.history[-1]
            return self._gen(h["tokens"], [media_from_json(m) for m in h["media"]], "regen", conv=h["_conv"],
                             marks=h.get("boundaries", ()))
        if kind == "edit":
            conv = self.convs[self.cur]
            users = [i for i, (r, _) in enumerate(conv.messages) if r == "user"]
            if len(users) >= 2:
                j = self.rng.choice(users[:-1])
                self.convs.append(Conversation(conv.system, list(conv.messages[:j]), list(conv.media)))
                return self._turn(len(self.convs) - 1, self._question(), "edit")
        if kind == "rewind":
            cands = [(ci, i) for ci, c in list(enumerate(self.convs))[-6:] for i, (r, _) in enumerate(c.messages)
                     if r == "user" and i < len(c.messages) - 1]
            if cands:
                ci, i = self.rng.choice(cands)
                old = self.convs[ci]
                self.convs.append(Conversation(old.system, list(old.messages[:i + 1]), list(old.media)))
                self.cur = len(self.convs) - 1
                tokens, media = self.render(self.convs[self.cur])
                return self._gen(tokens, media, "rewind", conv=self.cur, marks=self.boundaries)
        if kind == "prefix":
            cands = [h for h in self.history if len(h["produced"]) >= 2]
            if cands:
                h = self.rng.choice(cands[-8:])
                media = [media_from_json(m) for m in h["media"]]
                if self.rng.random() < 0.5:
                    k = self.rng.randint(1, len(h["produced"]) - 1)
                    return self._gen(h["tokens"], media, "prefix_short", max_tokens=k, conv=None)
                k = self.rng.randint(1, len(h["produced"]) - 1)
                tail = self.tok.encode(" " + self.rng.choice(FOLLOW_UPS))
                return self._gen(h["tokens"] + h["produced"][:k] + tail, media, "prefix_inside", conv=None)
        if kind == "media":
            data, dims = self.rng.choice(self.media_pool)
            length = self.rng.randint(3, 20)
            causal = self.rng.random() < 0.4
            return self._turn(self.cur, "Look at this picture: <MEDIA> " + self._question(), "media",
                              media_item=(data, dims, length, causal))
        if kind == "long":
            return self._turn(self.cur, self._long(), "long")
        return self._turn(self.cur, self._question(), "turn")

    def observe(self, op: dict, produced: list, text: str) -> None:
        """The engine's answer to `op` (a generate): conversations carry the real reply."""
        if op["op"] != "generate":
            return
        self.history.append({**op, "produced": list(produced)})
        self.history = self.history[-32:]
        ci = op.get("_conv")
        if ci is not None and ci < len(self.convs) and op["kind"] != "regen":
            conv = self.convs[ci]
            if conv.messages and conv.messages[-1][0] == "user":
                reply = text.replace("<|im_end|>", "").replace("<|im_start|>", "").strip() or "OK."
                conv.messages.append(("assistant", reply))


def strip_private(op: dict) -> dict:
    return {k: v for k, v in op.items() if not k.startswith("_")}
