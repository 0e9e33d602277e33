"""mlx-lm's own cache tests (tests/test_prompt_cache.py of ml-explore/mlx-lm) run against our classes.

Set ``MLX_LM_SRC`` to an mlx-lm checkout (nothing of it is vendored here); without it this module is
skipped with that reason. The checkout's test module is loaded as is, then the names it imported
from ``mlx_lm.models.cache`` are rebound to ours — KVCache -> SnapshotKVCache, RotatingKVCache ->
WindowedCache, ArraysCache -> RecurrentCache, ChunkedKVCache -> ChunkedCache, CacheList ->
KVListCache / StateListCache (by parts), ``make_prompt_cache`` -> ``make_layer_caches`` — and its
model (a 4-bit Qwen1.5 from the hub, unreachable offline) is replaced by our SmolLM2-135M (a llama,
plain KV like Qwen1.5) with a tokenizer adapter. mlx-lm's batch classes and QuantizedKVCache stay
mlx-lm's: we do not replace them.

``MLX_LM_SUITE_STOCK=1`` runs the same module on mlx-lm's own classes (the baseline column of
docs/caches.md: a checkout newer or older than the installed mlx-lm can fail on its own classes).
``EXPECTED_FAILURES`` lists the tests that fail against our classes by design, each with the
documented reason (docs/caches.md has the table with the mlx-lm commit); any other failure fails,
and an expected failure that passes fails too (unittest's unexpected success).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import unittest

import mlx.core as mx
import pytest

SRC = os.environ.get("MLX_LM_SRC")
STOCK = os.environ.get("MLX_LM_SUITE_STOCK") == "1"     # baseline run on mlx-lm's own classes
if not SRC:
    pytest.skip("MLX_LM_SRC is not set: point it at an mlx-lm checkout to run its tests/test_prompt_cache.py "
                "against our caches", allow_module_level=True)
SUITE = pathlib.Path(SRC) / "tests" / "test_prompt_cache.py"
if not SUITE.exists():
    pytest.skip(f"MLX_LM_SRC={SRC} has no tests/test_prompt_cache.py", allow_module_level=True)

from impl.caches import (CacheError, ChunkedCache, KVCache, RecurrentCache,  # noqa: E402
                         WindowedCache, make_layer_caches)
from impl.caches.composite import KVListCache, StateListCache, make_list_cache  # noqa: E402

EXPECTED_FAILURES = {
    "test_cache_list": "CacheList.merge: mlx-lm's batching protocol, refused (base.py, Names)",
    "test_merge_with_empty_caches": "ArraysCache.merge: mlx-lm's batching protocol, refused (base.py, Names)",
    "test_arrays_cache_extend_with_empty": "ArraysCache.merge: mlx-lm's batching protocol, refused",
}
# Tests that fail on mlx-lm's own classes too at the recorded commit (docs/caches.md): version skew
# between the checkout and the installed mlx-lm, nothing of ours involved.
BASELINE_FAILURES = {
    "test_batch_kv_cache": "BatchKVCache.filter keeps 254 rows where the checkout expects 2 (installed 0.32.2)",
    "test_cache_list": "CacheList.merge(...).extract(0) returns other KV rows than it was given",
}


class _CacheListType(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, (KVListCache, StateListCache))

    def __call__(cls, *caches):
        return make_list_cache(list(caches))


class _CacheList(metaclass=_CacheListType):
    """CacheList(*parts) -> KVListCache or StateListCache; isinstance answers for both."""

    @staticmethod
    def merge(caches):
        raise AttributeError("CacheList.merge: mlx-lm's batching protocol is refused by our caches")


class _Tokenizer:
    def __init__(self, tok):
        self.tok = tok

    def encode(self, text, return_tensors=None):
        ids = self.tok.encode(text)
        return mx.array([ids]) if return_tensors == "mlx" else ids


def _load(_path):
    from impl.models import load

    lm = load("smollm2")
    return lm.model, _Tokenizer(lm.tokenizer)


def _load_suite():
    spec = importlib.util.spec_from_file_location("mlx_lm_test_prompt_cache", SUITE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ours = {"KVCache": KVCache, "RotatingKVCache": WindowedCache, "ArraysCache": RecurrentCache,
            "ChunkedKVCache": ChunkedCache, "CacheList": _CacheList, "load": _load,
            "make_prompt_cache": lambda model, *a, **k: make_layer_caches(model)}
    if STOCK:       # the baseline: mlx-lm's own classes, only the model replaced
        ours = {"load": _load}
    for name, value in ours.items():
        if hasattr(mod, name):
            setattr(mod, name, value)
    case = mod.TestPromptCache
    raw = os.environ.get("MLX_LM_SUITE_RAW") == "1"    # every failure shown, none expected (to read reasons)
    expected = {} if raw else dict(BASELINE_FAILURES, **({} if STOCK else EXPECTED_FAILURES))
    for name, reason in expected.items():
        if hasattr(case, name):
            setattr(case, name, unittest.expectedFailure(getattr(case, name)))
    return case


TestPromptCacheOnOurCaches = _load_suite()
