"""A finding as a standalone script a maintainer can paste into an mlx-lm issue.

Invariants of every exported script:
- it imports only mlx and mlx-lm (`mlx_lm.models.<arch>`, `mlx_lm.models.cache`, `mlx_lm.generate`,
  `mlx_lm.server` for server.run's construction of the cache), builds mlx-lm's model classes small
  from literal configs, and serves the finding's requests with mlx_lm.server's calls, on the path the
  server chooses for each (batched, or _serve_single's);
- it tests ONE bug: the check is its cause's (CHECKS), and it reads the state it judges directly --
  the entries from the cache's trie (LRUPromptCache._trie), the fetched cache's layer offsets --
  never inferring it from another behaviour a fix may change (an exact hit's empty remainder);
- it raises AssertionError naming the rule when the violation happens (on the version it was found
  on), and prints "no violation" and exits 0 when it does not (fixed). docs/peers.md's one-bug table:
  each hand-fixed copy of mlx-lm makes its own finding's script pass and leaves the others failing.
"""
from __future__ import annotations

import pprint

from targets.mlx_lm import models
from targets.mlx_lm.export_checks import CHECKS, checks_for  # noqa: F401
from targets.mlx_lm.rules import CAUSES, quote

HEAD = '''"""{title}

mlx-lm {version}. Rule {rule}: {rule_text}
Responsible: {module}.{function}, line {line}:
    {text}
{why}

The calls below are mlx_lm.server's, request after request, on the path the server chooses
(ResponseGenerator._generate): batched (fetch_nearest_cache, BatchGenerator.insert_segments, trim_to
when --prompt-cache-bytes is set, insert_cache at each end of segment and at the finish) unless the
request has a seed, --kv-bits is set, a draft model is loaded or the caches cannot merge; then
_serve_single run by calling the server's own ResponseGenerator._serve_single (greedy, the server's default). The
cache is built by server.run's own statement, read from the installed mlx_lm/server.py. On the
batched path generated tokens are forced by the sampler. What the cache holds is read from its trie directly
(LRUPromptCache._trie), never inferred from how it answers a fetch.
Found and shrunk by prefix-trie-mlx (targets/mlx_lm).
"""
import ast
import inspect
import queue
from types import SimpleNamespace

import mlx.core as mx
import mlx_lm.server as server
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, make_prompt_cache
from mlx_lm.tokenizer_utils import TokenizerWrapper


def build(config, seed):
    import importlib
    arch = importlib.import_module("mlx_lm.models." + config["model_type"])
    mx.random.seed(seed)
    m = arch.Model(arch.ModelArgs.from_dict(config))
    m.set_dtype(mx.float32)
    mx.eval(m.parameters())
    return m


CONFIG = {config}
model = build(CONFIG, {seed})
DRAFT_CONFIG = {draft_config}
draft_model = None if DRAFT_CONFIG is None else build(DRAFT_CONFIG, {seed})

KEY = ("default_model", None, None)
SIZE, LIMIT = {size}, {limit}          # --prompt-cache-size, --prompt-cache-bytes
KV_BITS, QUANTIZED_KV_START = {kv_bits}, {qstart}       # --kv-bits, --quantized-kv-start


def server_cache():
    """The prompt cache as server.run builds it: its own assignment, read from the installed source."""
    tree = ast.parse(inspect.getsource(server.run).lstrip())
    stmt = next(n for n in ast.walk(tree) if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "prompt_cache" for t in n.targets))
    ns = {{"LRUPromptCache": LRUPromptCache, "model_provider": SimpleNamespace(cli_args=SimpleNamespace(
        prompt_cache_size=SIZE, prompt_cache_bytes=LIMIT))}}
    exec(compile(ast.Module([stmt], []), "server.run", "exec"), ns)
    return ns["prompt_cache"]


lru = server_cache()
# ModelProvider._load: batchable when there is no draft model and every layer cache can merge
BATCHABLE = draft_model is None and all(hasattr(c, "merge") for c in make_prompt_cache(model))
bg = [None]
last_used = {{}}                        # key -> clock of its last insert or serving fetch
clock = [0]


def stored():
    """The entries the cache holds now, read from its trie: key -> CacheEntry."""
    out, stack = {{}}, [((), lru._trie._trie.get(KEY, {{}}))]
    while stack:
        keys, node = stack.pop()
        for tok, child in node.items():
            if tok == "__value__":
                out[keys] = child
            else:
                stack.append((keys + (tok,), child))
    return out


_fetch, _insert, _trim_to = lru.fetch_nearest_cache, lru.insert_cache, lru.trim_to


def fetch_observed(model_key, tokens):
    """The cache's own fetch, observed: the state before it and the cache it hands out are checked."""
    clock[0] += 1
    before = stored()
    cache, rest = _fetch(model_key, tokens)
    after_fetch(list(tokens), len(tokens) - len(rest), before, cache)
    return cache, rest


def insert_observed(model_key, tokens, cache, *, cache_type="assistant"):
    before = stored()
    _insert(model_key, tokens, cache, cache_type=cache_type)
    clock[0] += 1
    last_used[tuple(tokens)] = clock[0]
    after_change(before, tuple(tokens))


def trim_to_observed(**kw):
    before = stored()
    _trim_to(**kw)
    after_change(before, None)


# observation only: each wrapper calls the cache's own method unchanged
lru.fetch_nearest_cache, lru.insert_cache, lru.trim_to = fetch_observed, insert_observed, trim_to_observed


class Tokenizer(TokenizerWrapper):
    """Token ids as text; no chat template, no end-of-sequence token."""
    _tokenizer = None
    has_thinking = has_tool_calling = has_chat_template = False
    tool_parser = think_start = think_end = response_initial_state = None
    structural_markers, response_transitions = [], {{}}

    def __init__(self):
        pass

    detokenizer = property(lambda self: SimpleNamespace(add_token=lambda t: None, finalize=lambda: None,
                                                        reset=lambda: None, last_segment=""))
    eos_token_ids = property(lambda self: set())

    def encode(self, text, add_special_tokens=True):
        return [int(t) for t in text.split()]


def response_generator():
    """mlx_lm.server's ResponseGenerator around this cache, its generation thread not started:
    _serve_single is called directly, on this thread."""
    provider = SimpleNamespace(
        model=model, tokenizer=Tokenizer(), draft_model=draft_model, processor=None,
        model_key=KEY, is_batchable=BATCHABLE,
        cli_args=SimpleNamespace(prompt_cache_size=SIZE, prompt_cache_bytes=LIMIT, prefill_step_size=2048,
                                 kv_bits=KV_BITS, kv_group_size=64, quantized_kv_start=QUANTIZED_KV_START,
                                 num_draft_tokens=3, chat_template_args={{}}, decode_concurrency=32,
                                 prompt_concurrency=8, pipeline=False))
    rg = server.ResponseGenerator.__new__(server.ResponseGenerator)
    rg.model_provider, rg.prompt_cache, rg._state_machine_cache, rg._is_distributed = provider, lru, {{}}, False
    return rg


rg = response_generator()


def serve_single(prompt, max_tokens, seed):
    """ResponseGenerator._serve_single itself (greedy, temperature 0, as the server's default)."""
    q = queue.Queue()
    request = server.CompletionRequest("text", " ".join(map(str, prompt)), [], None, None)
    args = server.GenerationArguments(
        model=server.ModelDescription(model="default_model", draft=None, adapter=None),
        sampling=server.SamplingArguments(0.0, 1.0, 0, 0.0, 0.0, 0.0),
        logits=server.LogitsProcessorArguments(None, 0.0, 20, 0.0, 20, 0.0, 20),
        stop_words=[], max_tokens=max_tokens, num_draft_tokens=3, logprobs=False, top_logprobs=0,
        seed=seed, chat_template_kwargs=None)
    rg._serve_single((q, request, args), mx.default_stream(mx.default_device()))
    out = []
    while not q.empty():
        out.append(q.get())
    failed = [o for o in out if isinstance(o, Exception)]
    if failed and isinstance(failed[0], AssertionError):            # a check of ours, inside the fetch
        raise failed[0]
    if failed:
        print(f"request failed: {{type(failed[0]).__name__}}: {{failed[0]}}")     # the server goes on
        return
    after_request(prompt, [o.token for o in out if hasattr(o, "token")], None)


def serve(prompt, gen, chat=False, sys_len=0, seed=None):
    if not (BATCHABLE and seed is None and KV_BITS is None):        # ResponseGenerator._generate's test
        if bg[0] is not None:                                        # drain_batch: the batch is closed
            bg[0].close()
            bg[0] = None
        return serve_single(prompt, len(gen), seed)
    if not chat:
        segments, types = [list(prompt)], ["assistant"]
    else:
        segments, types = [], []
        if 0 < sys_len < len(prompt):
            segments, types = [list(prompt[:sys_len])], ["system"]
        segments.append(list(prompt[sys_len if 0 < sys_len < len(prompt) else 0:]))
        types.append("user")
    cache, rest = lru.fetch_nearest_cache(KEY, list(prompt))
    count = len(prompt) - len(rest)
    n = count
    while n > 0:
        if n >= len(segments[0]):
            n -= len(segments.pop(0))
            types.pop(0)
        else:
            segments[0] = segments[0][n:]
            break
    forced = iter(gen)
    sampler = lambda lp: mx.array([next(forced, 0)], dtype=mx.uint32)
    if bg[0] is None:
        bg[0] = BatchGenerator(model, completion_batch_size=32, prefill_batch_size=8, prefill_step_size=2048)
    (uid,) = bg[0].insert_segments(segments=[segments], max_tokens=[len(gen)], caches=[cache],
                                   all_tokens=[list(prompt[:count])], samplers=[sampler])
    if LIMIT is not None:
        lru.trim_to(n_bytes=LIMIT - bg[0].prompt_cache_nbytes)
    types, logprobs = types[::-1], []
    while True:
        prompt_responses, gen_responses = bg[0].next()
        eos = [r.uid for r in prompt_responses if r.end_of_segment and not r.end_of_prompt and types]
        for _, (c, cache_key) in bg[0].extract_cache(eos).items():
            lru.insert_cache(KEY, cache_key[:], c, cache_type=types.pop())
        for r in gen_responses:
            logprobs.append(r.logprobs)
            if r.finish_reason is not None:
                lru.insert_cache(KEY, r.all_tokens[:], r.prompt_cache, cache_type="assistant")
                after_request(prompt, gen, logprobs)
                return


def common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n

'''

