"""The exported scripts' checks, one per cause: each asserts only its own bug, on the state it reads
directly (the entries from LRUPromptCache's trie, the fetched cache's layer offsets, the bytes held).

Invariant: a check never infers the stored state from another behaviour a fix may change (issue 50:
an exact hit's empty remainder is not a way to list entries); `checks_for(cause)` gives the three hooks
a script calls (after_fetch, after_change, after_request), the cause's own and no-ops for the rest.
"""
from __future__ import annotations

_NOOP = {
    "after_fetch": "\ndef after_fetch(prompt, count, before, cache):\n    pass\n",
    "after_change": "\ndef after_change(before, new):\n    pass\n",
    "after_request": "\ndef after_request(prompt, gen, logprobs):\n    pass\n",
}

# One check per cause: each asserts only its own bug, on the stored state read from the trie.
CHECKS = {
    "exact-hit-no-seed": {"after_fetch": """
def after_fetch(prompt, count, before, cache):
    \"\"\"C2: a fetch leaves at least one prompt token to evaluate.\"\"\"
    assert count <= len(prompt) - 1, f"C2: resumed at {count} of {len(prompt)} tokens, none left to evaluate"
"""},
    "one-token-prefix": {"after_fetch": """
def after_fetch(prompt, count, before, cache):
    \"\"\"C2: a stored one-token prefix of the prompt serves that token.\"\"\"
    if len(prompt) >= 2 and (prompt[0],) in before:
        assert count >= 1, f"C2: the stored entry {[prompt[0]]} serves 1 token; resumed at {count}"
"""},
    "shallower-restore": {"after_fetch": """
def after_fetch(prompt, count, before, cache):
    \"\"\"C2: resume at the deepest offset some stored entry serves: a stored prefix as is, a trimmable
    entry (anywhere in the trie) at its common prefix with the prompt. (A stored one-token prefix
    and an exact hit are other findings' bugs, left to their scripts.)\"\"\"
    m = len(prompt) - 1
    best, by = 0, None
    for k, e in before.items():
        r = len(k) if common(k, prompt) == len(k) <= m else (
            min(common(k, prompt), m) if can_trim_prompt_cache(e.prompt_cache) else 0)
        if r > best:
            best, by = r, k
    if count <= m and not (len(by or ()) == 1 and by == tuple(prompt[:1])):
        assert count >= best, f"C2: resumed at {count}; the stored entry {list(by)} serves {best}"
"""},
    "bytes-limit-not-passed": {"after_request": """
def after_request(prompt, gen, logprobs):
    \"\"\"E1: at rest the entries hold no more than --prompt-cache-bytes.\"\"\"
    held = sum(sum(c.nbytes for c in e.prompt_cache) for e in stored().values())
    assert held <= LIMIT, f"E1: {held} bytes held at rest; --prompt-cache-bytes {LIMIT}"
"""},
    "fetch-not-a-use": {"after_fetch": """
maybe_used = {}                        # key -> clock of its last possible use (ambiguous fetches too)


def after_fetch(prompt, count, before, cache):
    \"\"\"A fetch that serves tokens from an entry uses it: the entry of length `count`, or else one that
    agrees with the prompt on [0, count) and can be trimmed there (certain when unique).\"\"\"
    if count == 0:
        return
    cands = [k for k, e in before.items() if len(k) >= count and k[:count] == tuple(prompt[:count])
             and (len(k) == count or can_trim_prompt_cache(e.prompt_cache))]
    cands = [k for k in cands if len(k) == count][:1] or cands
    for k in cands:
        maybe_used[k] = clock[0]
    if len(cands) == 1:
        last_used[cands[0]] = clock[0]
""", "after_change": """
def after_change(before, new):
    \"\"\"E3: no entry goes while an entry of its own segment type, certainly used less recently, stays.\"\"\"
    after = stored()
    gone = set(before) - set(after)
    if new is not None and new in after and can_trim_prompt_cache(after[new].prompt_cache):
        gone = {k for k in gone if not (len(k) < len(new) and new[:len(k)] == k)}   # prefixes dropped
    hi = lambda k: max(last_used[k], maybe_used.get(k, 0))
    for g in gone:
        older = [s for s in set(after) - {new} if after[s].cache_type == before[g].cache_type
                 and hi(s) < last_used[g]]
        assert not older, (f"E3: evicted {list(g)} (last used {last_used[g]}) before {list(older[0])} "
                           f"(last used {hi(older[0])}), both {before[g].cache_type}")
"""},
    "trim-partial": {"after_fetch": """
def after_fetch(prompt, count, before, cache):
    \"\"\"C1: the fetched cache stands at `count` in every layer (a layer still holding later tokens
    computes the request on them).\"\"\"
    bad = [(i, c.offset) for i, c in enumerate(cache or []) if isinstance(getattr(c, "offset", None), int)
           and c.offset != count]
    assert not bad, f"C1: served {count} tokens with layers at offsets " + ", ".join(
        f"{o} (layer {i}: {type(cache[i]).__name__})" for i, o in bad)
"""},
    "trim-partial-stored": {"after_request": """
def after_request(prompt, gen, logprobs):
    \"\"\"S2: every stored entry's chunked layers rest at the end of its key.\"\"\"
    for k, e in stored().items():
        bad = [(i, c.offset) for i, c in enumerate(e.prompt_cache) if type(c).__name__ == "ChunkedKVCache"
               and c.offset != len(k)]
        assert not bad, f"S2: an entry of {len(k)} tokens holds chunked layers at offsets {bad}"
"""},
    "draft-behind": {"after_request": """
def after_request(prompt, gen, logprobs):
    \"\"\"S2: every stored entry's draft-model layers rest at the end of its key.\"\"\"
    n = len(model.layers)
    for k, e in stored().items():
        bad = [(i, c.offset) for i, c in enumerate(e.prompt_cache[n:], n) if c.offset != len(k)]
        assert not bad, f"S2: an entry of {len(k)} tokens holds draft layers at offsets {bad}"
"""},
    "speculative-key-ahead": {"after_request": """
def after_request(prompt, gen, logprobs):
    \"\"\"S2: every stored entry's main-model layers rest at the end of its key.\"\"\"
    n = len(model.layers)
    for k, e in stored().items():
        bad = [(i, c.offset) for i, c in enumerate(e.prompt_cache[:n]) if c.offset != len(k)]
        assert not bad, f"S2: an entry of {len(k)} tokens holds main-model layers at offsets {bad}"
"""},
    "entry-not-at-its-end": {"after_request": """
def after_request(prompt, gen, logprobs):
    \"\"\"S2: every stored entry's layers with an offset rest at the end of its key.\"\"\"
    for k, e in stored().items():
        bad = [(i, c.offset) for i, c in enumerate(e.prompt_cache) if isinstance(getattr(c, "offset", None), int)
               and c.offset != len(k)]
        assert not bad, f"S2: an entry of {len(k)} tokens holds layers at offsets {bad}"
"""},
    "count-limit": {"after_request": """
def after_request(prompt, gen, logprobs):
    \"\"\"E1: at rest no more entries than --prompt-cache-size.\"\"\"
    assert len(stored()) <= SIZE, f"E1: {len(stored())} entries at rest; --prompt-cache-size {SIZE}"
"""},
    "counter-drift": {"after_request": """
def after_request(prompt, gen, logprobs):
    \"\"\"A1: the byte counter equals the bytes the stored entries hold.\"\"\"
    held = sum(sum(c.nbytes for c in e.prompt_cache) for e in stored().values())
    assert lru.nbytes == held, f"A1: nbytes {lru.nbytes} != {held} held"
"""},
}
_C1_COLD = """
def after_request(prompt, gen, logprobs):
    \"\"\"C1: the server's logprobs equal a cold prefill's at every generated step (1e-3: far above
    float32 noise on these tiny models).\"\"\"
    if logprobs is None:                 # served by _serve_single: its queue carries no logprob vectors
        return
    logits = model(mx.array([list(prompt) + list(gen[:-1])]), cache=make_prompt_cache(model))[0]
    cold = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    for i, lp in enumerate(logprobs):
        diff = float(mx.abs(lp - cold[len(prompt) - 1 + i]).max())
        assert diff <= 1e-3, f"C1: step {i}: max |logprob - cold| = {diff}"
"""
for _c in ("restore-differs", "batch-differs", "generate-differs"):
    CHECKS[_c] = {"after_request": _C1_COLD}


def checks_for(cause: str) -> str:
    own = CHECKS.get(cause, {})
    return "".join(own.get(k, v) for k, v in _NOOP.items())
