"""A five-turn chat with SmolLM2-135M-Instruct through its chat template (chat messages in, text out).

- The text is sensible where a 135M model is reliable: the capital of France is Paris, of Germany
  Berlin; every answer is non-empty text that ends at the end-of-turn token.
- Turns 2-5 prefill only what is new: the prompt re-renders the whole conversation, and everything up
  to the previous answer is cached, so stats.prefilled <= (tokens of the prompt not in the previous
  prompt + answer) + 1.
- The last turn passes C1 (test_engine_support.assert_c1; the engine is `judged`: its first logits
  equal, bit for bit, a same-schedule replay on mlx-lm's stock caches where such replays are exact on
  this backend, else lie within the calibrated tolerance of a cold run on the stock caches).
"""
from __future__ import annotations

from impl.engine import Engine
from impl.models import load
from test_engine_support import assert_c1, judged

QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("And what is the capital of Germany?", "Berlin"),
    ("Which of the two cities is larger?", None),
    ("Name one famous museum in the first city.", None),
    ("Thank you! Say goodbye in French.", None),
]


def common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_five_turn_chat_prefills_only_new_tokens():
    """Float32 SmolLM2, whose answers the expectations name (in bfloat16 stock mlx-lm's forward answers the
    first question with "L'Étoile, ..." as ours does)."""
    lm = load("smollm2", "float32")
    tok = lm.tokenizer
    e = judged(Engine(lm, check_rules=True))
    messages, seen = [], None
    for turn, (question, expect) in enumerate(QUESTIONS, 1):
        messages.append({"role": "user", "content": question})
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
        r = e.generate(messages, max_tokens=40)
        answer = tok.decode(r.tokens, skip_special_tokens=True).strip()
        assert answer and r.tokens[-1] == tok.eos_token_id, (turn, r.text)
        if expect:
            assert expect in answer, (turn, answer)
        if seen is not None:
            lcp = common_prefix(seen, prompt)
            assert lcp == len(seen), "the template re-renders the previous prompt and answer token for token"
            new = len(prompt) - lcp
            assert r.stats.prefilled <= new + 1, (turn, r.stats, new)
            assert r.stats.resumed == len(seen) - 1, (turn, r.stats, len(seen))   # all but the unfed last token
        seen = prompt + r.tokens
        messages.append({"role": "assistant", "content": answer})
    assert_c1(lm, prompt, [], r, what="the last turn")
