"""Stand-ins for modules vLLM's import chain names but the prefix-cache managers never call.

`vllm.v1.core.kv_cache_manager` reaches, through `vllm.config`, `vllm.v1.request` and
`vllm.v1.structured_output`, packages of the serving stack (grammar engines, tokenizer parsers, ...)
that are native, CUDA-only or heavy. None of their functions runs while a KVCacheManager allocates,
caches, frees and evicts blocks; only their names are imported at module level (type hints, class
bases, `isinstance` targets). `install(names)` puts a meta-path finder in front that answers those
top-level names (and every submodule below them) with an empty module whose missing attributes are
fresh placeholder classes. A placeholder raises when called with arguments it cannot take, so a code
path that really uses one fails loudly instead of silently doing nothing.

Invariants: only the names passed are stubbed, and only when the real package is not importable
(an installed package always wins); `STUBBED` lists what was answered, for the report.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

STUBBED: list = []


class _Placeholder(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__name__}.{name}")

    def __call__(cls, *a, **k):
        return super().__call__()

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __getitem__(cls, item):
        return cls


def _placeholder(name: str):
    return _Placeholder(name.rsplit(".", 1)[-1], (), {"__module__": "targets.vllm.stubs"})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".", 1)[0]
        if top not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        STUBBED.append(module.__name__)


def install(names) -> list:
    """Stub each top-level name in `names` that is not importable; returns those stubbed."""
    missing = []
    for n in names:
        if n in sys.modules:
            continue
        try:
            found = importlib.util.find_spec(n) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(n)
    if missing:
        sys.meta_path.insert(0, _Finder(missing))
    return missing
