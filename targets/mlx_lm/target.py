"""MlxLmTarget: mlx-lm's server prompt cache behind the target interface of targets/base.py.

The server works a request at a time, so the operations map onto ServerDriver's calls like this:
  begin(keys)      fetch_nearest_cache (C2 is judged here); returns (matched, resume) with matched the
                   longest common prefix with a stored entry (capped at len - 1) and resume the count
                   the fetch covered
  prefill(n)       nothing is evaluated yet: the server prefills inside BatchGenerator.next(), which
                   also samples the first token, so prefill and decode run together at close();
                   returns True (a cancel mid-prefill has no counterpart in the server's cache calls)
  step(key)        records the token the request generates (the sampler will force it)
  close()          insert_segments, trim_to, next() until the request finishes, with the segment and
                   finish inserts -- the same cache calls, in the same order, as ServerDriver.request
  set_budget(b)    the --prompt-cache-bytes value read at the next request (the server reads
                   cli_args.prompt_cache_bytes afresh at every request)
  view()           targets.mlx_lm.view.view_of
Invariants: between close() and the next begin() nothing touches the cache; a request with no step()
generates one greedy-free forced token (1), since max_tokens must be > 0.
"""
from __future__ import annotations

from targets.mlx_lm.adapter import ServerDriver
from targets.mlx_lm.rules import NOT_APPLICABLE, RULES, Checker, common_prefix
from targets.mlx_lm.view import view_of


class MlxLmTarget:
    name = "mlx-lm"
    RULES = RULES
    NOT_APPLICABLE = NOT_APPLICABLE

    def __init__(self, model_name: str = "llama", prompt_cache_size: int = 10, prompt_cache_bytes=None,
                 lru_class=None):
        self.checker = Checker()
        self.driver = ServerDriver(model_name, prompt_cache_size, prompt_cache_bytes, lru_class=lru_class,
                                   observer=self.checker)
        self._open = None

    def begin(self, keys, spans=()) -> tuple:
        if spans:
            raise ValueError("mlx-lm target: no non-causal media on the batched path")
        keys = list(keys)
        matched = min(max([0] + [common_prefix(k, keys) for k in self.driver.entries()]), len(keys) - 1)
        res = self.driver.fetch_only(keys)
        self._open = {"keys": keys, "gen": [], "fetch": res}
        return matched, res.count

    def prefill(self, max_chunks: int | None = None) -> bool:
        return True

    def step(self, key: int) -> None:
        self._open["gen"].append(int(key))

    def close(self) -> None:
        o, self._open = self._open, None
        self.driver.finish(o["fetch"], o["gen"] or [1])

    def set_budget(self, budget: int) -> None:
        self.driver.prompt_cache_bytes = budget

    def view(self):
        return view_of(self.driver)

    def shutdown(self) -> None:
        pass
