"""Drive mlx-lm's server prompt cache exactly as `mlx_lm.server` (0.32.x) does, one request at a time.

The call sequence per request is ResponseGenerator._generate's batched branch (the path every model of
targets.mlx_lm.models takes; see models.server_path):

  1. `cache, rest = prompt_cache.fetch_nearest_cache(model_key, prompt)`; the cached count
     N = len(prompt) - len(rest) is cut off the front of the request's segments as the server does;
  2. `batch_generator.insert_segments(segments=[segments], max_tokens, caches=[cache],
     all_tokens=[prompt[:N]], samplers=[...])`; when --prompt-cache-bytes is set,
     `prompt_cache.trim_to(n_bytes=total - batch_generator.prompt_cache_nbytes)`;
  3. `batch_generator.next()` until the request finishes; at each end of segment that is not the end of
     the prompt, `extract_cache` and `insert_cache(model_key, cache_key[:], cache,
     cache_type=<the segment's type>)`; at the finish, `insert_cache(model_key, all_tokens[:],
     prompt_cache, cache_type="assistant")`.

The cache is built as `server.run` builds it: `LRUPromptCache(prompt_cache_size)` -- the byte limit is
NOT passed to it (that is what the code does, whatever --help says). Segments come from
ResponseGenerator._tokenize's rules: a text completion is one "assistant" segment; a chat request
whose last message is the user's has a "system" segment (the system prompt, when there is one) and a
"user" segment (no thinking tail: the models have no think tokens).

Invariants:
- mlx-lm's objects are only called, never patched; the driver reads the cache's trie to list its
  entries (read-only) for the view and the checker.
- Generated tokens are forced by a sampler (the program chooses them); the logprobs the server
  computes are what the C1 oracle compares with a cold prefill.
- A request whose `insert_segments` raises is recorded as a crash: in the server the generation thread
  dies there (ResponseGenerator._run_generate), so the driver serves nothing after it.
- The schedule of forwards is recorded (REFERENCE C1, exact): the BatchGenerator is given a Recorder
  that calls the model unchanged and logs each forward's input tokens. Only one request is in the
  batch at a time, so every forward between a fetch and the request's finish is that request's. Each
  stored entry keeps the schedule that built it: the served entry's schedule (with the fetch's trim
  of it, when it served a longer entry), then the request's own forwards up to the insert. C1
  replays that schedule on fresh stock caches (rules.replay).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import mlx.core as mx

from targets.mlx_lm import models
from targets.mlx_lm.recorder import Recorder, _Tokenizer, own_ops  # noqa: F401  (own_ops: the schedule's API)

MODEL_KEY = ("default_model", None, None)     # the shape of ModelProvider.model_key


def segments_for(prompt: list, chat: bool, sys_len: int):
    """ResponseGenerator._tokenize's segments for a prompt (no thinking tail)."""
    if not chat:
        return [list(prompt)], ["assistant"]
    segments, types = [], []
    sys_end = sys_len if 0 < sys_len < len(prompt) else 0
    if sys_end:
        segments.append(list(prompt[:sys_end]))
        types.append("system")
    segments.append(list(prompt[sys_end:]))
    types.append("user")
    return segments, types


def cut_cached(segments: list, types: list, n: int) -> None:
    """The server's segment cut: drop the first n prompt tokens (served by the cache) from the
    segments, in place; a segment left empty is dropped with its type."""
    while n > 0:
        if n >= len(segments[0]):
            n -= len(segments.pop(0))
            types.pop(0)
        else:
            segments[0] = segments[0][n:]
            break


@dataclass
class Entry:
    key: tuple
    cache_type: str
    nbytes: int            # what the cache recorded at insert (CacheEntry.nbytes)
    held: int              # sum of its layer caches' nbytes now
    trimmable: bool        # mlx-lm's can_trim_prompt_cache on the stored caches
    offsets: tuple
    kinds: tuple = ()      # its layer caches' class names


@dataclass
class Result:
    prompt: tuple
    count: int                       # tokens the fetched cache covered
    served: tuple                    # keys of the entries the fetch may have served from (one when known)
    branch: str                      # where mlx-lm's trie search pointed: exact | longer | shorter | miss
    logprobs: list = field(default_factory=list)   # the server's logprobs, one per generated token
    fetched: list | None = None      # a copy of the fetched caches (for the direct C1 check)
    crash: str | None = None
    bases: list = field(default_factory=list)   # candidate schedules of the fetched state (one per served entry)
    base_index: int = 0              # the candidate C1 matched (set by the checker)
    own: list = field(default_factory=list)     # the request's own forwards (Recorder's log), in order
    generated: list = field(default_factory=list)   # the tokens generated (forced, or greedy with a draft)
    path: str = "batched"            # the serving path the server chose for it
    seed: int | None = None
    _pending: tuple | None = None    # (cache, segments, types) between fetch_only and finish


