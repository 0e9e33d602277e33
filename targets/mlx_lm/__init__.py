"""The mlx-lm target: `mlx_lm.models.cache.LRUPromptCache` driven exactly as `mlx_lm.server` drives it.

Checked against mlx-lm >= 0.32.2, < 0.33 (pyproject pins the floor; findings record the version they
were found on). mlx-lm is imported, never copied: the adapter calls the server's own cache class, its
own `BatchGenerator` and its own `make_prompt_cache`, in the order `ResponseGenerator._generate` does.

Modules:
  models    small fixed-seed models of seven mlx-lm architectures, built in memory; which server path
            (batched / sequential) each takes, by the server's own test
  adapter   ServerDriver: the server's call sequence per request
  target    MlxLmTarget: the same behind the target interface of targets/base.py
  view      the cache's state as spec.view's read-only View
  oracle    C1: the same-schedule replay on stock caches; the tolerance where it is not exact
  recorder  the forwards the server runs (the schedule), the sequential path's tokenizer
  rules     which rules apply (RULES, NOT_APPLICABLE), C2, E1, E3, A1, S2, and the mlx-lm
            function each violation is attributed to
  machine   the Hypothesis machine, the search for distinct violations, programs and their replay
  export    a finding as a standalone script (export_checks: one check per cause)
  onefix    a copy of mlx-lm per bug with only that bug fixed, every script against every copy
  report    the report (rule violations and policy differences kept apart)
  __main__  ./dev check-mlx-lm (check), replay of saved findings, render
"""

MLX_LM_RANGE = ">=0.32.2,<0.33"
PINNED = "0.32.2"
