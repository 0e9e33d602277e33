"""Writes the hand-written corpus cases for the seed's historical scenarios (fuzz/corpus/*.json).

    python -m fuzz.make_corpus

Each case is concrete (token ids), built here from real text through the chat template; replies in
the long conversation are the model's own greedy answers (deterministic), so the next turn's prompt
contains stored generated tokens, as in a real chat.
"""
from __future__ import annotations

import json
from pathlib import Path

from impl.engine import Engine
from impl.models import load

from .cases import make_case

CORPUS = Path(__file__).parent / "corpus"
ENGINE = {"budget": 1 << 40, "budget_spec": str(1 << 40), "chunk_size": 16, "capture_interval": 32, "near_end": 4}


def gen(tokens, max_tokens, kind, cancel_after=None):
    return {"op": "generate", "tokens": list(map(int, tokens)), "media": [], "max_tokens": max_tokens,
            "cancel_after": cancel_after, "kind": kind}


def chat(tok, *msgs):
    roles = ["user", "assistant"]
    return tok.apply_chat_template([{"role": roles[i % 2], "content": m} for i, m in enumerate(msgs)])


def prefix_response_hybrid(name="qwen3next"):
    """S3: a response that is a prefix of a stored one on a hybrid. The second request's close lands
    on a head split off the stored edge (KV halves only, S4); page-out must capture the missing
    recurrent state, so the third request, which continues from inside the stored response,
    resumes exactly there and matches a cold run."""
    lm = load(name)
    tok = lm.tokenizer
    p = chat(tok, "What is the capital of France?")
    eng = Engine(lm, 1 << 40, chunk_size=16, capture_interval=32)
    produced = eng.generate(p, max_tokens=8, stop_at_eos=False).tokens
    more = tok.encode(" Tell me more about it.")
    ops = [gen(p, 8, "turn"), gen(p, 3, "prefix_short"), gen(p + produced[:3] + more, 4, "prefix_inside"),
           gen(p, 2, "prefix_short"), gen(p + produced[:2] + more, 4, "prefix_inside"), gen(p, 8, "regen")]
    return make_case(name, ENGINE, ops, description=prefix_response_hybrid.__doc__, expect="pass")


def resume_inside_edge_then_evict():
    """P1/G1/E5: resume inside an edge (an edited turn diverges inside the stored prompt), then
    squeeze the budget so that eviction takes the split-off tail and merges what is left, then
    resume there again and re-request the original. Pure attention (SmolLM2) so every layer can
    rewind into the edge and P1 splits at the live offset."""
    lm = load("smollm2")
    tok = lm.tokenizer
    a = chat(tok, "Why is the sky blue during the day and red at sunset?")
    b = chat(tok, "Why is the sea salty?")
    c = chat(tok, "Why is the grass green?")
    ops = [gen(a, 2, "turn"), gen(b, 2, "edit"), {"op": "set_budget", "bytes": 0, "kind": "squeeze"},
           gen(c, 2, "edit"), {"op": "set_budget", "bytes": "4ckpt", "kind": "squeeze"}, gen(b, 2, "rewind"),
           {"op": "set_budget", "bytes": 1 << 40, "kind": "restore"}, gen(a, 2, "rewind")]
    return make_case("smollm2", ENGINE, ops, description=resume_inside_edge_then_evict.__doc__, expect="pass")


def long_conversation_over_budget(name="qwen3next", turns=24):
    """E1/E2 (the seed's 50-turn table, small): the same short question every turn of one
    conversation, replies carried over, budget 1.5 checkpoints. The conversation's own turn
    checkpoints must be evicted (only root, frontier and branch points are protected), so paged-out
    bytes stay within the budget at every step while every turn still matches a cold run."""
    lm = load(name)
    tok = lm.tokenizer
    eng = Engine(lm, 1 << 40, chunk_size=16, capture_interval=32)
    msgs, ops = [], []
    for _ in range(turns):
        msgs.append("What time is it?")
        p = chat(tok, *msgs)
        r = eng.generate(p, max_tokens=4)
        ops.append(gen(p, 4, "turn"))
        msgs.append(r.text.replace("<|im_end|>", "").strip() or "OK.")
    engine = {**ENGINE, "budget_spec": "1.5ckpt"}
    return make_case(name, engine, ops, description=long_conversation_over_budget.__doc__, expect="pass")


def windowed_live_resume_after_one_token():
    """C1 on gemma3 (windowed layers), found by the campaign (seed 1): a request with max_tokens=1
    leaves the live caches at the end of its prompt after a single-token (in-place, rotating) write;
    the next turn extends exactly that prompt, so begin resumes from the live caches with
    restore(None, offset). WindowedCache.restore(None, t) sets the ring index to t even when t is
    the current offset, so after a rotating write the window is read in the wrong order and the
    next forward's logits differed from a cold run by ~1.5-3.4. Fixed in 4727b7f (a no-op rewind no
    longer resets the ring index); kept as a regression case."""
    lm = load("gemma3")
    tok = lm.tokenizer
    p = chat(tok, "Why do cats purr?")
    more = tok.encode("They are happy.<|im_end|>\n<|im_start|>user\nPlease give me an example.<|im_end|>\n"
                      "<|im_start|>assistant\n")
    ops = [gen(p, 1, "turn"), gen(p + more, 4, "turn")]
    return make_case("gemma3", ENGINE, ops, description=windowed_live_resume_after_one_token.__doc__,
                     expect="pass")


def main() -> None:
    CORPUS.mkdir(exist_ok=True)
    for fn, name in ((prefix_response_hybrid, "hist-prefix-response-hybrid.json"),
                     (resume_inside_edge_then_evict, "hist-resume-inside-edge-evict.json"),
                     (long_conversation_over_budget, "hist-long-conversation-over-budget.json"),
                     (windowed_live_resume_after_one_token, "found-gemma3-windowed-live-resume.json")):
        case = fn()
        (CORPUS / name).write_text(json.dumps(case, indent=1))
        print(CORPUS / name, len(case["requests"]), "operations")


if __name__ == "__main__":
    main()
