"""Layer caches with snapshots: the sliceable KV cache, the windowed and recurrent whole-state caches,
and the factory that builds them for an mlx-lm model. See base.py for the protocol."""

from .base import CacheError, LayerCache, MergeError, Snapshot, live_snapshots
from .factory import forward, layer_kinds, make_layer_caches
from .kv import KVCache, KVSnapshot
from .recurrent import RecurrentCache, StateSnapshot
from .windowed import WindowedCache, WindowSnapshot
from .chunked import ChunkedCache, ChunkSnapshot
from .composite import KVListCache, PartsSnapshot, StateListCache
from .persist import register as _register

_register(KVCache, WindowedCache, RecurrentCache, ChunkedCache, KVListCache, StateListCache)

__all__ = [
    "CacheError", "MergeError", "Snapshot", "LayerCache", "live_snapshots",
    "KVCache", "KVSnapshot", "WindowedCache", "WindowSnapshot", "RecurrentCache", "StateSnapshot",
    "ChunkedCache", "ChunkSnapshot", "KVListCache", "StateListCache", "PartsSnapshot",
    "make_layer_caches", "forward", "layer_kinds",
]
