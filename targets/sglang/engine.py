"""Loading SGLang's radix cache, and calling it the same way whatever its version.

`load(src=None)` imports `sglang.srt.mem_cache.radix_cache` from the installed sglang, or from `src`:
a source checkout (SRC/python/sglang) or an unpacked wheel (SRC/sglang). The GPU-only packages its
import chain reaches are stood in for by targets.sglang.stubs (never called on the CPU).

`Api` hides the call shapes that changed across releases, probing the module, never a version
number:
  construction  RadixCache(CacheInitParams(...)) (0.5.x) | RadixCache(req_to_token_pool=...,
                token_to_kv_pool_allocator=..., page_size=..., disable=...) (older)
  match_prefix  match_prefix(MatchPrefixParams(key=RadixKey)) | match_prefix(key=RadixKey) |
                match_prefix(key=list)
  insert        insert(InsertParams(key, value)) -> InsertResult | insert(RadixKey, value) -> int |
                insert(list, value) -> int
  evict         evict(EvictParams(num_tokens)) | evict(num_tokens)
  locks         inc_lock_ref(node), dec_lock_ref(node)
Node keys are read as token lists (RadixKey.token_ids or a plain list); values are index tensors.

Invariants: nothing of SGLang is patched; the cache is constructed as its own unit tests do (no
req_to_token_pool, the allocator passed in, page size 1) and driven through these calls only.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path

ENV = "SGLANG_SRC"


def sglang_root(src) -> Path:
    """The folder holding the `sglang` package of a checkout or an unpacked wheel."""
    p = Path(src)
    for cand in (p / "python", p):
        if (cand / "sglang" / "srt" / "mem_cache" / "radix_cache.py").exists():
            return cand
    raise FileNotFoundError(f"{src}: no sglang/srt/mem_cache/radix_cache.py (a checkout or an unpacked wheel)")


_loaded: dict = {}


def load(src=None):
    """The radix_cache module (and base_prefix_cache, when present) of the installed sglang or of
    `src`. One sglang per process: a second, different `src` raises RuntimeError."""
    src = src or os.environ.get(ENV) or None
    key = str(sglang_root(src)) if src else "installed"
    if _loaded and key not in _loaded:
        raise RuntimeError(f"sglang already loaded from {next(iter(_loaded))}; one per process")
    if key in _loaded:
        return _loaded[key]
    if src:
        sys.path.insert(0, key)
    from targets.sglang import stubs
    stubs.install()
    try:
        rc = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        try:
            bp = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
        except ImportError:
            bp = None
    finally:
        stubs.settle()
    _loaded[key] = Api(rc, bp, key)
    return _loaded[key]


def load_module(name: str, src=None):
    """sglang.srt.mem_cache.<name> of the same sglang `load(src)` uses (loading it first)."""
    load(src)
    from targets.sglang import stubs
    stubs.install()
    try:
        return importlib.import_module(f"sglang.srt.mem_cache.{name}")
    finally:
        stubs.settle()


def version(api) -> str:
    import sglang
    v = getattr(sglang, "__version__", None)
    if v is None:
        try:
            from sglang.version import __version__ as v
        except ImportError:
            v = "unknown"
    return v if api.where == "installed" else f"{v} ({api.where})"


class KeyCalls:
    """The calls every SGLang module adapter shares: index tensors, keys, a key's tokens. ``key`` needs
    ``self.RadixKey`` (None on releases before RadixKey: a plain list)."""

    @staticmethod
    def tensor(values):
        import torch
        return torch.tensor(list(values), dtype=torch.int64)

    def key(self, tokens):
        return self.RadixKey(list(tokens)) if self.RadixKey is not None else list(tokens)

    @staticmethod
    def tokens(key) -> list:
        """A node key's tokens: iterate it (RadixKey.token_ids may be longer than the key: 0.5.x keys
        carry a `limit`)."""
        return [int(x) for x in key]


class Api(KeyCalls):
    def __init__(self, rc, bp, where):
        self.rc, self.bp, self.where = rc, bp, where
        self.RadixCache = rc.RadixCache
        self.RadixKey = getattr(rc, "RadixKey", None)
        self.params = {n: getattr(bp, n, None) for n in ("MatchPrefixParams", "InsertParams", "EvictParams")} \
            if bp else {}
        self.CacheInitParams = None
        try:
            self.CacheInitParams = importlib.import_module("sglang.srt.mem_cache.cache_init_params").CacheInitParams
        except ImportError:
            pass

    # ------------------------------------------------------------ construction
    def make(self, allocator, page_size: int = 1):
        if self.CacheInitParams is not None and "params" in inspect.signature(self.RadixCache.__init__).parameters:
            return self.RadixCache(self.CacheInitParams(disable=False, req_to_token_pool=None,
                                                        token_to_kv_pool_allocator=allocator, page_size=page_size))
        return self.RadixCache(req_to_token_pool=None, token_to_kv_pool_allocator=allocator, page_size=page_size,
                               disable=False)

    # ------------------------------------------------------------ calls
    def match(self, cache, tokens):
        """The last matched node (the matched indices are read off the path by the caller)."""
        P = self.params.get("MatchPrefixParams")
        r = cache.match_prefix(P(key=self.key(tokens))) if P else cache.match_prefix(key=self.key(tokens))
        if hasattr(r, "last_device_node"):
            return r.last_device_node
        return r[1]                       # (value, last_node) in old releases

    def insert(self, cache, tokens, value) -> int:
        P = self.params.get("InsertParams")
        r = cache.insert(P(key=self.key(tokens), value=value)) if P else cache.insert(self.key(tokens), value)
        return int(getattr(r, "prefix_len", r))

    def evict(self, cache, n: int) -> None:
        P = self.params.get("EvictParams")
        cache.evict(P(num_tokens=n)) if P else cache.evict(n)