class ServerDriver:
    """One LRUPromptCache and one BatchGenerator; `request` serves one request as the server does.
    `observer` (rules.Checker) is told before/after every call that changes the cache."""

    def __init__(self, model_name: str, prompt_cache_size: int = 10, prompt_cache_bytes: int | None = None,
                 lru_class=None, observer=None, kv_bits: int | None = None, quantized_kv_start: int = 5000,
                 draft: str | None = None, num_draft_tokens: int = 3, hollow: bool = False):
        """`lru_class`: a factory (prompt_cache_size, prompt_cache_bytes) -> cache, standing for
        server.run's construction; default: what server.run does, LRUPromptCache(prompt_cache_size).
        `kv_bits`, `quantized_kv_start` (default 5000, the server's), `draft` (a model name: --draft-model)
        and `num_draft_tokens` (default 3) are the server's flags of those names. `hollow`: the models'
        hollow twins (targets.mlx_lm.hollow): the same cache calls and states, meaningless logprobs."""
        from mlx_lm.models.cache import LRUPromptCache, make_prompt_cache
        self.model_name = model_name
        self.hollow = hollow
        self.model = models.build(model_name, hollow)
        self.prompt_cache_size = prompt_cache_size
        self.prompt_cache_bytes = prompt_cache_bytes
        if lru_class is None:
            self.lru = LRUPromptCache(prompt_cache_size)                 # server.run: no byte limit passed
        else:
            self.lru = lru_class(prompt_cache_size, prompt_cache_bytes)
        self.kv_bits, self.quantized_kv_start = kv_bits, quantized_kv_start
        self.draft_name, self.num_draft_tokens = draft, num_draft_tokens
        self.draft_model = None if draft is None else models.build(draft, hollow)
        # ModelProvider._load: batchable when there is no draft model and every layer cache can merge
        self.batchable = draft is None and all(hasattr(c, "merge") for c in make_prompt_cache(self.model))
        self.recorder = Recorder(self.model)
        self.bg = None                   # the BatchGenerator, made when a batched request comes
        self.held_max: dict = {}         # path -> the most bytes held at rest after a request on it
        self.schedules: dict = {}        # key -> (Result that inserted it, forwards of it up to the insert)
        self.observer = observer
        self._current = None             # the Result being served
        self.calls: list = []            # ("fetch", prompt) | ("insert", key, type) | ("trim_to", n)
        self.dead = False

    # ---------------------------------------------------------------- reading the cache
    def entries(self) -> dict:
        """key -> Entry for every entry the cache holds (walks its trie, read-only)."""
        from mlx_lm.models.cache import can_trim_prompt_cache
        out = {}
        root = self.lru._trie._trie.get(MODEL_KEY)
        stack = [((), root)] if root is not None else []
        while stack:
            keys, node = stack.pop()
            for tok, child in node.items():
                if tok == "__value__":
                    e = child
                    out[keys] = Entry(keys, e.cache_type, e.nbytes, sum(c.nbytes for c in e.prompt_cache),
                                      can_trim_prompt_cache(e.prompt_cache),
                                      tuple(_offset(c) for c in e.prompt_cache),
                                      tuple(type(c).__name__ for c in e.prompt_cache))
                else:
                    stack.append((keys + (tok,), child))
        return out

    def schedule(self, key) -> list:
        """The forwards (and trims) that built the stored entry `key`: [("fwd", tokens) | ("trim", n)]."""
        res, n = self.schedules[tuple(key)]
        own = res.own if res.own is not self.recorder.log else list(self.recorder.log)
        ops = res.bases[res.base_index] + own_ops(res.count, own[:n])
        pos = sum(len(op[1]) if op[0] == "fwd" else -op[1] for op in ops)
        if pos < len(key):               # the forwards stop short of the key: a correct entry holds the
            ops.append(("fwd", tuple(key[pos:]), ()))    # rest too (a cold run would have computed it)
        elif pos > len(key):
            ops.append(("trim", pos - len(key)))
        return ops

    def _served(self, prompt: list, count: int, before: dict) -> tuple:
        """The entries the fetch may have served `count` tokens from, judged from the outcome alone (so
        any implementation is judged alike): keys that agree with the prompt on [0, count) and can stand
        at count (their own length, or longer and trimmable). An entry of length exactly `count` is the
        one served; otherwise several may be candidates. () when nothing was served."""
        if count == 0:
            return ()
        cands = [k for k, e in before.items() if len(k) >= count and k[:count] == tuple(prompt[:count])
                 and (len(k) == count or e.trimmable)]
        exact = [k for k in cands if len(k) == count]
        return tuple(exact[:1] or sorted(cands))

    def _search_guess(self, prompt: list):
        """Which entry mlx-lm's trie search points the fetch at (read-only), and the branch (report only)."""
        from mlx_lm.models.cache import can_trim_prompt_cache
        r = self.lru._trie.search(MODEL_KEY, prompt)
        if r.exact is not None:
            return tuple(r.exact), "exact"
        short = len(r.shorter) if r.shorter is not None else 0
        if r.longer is not None and r.common_prefix > short:
            if can_trim_prompt_cache(self.lru._trie.get(MODEL_KEY, r.longer).prompt_cache):
                return tuple(r.longer), "longer"
        if short > 0:
            return tuple(r.shorter), "shorter"
        return None, "miss"

    # ---------------------------------------------------------------- the server's calls
    def _insert(self, tokens, cache, cache_type):
        from mlx_lm.models.cache import can_trim_prompt_cache
        self.calls.append(("insert", tuple(tokens), cache_type))
        before = self.entries()
        trimmable = can_trim_prompt_cache(cache)
        self.lru.insert_cache(MODEL_KEY, tokens, cache, cache_type=cache_type)
        if self._current is not None:
            self.schedules[tuple(tokens)] = (self._current, len(self.recorder.log))
        if self.observer:
            self.observer.after_insert(self, before, tuple(tokens), cache_type, trimmable)

    def _trim_to(self, n_bytes):
        self.calls.append(("trim_to", n_bytes))
        before = self.entries()
        self.lru.trim_to(n_bytes=n_bytes)
        if self.observer:
            self.observer.after_trim(self, before)

    def path(self, seed=None) -> str:
        """The server's choice (ResponseGenerator._generate): batched when the model is batchable and
        the request has no seed and there is no --kv-bits (no images here); else _serve_single."""
        return "batched" if self.batchable and seed is None and self.kv_bits is None else "sequential"

    def request(self, prompt, gen, chat: bool = False, sys_len: int = 0, seed=None) -> Result:
        """Serve one request: `prompt` tokens, then the generated tokens `gen` (forced, >= 1)."""
        return self.finish(self.fetch_only(prompt, chat, sys_len, seed), gen)

    def fetch_only(self, prompt, chat: bool = False, sys_len: int = 0, seed=None) -> Result:
        """The request's first cache call, fetch_nearest_cache; `finish` does the rest."""
        prompt = list(prompt)
        segments, types = segments_for(prompt, chat, sys_len)
        if self.observer:
            self.observer.before_fetch(self, prompt)
        before = self.entries()
        guess, branch = self._search_guess(prompt)
        self.calls.append(("fetch", tuple(prompt)))
        cache, rest = self.lru.fetch_nearest_cache(MODEL_KEY, prompt)
        count = len(prompt) - len(rest)
        res = Result(tuple(prompt), count, self._served(prompt, count, before), branch,
                     fetched=None if cache is None else copy.deepcopy(cache))
        res.path, res.seed = self.path(seed), seed
        res.bases = [self.schedule(k) + ([("trim", len(k) - count)] if len(k) > count else [])
                     for k in res.served] or [[]]
        if self.observer:
            self.observer.after_fetch(self, res)
        res._pending = (cache, segments, types)
        return res

    def finish(self, res: Result, gen) -> Result:
        """insert_segments, trim_to and the generation loop with its inserts, as the server does."""
        assert gen, "a request generates at least one token (max_tokens > 0)"
        if res.path == "sequential":
            return self._serve_single(res, gen)
        if self.bg is None:
            from mlx_lm.generate import BatchGenerator
            # server defaults: --decode-concurrency 32, --prompt-concurrency 8, --prefill-step-size 2048
            self.bg = BatchGenerator(self.recorder, completion_batch_size=32, prefill_batch_size=8,
                                     prefill_step_size=2048, stream=_server_stream())
        cache, segments, types = res._pending
        res._pending = None
        prompt, count = list(res.prompt), res.count
        cut_cached(segments, types, count)
        self._current = res
        self.recorder.log.clear()
        res.own = self.recorder.log
        forced = iter(list(gen))
        sampler = lambda logprobs: mx.array([next(forced, 0)], dtype=mx.uint32)
        try:
            (uid,) = self.bg.insert_segments(segments=[segments], max_tokens=[len(gen)], caches=[cache],
                                             all_tokens=[prompt[:count]], samplers=[sampler])
        except Exception as e:            # the server's generation thread dies here
            res.crash = f"{type(e).__name__}: {e}"
            self.dead = True
            self._current = None
            self._after(res, gen)
            return res
        del cache
        if self.prompt_cache_bytes is not None:
            self._trim_to(self.prompt_cache_bytes - self.bg.prompt_cache_nbytes)
        seg_types = types[::-1]
        done = False
        while not done:
            prompt_responses, gen_responses = self.bg.next()
            if not prompt_responses and not gen_responses:
                raise RuntimeError("batch generator idle before the request finished")
            eos = [r.uid for r in prompt_responses if r.end_of_segment and not r.end_of_prompt and seg_types]
            for _, (c, cache_key) in self.bg.extract_cache(eos).items():
                self._insert(cache_key[:], c, seg_types.pop())
            for r in gen_responses:
                res.logprobs.append(r.logprobs)
                res.generated.append(r.token)
                if r.finish_reason is not None:
                    self._insert(r.all_tokens[:], r.prompt_cache, "assistant")
                    done = True
        res.own = list(self.recorder.log)
        self.recorder.log.clear()
        self._current = None
        self._after(res, gen)
        return res

    def _after(self, res, gen):
        self.held_max[res.path] = max(self.held_max.get(res.path, 0), int(self.lru.nbytes))
        if self.observer:
            self.observer.after_request(self, res, gen)

    def _serve_single(self, res: Result, gen) -> Result:
        """ResponseGenerator._serve_single: a batch in progress is drained and closed first; a miss gets
        make_prompt_cache (+ the draft model's); stream_generate over the rest of the prompt with the
        server's flags; cache_key (the prompt, then each generated token) is inserted with the cache
        at the end -- no segment entries, no trim_to (the byte limit is never applied on this path).
        An exception is put on the request's queue: the request fails, the server goes on."""
        from mlx_lm.generate import stream_generate
        from mlx_lm.models.cache import make_prompt_cache
        cache, _, _ = res._pending
        res._pending = None
        if self.bg is not None:                           # drain_batch: the batch generator is closed
            self.bg.close()
            self.bg = None
        prompt, count = list(res.prompt), res.count
        cache_key, rest = prompt[:], prompt[count:]
        if cache is None:
            cache = make_prompt_cache(self.model)
            if self.draft_model is not None:
                cache += make_prompt_cache(self.draft_model)
        if res.seed is not None:
            mx.random.seed(res.seed)
        self._current = res
        self.recorder.log.clear()
        res.own = self.recorder.log
        forced = iter(list(gen))
        sampler = lambda logprobs: mx.array([next(forced, 0)], dtype=mx.uint32)
        if self.draft_model is not None:   # the draft and the verifier share the sampler: greedy (the
            sampler = None                 # server's temperature 0); `gen` gives only the count
        try:
            for g in stream_generate(model=self.recorder, tokenizer=_Tokenizer(), prompt=rest,
                                     max_tokens=len(gen), sampler=sampler, logits_processors=[],
                                     prompt_cache=cache, draft_model=self.draft_model,
                                     num_draft_tokens=self.num_draft_tokens, prefill_step_size=2048,
                                     kv_bits=self.kv_bits, kv_group_size=64,
                                     quantized_kv_start=self.quantized_kv_start, stream=_server_stream()):
                res.logprobs.append(g.logprobs)
                res.generated.append(g.token)
                cache_key.append(g.token)
                if g.finish_reason is not None:
                    break
        except Exception as e:            # _serve_single puts it on the request's queue
            res.crash = f"{type(e).__name__}: {e}"
            res.own = list(self.recorder.log)
            self.recorder.log.clear()
            self._current = None
            self._after(res, gen)
            return res
        self._insert(cache_key, cache, "assistant")
        res.own = list(self.recorder.log)
        self.recorder.log.clear()
        self._current = None
        self._after(res, gen)
        return res


def _server_stream():
    """The stream the server's generation thread passes to BatchGenerator and stream_generate: the
    default stream of the default device, read when it runs (mlx_lm.generate's own default is a stream
    of the device that was the default when it was imported)."""
    return mx.default_stream(mx.default_device())


def _offset(c) -> int:
    if hasattr(c, "offset"):
        return int(c.offset)
    return -1                                          # ArraysCache: no offset of its own
