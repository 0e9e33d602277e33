"""A finding as a standalone script a maintainer can paste into an mlx-lm issue.

Invariants of every exported script:
- it imports only mlx and mlx-lm's public API (`mlx_lm.models.<arch>`, `mlx_lm.models.cache`,
  `mlx_lm.generate.BatchGenerator`), builds one of mlx-lm's model classes small from a literal config,
  and serves the finding's requests with mlx_lm.server's calls (batched path);
- it learns what the cache holds only through public calls: `fetch_nearest_cache(key, k)` returns an
  empty remainder exactly when `k` is stored (a fetch changes nothing in the cache), `nbytes`, and
  `can_trim_prompt_cache` on the caches it inserted;
- it raises AssertionError naming the rule when the violation happens (on the version it was found
  on), and prints "no violation" and exits 0 when it does not (fixed).
"""
from __future__ import annotations

import pprint

from targets.mlx_lm import models
from targets.mlx_lm.rules import CAUSES, quote

HEAD = '''"""{title}

mlx-lm {version}. Rule {rule}: {rule_text}
Responsible: {module}.{function}, line {line}:
    {text}
{why}

The calls below are mlx_lm.server's for sequential requests on the batched path
(ResponseGenerator._generate): fetch_nearest_cache, BatchGenerator.insert_segments, insert_cache at
each end of segment and at the finish{trim_note}. Generated tokens are forced by the sampler.
Found and shrunk by prefix-trie-mlx (targets/mlx_lm).
"""
import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.models import {arch} as arch
from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, make_prompt_cache

CONFIG = {config}
mx.random.seed({seed})
model = arch.Model(arch.ModelArgs.from_dict(CONFIG))
model.set_dtype(mx.float32)
mx.eval(model.parameters())

KEY = ("default_model", None, None)
SIZE, LIMIT = {size}, {limit}          # --prompt-cache-size, --prompt-cache-bytes
lru = LRUPromptCache(SIZE)             # as mlx_lm.server.run builds it
bg = BatchGenerator(model, completion_batch_size=32, prefill_batch_size=8, prefill_step_size=2048)
inserted = {{}}                         # key -> (caches, segment type), every insert_cache call made
last_used = {{}}                        # key -> clock of its last insert or serving fetch
clock = [0]


def stored():
    """Keys the cache holds now, by public calls only (an exact hit leaves nothing to evaluate)."""
    return {{k for k in inserted if lru.fetch_nearest_cache(KEY, list(k))[1] == []}}


def insert(tokens, cache, cache_type):
    before = stored()
    lru.insert_cache(KEY, tokens, cache, cache_type=cache_type)
    clock[0] += 1
    inserted[tuple(tokens)] = (cache, cache_type)
    last_used[tuple(tokens)] = clock[0]
    after_change(before, tuple(tokens))


def serve(prompt, gen, chat=False, sys_len=0):
    if not chat:
        segments, types = [list(prompt)], ["assistant"]
    else:
        segments, types = [], []
        if 0 < sys_len < len(prompt):
            segments, types = [list(prompt[:sys_len])], ["system"]
        segments.append(list(prompt[sys_len if 0 < sys_len < len(prompt) else 0:]))
        types.append("user")
    clock[0] += 1
    before = stored()
    cache, rest = lru.fetch_nearest_cache(KEY, list(prompt))
    count = len(prompt) - len(rest)
    after_fetch(prompt, count, before)
    n = count
    while n > 0:
        if n >= len(segments[0]):
            n -= len(segments.pop(0))
            types.pop(0)
        else:
            segments[0] = segments[0][n:]
            break
    forced = iter(gen)
    (uid,) = bg.insert_segments(segments=[segments], max_tokens=[len(gen)], caches=[cache],
                                all_tokens=[list(prompt[:count])],
                                samplers=[lambda lp: mx.array([next(forced, 0)], dtype=mx.uint32)])
    if LIMIT is not None:
        before = stored()
        lru.trim_to(n_bytes=LIMIT - bg.prompt_cache_nbytes)
        after_change(before, None)
    types, logprobs = types[::-1], []
    while True:
        prompt_responses, gen_responses = bg.next()
        eos = [r.uid for r in prompt_responses if r.end_of_segment and not r.end_of_prompt and types]
        for _, (c, cache_key) in bg.extract_cache(eos).items():
            insert(cache_key[:], c, types.pop())
        for r in gen_responses:
            logprobs.append(r.logprobs)
            if r.finish_reason is not None:
                insert(r.all_tokens[:], r.prompt_cache, "assistant")
                after_request(prompt, gen, logprobs)
                return


def common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n

'''

