"""mlx-lm's prompt cache used the way ``mlx_lm.server`` (0.32.x) uses it: the benchmark's anchor.

``ServerLRU`` serves one request at a time through the server's batched path
(``ResponseGenerator._generate``; every model here takes it, as ``targets/mlx_lm/models.server_path``
checks), call for call:

  1. ``cache, rest = prompt_cache.fetch_nearest_cache(key, prompt)`` (a deep copy of the nearest
     entry, trimmed when every layer can trim); N = len(prompt) - len(rest) tokens are cut off the
     front of the request's segments;
  2. ``BatchGenerator.insert_segments(segments=[segments], caches=[cache], all_tokens=[prompt[:N]])``;
     when ``--prompt-cache-bytes`` is set, ``prompt_cache.trim_to(n_bytes=total -
     batch_generator.prompt_cache_nbytes)`` (in-flight caches count against the total);
  3. ``BatchGenerator.next()`` until the request finishes; at the end of every segment that is not the
     end of the prompt, ``extract_cache`` and ``insert_cache(..., cache_type=<segment type>)`` (the
     server's checkpoints); at the finish ``insert_cache(all_tokens, prompt_cache,
     cache_type="assistant")``.

Segments follow ``ResponseGenerator._tokenize`` for a chat request whose last message is the user's: a
"system" segment up to ``sys_end`` (the first position where the prompt differs from the template of
the system messages followed by an empty user message) and a "user" segment for the rest (the models
have no thinking tail). The cache is ``LRUPromptCache(prompt_cache_size)`` as ``server.run`` builds it
(default size 10); the byte limit acts only through ``trim_to``, as in the server. Greedy sampling, no
stop tokens, ``prefill_step_size`` = the benchmark's chunk (the server's default is 2048).
"""

from __future__ import annotations

import gc
import time

import mlx.core as mx

from bench.runners import Outcome, distinct_tokens
from targets.mlx_lm.adapter import cut_cached, segments_for

MODEL_KEY = ("bench", None, None)



class ServerLRU:
    def __init__(self, lm, max_bytes: int | None = None, *, chunk: int, max_size: int = 10):
        from mlx_lm.generate import BatchGenerator
        from mlx_lm.models.cache import LRUPromptCache

        self.lm = lm
        self.total = max_bytes                    # --prompt-cache-bytes (None: not set)
        self.store = LRUPromptCache(max_size)     # server.run passes only the size
        self.bg = BatchGenerator(lm.model, completion_batch_size=32, prefill_batch_size=8,
                                 prefill_step_size=chunk)
        self.checkpoints = 0                      # segment checkpoints inserted

    def run(self, prompt, max_tokens: int, sys_end: int = 0, **_) -> Outcome:
        prompt = list(prompt)
        t0 = time.perf_counter()
        segments, types = segments_for(prompt, True, sys_end)
        cache, rest = self.store.fetch_nearest_cache(MODEL_KEY, prompt)
        count = len(prompt) - len(rest)
        cut_cached(segments, types, count)
        if not segments:                          # exact hit: the server would prefill nothing; we keep
            segments, types = [prompt[-1:]], ["user"]   # one token (see bench/runners.py)
            count = len(prompt) - 1
            from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache
            if can_trim_prompt_cache(cache):
                trim_prompt_cache(cache, 1)
            else:
                cache, count, segments = None, 0, [prompt]
        (uid,) = self.bg.insert_segments(segments=[segments], max_tokens=[max_tokens], caches=[cache],
                                         all_tokens=[prompt[:count]])
        del cache
        if self.total is not None:
            self.store.trim_to(n_bytes=self.total - self.bg.prompt_cache_nbytes)
        seg_types = types[::-1]
        tokens, ttft, done = [], 0.0, False
        while not done:
            prompt_responses, gen_responses = self.bg.next()
            if not prompt_responses and not gen_responses:
                raise RuntimeError("batch generator idle before the request finished")
            eos = [r.uid for r in prompt_responses if r.end_of_segment and not r.end_of_prompt and seg_types]
            for _, (c, cache_key) in self.bg.extract_cache(eos).items():
                self.store.insert_cache(MODEL_KEY, cache_key[:], c, cache_type=seg_types.pop())
                self.checkpoints += 1
            for r in gen_responses:
                tokens.append(int(r.token))
                if len(tokens) == 1:
                    ttft = time.perf_counter() - t0
                if r.finish_reason is not None:
                    self.store.insert_cache(MODEL_KEY, r.all_tokens[:], r.prompt_cache, cache_type="assistant")
                    done = True
        total = time.perf_counter() - t0
        return Outcome(tokens, len(prompt) - count, ttft or total, total)

    def keys(self) -> list:
        return [list(t) for lru in self.store._lru._lrus.values() for (_m, t) in lru]

    def held(self) -> int:
        return self.store.nbytes

    def distinct(self) -> int:
        return distinct_tokens(self.keys())

    def entries(self) -> int:
        return len(self.store)

    def close(self) -> None:
        self.store = self.bg = None
        gc.collect()
        mx.clear_cache()
