"""The adapter is faithful: mlx_lm.server's own ResponseGenerator (its generation thread, its
_tokenize, its batched branch), given a stub model provider (a small model, a stub tokenizer whose
chat template is a few marker tokens) and a recording LRUPromptCache, makes the same fetch /
insert_cache / trim_to calls, in the same order, as adapter.ServerDriver does for the same requests.

The server samples greedily (temperature 0); the driver is given the tokens the server generated.

The server runs in a child process. MLX >= 0.32 gives each thread its own default stream, and on
the CUDA backend arrays made on a thread that has ended abort the process when they are freed later
(docs/platform.md, 2026-12-04: 13 of 14 processes looping this test in-process aborted). So the
generation thread's arrays never meet another thread's work here: the child sends what it recorded
and leaves without tearing them down."""
import argparse
import contextlib
import multiprocessing
import os
import traceback

import pytest

from targets.mlx_lm import models
from targets.mlx_lm.adapter import MODEL_KEY, ServerDriver, _offset

server = pytest.importorskip("mlx_lm.server")
from mlx_lm.models.cache import LRUPromptCache  # noqa: E402

ROLE = {"system": 101, "user": 102, "assistant": 103}
NUM_DRAFT = 3                 # tokens the draft model proposes per step (the request's num_draft_tokens)
GEN_PROMPT, END = 104, 105


class Detok:
    def __init__(self):
        self.last_segment = ""

    def reset(self):
        self.last_segment = ""

    def add_token(self, t):
        self.last_segment = f" {t}"

    def finalize(self):
        pass


def _wrapper():
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    return TokenizerWrapper


class StubTokenizer(_wrapper()):
    """Text is space-separated token ids; the chat template is role marker + content per message.
    A TokenizerWrapper (its constructor skipped), so that stream_generate -- the sequential path --
    takes it as it is."""
    _tokenizer = None
    eos_token_ids = set()
    has_thinking = has_tool_calling = False
    tool_parser = None
    structural_markers = []
    response_transitions = {}
    response_initial_state = None
    has_chat_template = True

    def __init__(self):
        pass

    @property
    def detokenizer(self):
        return Detok()

    def encode(self, text, add_special_tokens=True):
        return [int(t) for t in text.split()]

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, tools=None, **kw):
        out = []
        for m in messages:
            out += [ROLE[m["role"]]] + self.encode(m["content"]) + [END]
        return out + ([GEN_PROMPT] if add_generation_prompt else [])


class RecordingCache(LRUPromptCache):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls = []

    def fetch_nearest_cache(self, model, tokens):
        self.calls.append(("fetch", tuple(tokens)))
        return super().fetch_nearest_cache(model, tokens)

    def insert_cache(self, model, tokens, prompt_cache, *, cache_type="assistant"):
        self.calls.append(("insert", tuple(tokens), cache_type))
        return super().insert_cache(model, tokens, prompt_cache, cache_type=cache_type)

    def trim_to(self, *, n_sequences=None, n_bytes=None):
        self.calls.append(("trim_to", n_bytes))
        return super().trim_to(n_sequences=n_sequences, n_bytes=n_bytes)


class StubProvider:
    """The server's flags --kv-bits, --quantized-kv-start and --draft-model come as `flags` (the
    adapter's keyword names); batchable as ModelProvider._load decides: no draft model, every cache
    mergeable."""
    def __init__(self, model, size, nbytes, kv_bits=None, quantized_kv_start=0, draft=None):
        self.cli_args = argparse.Namespace(
            prompt_cache_size=size, prompt_cache_bytes=nbytes, decode_concurrency=32, prompt_concurrency=8,
            prefill_step_size=2048, kv_bits=kv_bits, kv_group_size=64, quantized_kv_start=quantized_kv_start,
            chat_template_args={}, pipeline=False)
        self.model, self.tokenizer = model, StubTokenizer()
        self.model_key = ("default_model", None, None)
        self.processor = None
        self.draft_model = None if draft is None else models.build(draft)
        self.is_batchable = draft is None and models.server_path(model) == "batched"

    def load_default(self):
        pass

    def reset(self):
        pass

    def load(self, model, adapter=None, draft=None):
        return self.model, self.tokenizer


def args(max_tokens, seed=None, num_draft_tokens=0):
    return server.GenerationArguments(
        model=server.ModelDescription(model="default_model", draft=None, adapter=None),
        sampling=server.SamplingArguments(0.0, 1.0, 0, 0.0, 0.0, 0.0),
        logits=server.LogitsProcessorArguments(None, 0.0, 20, 0.0, 20, 0.0, 20),
        stop_words=[], max_tokens=max_tokens, num_draft_tokens=num_draft_tokens, logprobs=False, top_logprobs=0,
        seed=seed, chat_template_kwargs=None)


def system_end(msgs, prompt):
    """Where the system segment ends: the first position where the system messages followed by an
    empty user message differ from the prompt (the template's own rendering decides)."""
    if msgs[0]["role"] != "system":
        return 0
    sys_tokens = StubTokenizer().apply_chat_template(msgs[:1] + [{"role": "user", "content": ""}])
    return next((i for i, (a, b) in enumerate(zip(sys_tokens, prompt)) if a != b), 0)


def text(tokens):
    return " ".join(map(str, tokens))


# (kind, payload, max_tokens, seed): text prompts, and chats with and without a system prompt; a seed
# sends a request down the sequential path (_serve_single), between batched ones
REQUESTS = [
    ("text", [5, 6, 7, 8], 2, None),
    ("text", [5, 6, 7, 8, 9], 1, None),
    ("chat", [("system", [1, 2]), ("user", [3, 4])], 2, None),
    ("text", [5, 6, 7, 8, 9, 4], 2, 0),
    ("chat", [("system", [1, 2]), ("user", [3, 9])], 1, None),
    ("chat", [("user", [3, 4, 5])], 2, None),
    ("text", [5, 6], 1, 0),
    ("text", [5, 6], 1, None),
]