CHECKS = {
    "C2": '''
def after_fetch(prompt, count, before):
    """C2: resume at the deepest offset a stored entry serves (a stored prefix as is, a trimmable entry
    at its common prefix), never past len(prompt) - 1."""
    m = len(prompt) - 1
    assert count <= m, f"C2: resumed at {count} of {len(prompt)} tokens, none left to evaluate"
    best = max([0] + [len(k) if common(k, prompt) == len(k) <= m else
                      (min(common(k, prompt), m) if can_trim_prompt_cache(inserted[k][0]) else 0)
                      for k in before])
    assert count >= best, f"C2: resumed at {count}; a stored entry serves {best}"


def after_change(before, new):
    pass


def after_request(prompt, gen, logprobs):
    pass
''',
    "E1": '''
def after_fetch(prompt, count, before):
    pass


def after_change(before, new):
    pass


def after_request(prompt, gen, logprobs):
    """E1: at rest the entries hold no more than --prompt-cache-bytes."""
    assert lru.nbytes <= LIMIT, f"E1: {lru.nbytes} bytes held at rest; --prompt-cache-bytes {LIMIT}"
''',
    "E3": '''
maybe_used = {}                        # key -> clock of its last possible use (ambiguous fetches too)


def after_fetch(prompt, count, before):
    """A fetch that serves tokens from an entry uses it. The entry is the one of length `count`, or
    else one that agrees with the prompt on [0, count) and can be trimmed there (certain when unique)."""
    if count == 0:
        return
    cands = [k for k in before if len(k) >= count and k[:count] == tuple(prompt[:count])
             and (len(k) == count or can_trim_prompt_cache(inserted[k][0]))]
    exact = [k for k in cands if len(k) == count]
    cands = exact[:1] or cands
    for k in cands:
        maybe_used[k] = clock[0]
    if len(cands) == 1:
        last_used[cands[0]] = clock[0]


def after_change(before, new):
    """E3: no entry goes while an entry of its own segment type, certainly used less recently, stays."""
    after = stored()
    gone = before - after
    if new is not None and can_trim_prompt_cache(inserted[new][0]):
        gone = {k for k in gone if not (len(k) < len(new) and new[:len(k)] == k)}   # prefixes dropped
    hi = lambda k: max(last_used[k], maybe_used.get(k, 0))
    for g in gone:
        older = [s for s in after - {new} if inserted[s][1] == inserted[g][1] and hi(s) < last_used[g]]
        assert not older, (f"E3: evicted {list(g)} (last used {last_used[g]}) before {list(older[0])} "
                           f"(last used {hi(older[0])}), both {inserted[g][1]}")


def after_request(prompt, gen, logprobs):
    pass
''',
    "C1": '''
def after_fetch(prompt, count, before):
    pass


def after_change(before, new):
    pass


def after_request(prompt, gen, logprobs):
    """C1: the server's logprobs equal a cold prefill's at every generated step."""
    logits = model(mx.array([list(prompt) + list(gen[:-1])]), cache=make_prompt_cache(model))[0]
    cold = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    for i, lp in enumerate(logprobs):
        diff = float(mx.abs(lp - cold[len(prompt) - 1 + i]).max())
        assert diff <= 1e-3, f"C1: step {i}: max |logprob - cold| = {diff}"
''',
    "A1": '''
def after_fetch(prompt, count, before):
    pass


def after_change(before, new):
    pass


def after_request(prompt, gen, logprobs):
    """A1: the byte counter equals the bytes the stored entries hold."""
    held = sum(sum(c.nbytes for c in inserted[k][0]) for k in stored())
    assert lru.nbytes == held, f"A1: nbytes {lru.nbytes} != {held} held"
''',
}

TAIL = '''
REQUESTS = {requests}        # [prompt, generated tokens, chat?, system prompt length]
for prompt, gen, chat, sys_len in REQUESTS:
    serve(prompt, gen, chat, sys_len)
print("no violation")
'''

RULE_TEXT = {
    "C1": "a restored cache must give the same logprobs as a cold prefill of the same tokens",
    "C2": "the fetch resumes at the deepest offset a stored entry can serve, leaving >= 1 token",
    "E1": "the bytes held at rest stay within --prompt-cache-bytes",
    "E3": "the least recently used entry is evicted first (a fetch is a use)",
    "A1": "the byte counter equals the bytes the entries hold",
    "S2": "a stored entry's cache rests at the end of its key",
    "T1": "the trie's nodes link up: each starts where its parent ends",
    "T2": "no two children of a node share a first token",
}


def export(finding: dict, version: str) -> str:
    c = CAUSES[finding["cause"]]
    _, line, text = quote(c)
    p = finding["program"]
    cfg = dict(models.CONFIGS[p["model"]])
    arch = cfg["model_type"]
    head = HEAD.format(title=f"LRUPromptCache: {finding['rule']} violation ({finding['cause']})",
                       version=version, rule=finding["rule"], rule_text=RULE_TEXT[finding["rule"]],
                       module=c.module, function=c.function, line=line, text=text, why=_wrap(c.why),
                       trim_note=", trim_to when --prompt-cache-bytes is set", arch=arch,
                       config=pprint.pformat(cfg, width=100, compact=True), seed=models.SEED, size=p["prompt_cache_size"],
                       limit=p["prompt_cache_bytes"])
    return head + CHECKS[finding["rule"]] + TAIL.format(requests=repr(p["ops"]))


def _wrap(s: str, width: int = 100) -> str:
    words, lines, cur = s.split(), [], ""
    for w in words:
        if len(cur) + len(w) + 1 > width:
            lines.append(cur)
            cur = w
        else:
            cur = (cur + " " + w).strip()
    return "\n".join(lines + [cur])