TAIL = '''
REQUESTS = {requests}        # [prompt, generated tokens, chat?, system prompt length(, seed)]
for op in REQUESTS:
    serve(*op)
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
    draft = p.get("draft")
    head = HEAD.format(title=f"mlx_lm.server's prompt cache: {finding['rule']} violation ({finding['cause']})",
                       version=version, rule=finding["rule"], rule_text=RULE_TEXT[finding["rule"]],
                       module=c.module, function=c.function, line=line, text=text, why=_wrap(c.why),
                       config=pprint.pformat(models.CONFIGS[p["model"]], width=100, compact=True),
                       draft_config=None if draft is None else pprint.pformat(models.CONFIGS[draft], width=100,
                                                                               compact=True),
                       seed=models.SEED, size=p["prompt_cache_size"], limit=p["prompt_cache_bytes"],
                       kv_bits=p.get("kv_bits"), qstart=p.get("quantized_kv_start", 5000))
    return head + checks_for(finding["cause"]) + TAIL.format(requests=repr(p["ops"]))


def _wrap(s: str, width: int = 100) -> str:
    words, lines, cur = s.split(), [], ""
    for w in words:
        if len(cur) + len(w) + 1 > width:
            lines.append(cur)
            cur = w
        else:
            cur = (cur + " " + w).strip()
    return "\n".join(lines + [cur])
