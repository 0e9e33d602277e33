"""A five-turn chat with SmolLM2-135M-Instruct through its chat template (chat messages in, text out).

- The text is sensible where a 135M model is reliable: the capital of France is Paris, of Germany
  Berlin; every answer is non-empty text that ends at the end-of-turn token.
- Turns 2-5 prefill only what is new: the prompt re-renders the whole conversation, and everything up
  to the previous answer is cached, so stats.prefilled <= (tokens of the prompt not in the previous
  prompt + answer) + 1.
- The last turn's first logits equal a cold run's (C1, stock mlx-lm caches).
"""
from __future__ import annotations

from impl.engine import Engine
from test_engine_support import TOL, cold_stock, max_abs

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


def test_five_turn_chat_prefills_only_new_tokens(smollm2):
    lm, tok = smollm2, smollm2.tokenizer
    e = Engine(lm, check_rules=True)
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
    cold = cold_stock(lm, prompt, 1)
    assert max_abs(r.first_logits, cold.first_logits) <= TOL["smollm2"]
    assert cold.tokens == r.tokens[:1]
