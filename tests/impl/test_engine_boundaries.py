"""Message boundaries (REFERENCE section 2 step 2) and the revised P2 on a hybrid model (qwen3next:
gated-delta recurrent layers beside full attention), through the Engine with every rule checked.

- A chat's messages end where the template of the first k messages ends; each end becomes a user
  capture, so another conversation on the same system prompt resumes at the system prompt's end,
  not at 0 (before: the nearest interval checkpoint, or nothing).
- A regenerated answer resumes at the match: the branch-point capture of the first regeneration
  survives compaction (P2 revised, C2).
- A token-id prompt names its boundaries itself; bad ones are refused and change nothing.
"""
from __future__ import annotations

import pytest

from impl.engine import Engine
from impl.media import BadRequest
from impl.models import load
from impl.view import view

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one short sentence, and never "
                                       "add a greeting or a closing remark of any kind."}


@pytest.fixture(scope="module")
def hybrid():
    return load("qwen3next")


def engine(lm) -> Engine:
    return Engine(lm, capture_interval=1 << 20, near_end=0, check_rules=True)


def test_boundaries_are_where_messages_end_and_contents_start(hybrid):
    e = engine(hybrid)
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    tokens = e.tokens_of(msgs)
    render = hybrid.tokenizer.apply_chat_template
    ends = [len(render(msgs[:k], add_generation_prompt=False)) for k in (1, 2)]
    user_header = len(render(msgs[:1] + [{"role": "user", "content": ""}], add_generation_prompt=False)) - 2
    starts = [3, user_header]                 # after "<|im_start|>system\n" and "<|im_start|>user\n"
    assert e.boundaries_of(msgs, tokens) == tuple(sorted(ends + starts))
    assert hybrid.tokenizer.decode(tokens[user_header:user_header + 1]) == "hi"
    assert ends[-1] < len(tokens)                       # the generation prompt follows the last message


def test_a_new_conversation_resumes_where_it_diverges_from_the_shared_system_prompt(hybrid):
    e = engine(hybrid)
    render = hybrid.tokenizer.apply_chat_template
    system_end = len(render([SYSTEM], add_generation_prompt=False))
    e.generate([SYSTEM, {"role": "user", "content": "Name a colour."}], max_tokens=3, stop_at_eos=False)
    r = e.generate([SYSTEM, {"role": "user", "content": "What is two plus two?"}], max_tokens=3, stop_at_eos=False)
    assert r.stats.resumed == r.stats.matched, r.stats       # the content start of the user message: no re-prefill
    assert system_end < r.stats.resumed <= system_end + 3, r.stats   # just past the shared "<|im_start|>user\n"


def test_without_boundaries_the_same_conversation_resumes_at_zero(hybrid):
    """The control: token ids without boundaries leave no checkpoint at the system prompt's end."""
    e = engine(hybrid)
    a = e.tokens_of([SYSTEM, {"role": "user", "content": "Name a colour."}])
    b = e.tokens_of([SYSTEM, {"role": "user", "content": "What is two plus two?"}])
    e.generate(a, max_tokens=3, stop_at_eos=False)
    r = e.generate(b, max_tokens=3, stop_at_eos=False)
    assert r.stats.resumed == 0 and r.stats.matched > 0, r.stats


def test_token_prompts_name_their_boundaries(hybrid):
    e = engine(hybrid)
    a = e.tokens_of([SYSTEM, {"role": "user", "content": "Name a colour."}])
    b = e.tokens_of([SYSTEM, {"role": "user", "content": "What is two plus two?"}])
    cut = len(hybrid.tokenizer.apply_chat_template([SYSTEM], add_generation_prompt=False))
    e.generate(a, max_tokens=3, stop_at_eos=False, boundaries=[cut])
    r = e.generate(b, max_tokens=3, stop_at_eos=False)
    assert r.stats.resumed == cut, r.stats


def test_a_regenerated_answer_resumes_at_the_match(hybrid):
    e = engine(hybrid)
    msgs = [SYSTEM, {"role": "user", "content": "Say a number."}]
    n = len(e.tokens_of(msgs))
    for i in range(3):                                  # three different answers to the same prompt
        r = e.generate(msgs, max_tokens=3, stop_at_eos=False,
                       sampler=lambda logits, k=iter(range(7 + 10 * i, 99)): next(k))
    assert r.stats.matched == n - 1 and r.stats.resumed == n - 1, r.stats


@pytest.mark.parametrize("bad", [[0], [-1], [10 ** 6], ["3"], [True], 5, "12"])
def test_bad_boundaries_are_refused_and_change_nothing(hybrid, bad):
    e = engine(hybrid)
    e.generate([SYSTEM, {"role": "user", "content": "hi"}], max_tokens=2)
    before = (view(e.pc), e.pc.counter, e.pc.offset)
    with pytest.raises(BadRequest, match="boundar"):
        e.generate([1, 2, 3, 4], max_tokens=2, boundaries=bad)
    assert (view(e.pc), e.pc.counter, e.pc.offset) == before