def serve(name, size, nbytes, flags=None):
    """mlx_lm.server's ResponseGenerator over REQUESTS: what it served, and its cache calls."""
    flags = flags or {}
    model = models.build(name)
    cache = RecordingCache(size)                           # as server.run builds it
    rg = server.ResponseGenerator(StubProvider(model, size, nbytes, **flags), cache)
    num_draft = NUM_DRAFT if "draft" in flags else 0
    served = []
    try:
        for kind, payload, max_tokens, seed in REQUESTS:
            if kind == "text":
                req = server.CompletionRequest("text", text(payload), [], None, None)
                prompt, chat, sys_len = payload, False, 0
            else:
                msgs = [{"role": r, "content": text(c)} for r, c in payload]
                req = server.CompletionRequest("chat", "", msgs, None, None)
                prompt = StubTokenizer().apply_chat_template(msgs, add_generation_prompt=True)
                chat = True
                sys_len = system_end(msgs, prompt)
            _, stream = rg.generate(req, args(max_tokens, seed, num_draft))
            gen = [r.token for r in stream]
            served.append((prompt, gen, chat, sys_len, seed))
    finally:
        rg.stop_and_join()
    return served, cache.calls, stored(cache)


def stored(lru) -> dict:
    """key -> (cache class names, offsets) of every entry an LRUPromptCache holds (its trie, read-only)."""
    out, stack = {}, [((), lru._trie._trie.get(MODEL_KEY, {}))]
    while stack:
        keys, node = stack.pop()
        for tok, child in node.items():
            if tok == "__value__":
                out[keys] = (tuple(type(c).__name__ for c in child.prompt_cache),
                             tuple(_offset(c) for c in child.prompt_cache))
            else:
                stack.append((keys + (tok,), child))
    return out


def on_cpu_if_quantized(flags):
    """The CPU stream for --kv-bits, else the default one. MLX's CUDA backend has no quantized_matmul for
    the small test model's attention shapes ("No implementation for problem shape: 1x4x64x2", 8 bits,
    group 64; H100, mlx 0.32.4); the cache calls compared here do not depend on the device."""
    import mlx.core as mx
    return mx.stream(mx.cpu) if flags and "kv_bits" in flags else contextlib.nullcontext()


def _serve_in_child(conn, name, size, nbytes, flags):
    try:
        with on_cpu_if_quantized(flags):
            result = serve(name, size, nbytes, flags)
        conn.send(("ok", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    conn.close()
    os._exit(0)       # no teardown: the ended generation thread's arrays are never freed (see above)


def serve_in_child(name, size, nbytes, flags=None, timeout=120):
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=_serve_in_child, args=(theirs, name, size, nbytes, flags))
    child.start()
    try:
        assert mine.poll(timeout), f"mlx_lm.server's child sent nothing in {timeout} s"
        status, out = mine.recv()
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0, f"mlx_lm.server's child exited with {child.exitcode}"
    assert status == "ok", out
    return out


@pytest.mark.parametrize("name,size,nbytes", [("qwen3next", 10, None), ("llama", 3, 6000), ("llama4", 10, 6000)])
def test_server_and_adapter_make_the_same_cache_calls(name, size, nbytes):
    """Both paths: the seeded requests (and every request on llama4, whose ChunkedKVCache cannot merge)
    go through _serve_single, the others through the batch; the adapter chooses the same."""
    served, calls, _ = serve_in_child(name, size, nbytes)
    driver = ServerDriver(name, size, nbytes)
    paths = [driver.request(prompt, gen, chat=chat, sys_len=sys_len, seed=seed).path
             for prompt, gen, chat, sys_len, seed in served]
    assert driver.calls == calls
    kinds = {c[2] for c in calls if c[0] == "insert"}
    if name == "llama4":
        assert set(paths) == {"sequential"} and not any(c[0] == "trim_to" for c in calls)
        return
    assert {"batched", "sequential"} == set(paths)
    assert {"system", "user", "assistant"} <= kinds                 # every segment type was exercised
    assert (nbytes is not None) == any(c[0] == "trim_to" for c in calls)


@pytest.mark.parametrize("name,flags", [("llama_q", {"kv_bits": 8, "quantized_kv_start": 0}),
                                        ("llama", {"draft": "llama_draft"})])
def test_sequential_path_with_kv_bits_or_a_draft_model(name, flags):
    """--kv-bits (quantized from the first token) and --draft-model send every request down
    _serve_single (no batch, no trim_to: the byte limit is never applied there); the adapter, given the
    same flags, makes the same cache calls and ends holding the same entries: quantized caches, or the
    model's and the draft model's caches at the same offsets."""
    served, calls, held = serve_in_child(name, 10, 6000, flags)
    with on_cpu_if_quantized(flags):
        driver = ServerDriver(name, 10, 6000, num_draft_tokens=NUM_DRAFT, **flags)
        paths = [driver.request(prompt, gen, chat=chat, sys_len=sys_len, seed=seed).path
                 for prompt, gen, chat, sys_len, seed in served]
    assert set(paths) == {"sequential"} and not any(c[0] == "trim_to" for c in calls)
    assert any(c[0] == "insert" for c in calls)
    assert driver.calls == calls
    assert {k: (e.kinds, e.offsets) for k, e in driver.entries().items()} == held
    kinds = {kind for names, _ in held.values() for kind in names}
    assert kinds == ({"QuantizedKVCache"} if "kv_bits" in flags else {"KVCache"}), kinds
