"""LRUPromptCache's state as the read-only view (spec.view) the rules read, as far as its design allows.

Mapping (invariants):
- Each stored entry is a path from the root whose end node holds every layer's state: a KV layer
  (KVCache, RotatingKVCache within its window) as kind "kv" / "windowed" over [0, end) (the entry owns a
  full copy, not an edge slice), an ArraysCache layer as kind "recurrent" at end. `nbytes` is the
  layer cache's own `nbytes`; `content` is None (the target cannot show token contents).
- Nodes are the compressed trie of the entry keys: an entry's end, or a branch point of two entries
  (no snapshots), or the root. Node identity is the key path; parent = the nearest kept ancestor.
- `last_used` is the checker's record of the entry's last insert or serving fetch (0 for branch
  points); the active path is the root alone (no live cache persists between requests).
- `counter` is LRUPromptCache.nbytes; `budget` is --prompt-cache-bytes (2**63 when unset).
"""
from __future__ import annotations

from spec.view import View

KIND = {"KVCache": "kv", "RotatingKVCache": "windowed", "ArraysCache": "recurrent"}


def view_of(d, last_used=None) -> View:
    from targets.mlx_lm.adapter import MODEL_KEY
    last_used = last_used if last_used is not None else getattr(d.observer, "last_used", {}) or {}
    entries = {}
    root = d.lru._trie._trie.get(MODEL_KEY)
    stack = [((), root)] if root is not None else []
    children = {}
    while stack:
        keys, node = stack.pop()
        kids = [t for t in node if t != "__value__"]
        children[keys] = len(kids)
        if "__value__" in node:
            entries[keys] = node["__value__"]
        for t in kids:
            stack.append((keys + (t,), node[t]))
    kept = sorted({()} | set(entries) | {k for k, n in children.items() if n >= 2}, key=len)
    kept_set = set(kept)
    caches = next(iter(entries.values())).prompt_cache if entries else []
    layers = [{"kind": KIND.get(type(c).__name__, "kv"), "cost": 1,
               "window": getattr(c, "max_size", 0) or 0} for c in caches]
    nodes = []
    for k in kept:
        start = 0
        for i in range(len(k) - 1, -1, -1):
            if k[:i] in kept_set:
                start = i
                break
        snaps = []
        if k in entries:
            for i, c in enumerate(entries[k].prompt_cache):
                kind = layers[i]["kind"] if i < len(layers) else "kv"
                lo = 0 if kind != "recurrent" else len(k)
                snaps.append({"layer": i, "kind": kind, "start": lo, "end": len(k), "bytes": int(c.nbytes)})
        nodes.append({"keys": list(k), "start": start, "user": False, "last_used": last_used.get(k, 0),
                      "snaps": snaps})
    budget = d.prompt_cache_bytes if d.prompt_cache_bytes is not None else 1 << 63
    return View.from_dict({"layers": layers, "nodes": nodes, "path": [[]], "offset": 0, "seq": [],
                           "live": [None] * len(layers), "counter": int(d.lru.nbytes), "budget": budget})
