"""One request's state and figures while it runs through the prefix cache
(impl/prefix_cache.py; spec.cache.Request is its spec)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    """One request's figures: prompt keys, matched, resumed at, prefilled (keys
    evaluated before decode), captures attached, nodes evicted from begin to close,
    and the prefill's forwards [p, q) (set at close)."""
    total: int = 0
    matched: int = 0
    resumed: int = 0
    prefilled: int = 0
    captures: int = 0
    evictions: int = 0
    chunks: tuple = ()


@dataclass
class Request:
    keys: tuple
    spans: list
    matched: int
    resume: int
    schedule: list
    chunks: list = field(default_factory=list)
    prefilled: bool = False
    stats: Stats = field(default_factory=Stats)
    evictions_before: int = 0     # the eviction count when the request began
