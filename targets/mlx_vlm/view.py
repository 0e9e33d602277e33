"""mlx-vlm's APC state as the read-only view (spec.view) the rules read.

Mapping (invariants):
- Every block the cache holds (in `APCManager.hash_table`, or on its disk tier: `DiskBlockStore.has`)
  whose whole hash chain back to the seed is held is one node. Its key path is the recorded contents
  (driver.content: the keys its K/V were computed from) of the chain's blocks, so a block stored under
  one image and reused for another shows the first image's keys. Its edge is one block: [start, end)
  with end - start = the block size. Two blocks with equal contents but different salts (the request's
  media hash) show as one node whose snapshots' bytes add up both copies'.
- Each node has one KV snapshot per language-model layer over its edge: `bytes` is the memory block's
  K and V `nbytes` for that layer (0 for a block held on disk only), `content` its recorded keys.
- Checkpoints (APC's mode for models with recurrent or windowed layers: whole prompt-cache snapshots,
  in memory `_exact_cache` or on disk) are nodes of a compressed trie of their recorded contents (plus
  branch points, without state): KV layers [0, end) (a full copy), recurrent layers at end, windowed
  layers (RotatingKVCache) at end holding the last `max_size` keys; bytes from the memory copy, 0 on
  disk only.
- `counter` is `APCManager.resident_bytes()`, `budget` its `memory_max_bytes`.
- At rest the active path is the root, offset 0, no live content. While a request is open (after
  begin) the request shows its keys, its media items as spans (every item: mlx-vlm promises never to
  resume inside one), matched (the longest common prefix of its keys with a node's key path, capped at
  len - 1) and resume (the prefix length the generator's own lookup returned); the live offset is the
  resume and every layer's live content is what the restored blocks hold (their records; a windowed
  layer: their last `window` keys).
"""
from __future__ import annotations

from spec.trie import WINDOWED, Layer, common_prefix, state_content
from spec.view import View


def as_layer(layer: dict) -> Layer:
    return Layer(layer["kind"], layer["cost"], layer["window"])


def nodes_of(d) -> list:
    m = d.manager
    held = {h for h in d.content if d.present(h)}
    paths: dict = {}

    def path(h):
        if h in paths:
            return paths[h]
        parent = d.links[h]
        if parent == d.apc.SEED_PARENT_HASH:
            head = ()
        elif parent in held:
            head = path(parent)
        else:
            head = None
        paths[h] = None if head is None else head + tuple(d.content[h])
        return paths[h]

    nodes = {(): {"keys": [], "start": 0, "user": False, "last_used": 0, "snaps": []}}
    for h in sorted(held, key=lambda h: len(path(h) or ())):
        keys = path(h)
        if keys is None:
            continue
        start = len(keys) - d.block
        block = m.hash_table.get(h)
        kv = block.kv_handle() if block is not None else None
        if keys not in nodes:
            snaps = [{"layer": i, "kind": "kv", "start": start, "end": len(keys), "bytes": 0,
                      "content": list(d.content[h])} for i in range(len(d.model.layers))]
            nodes[keys] = {"keys": list(keys), "start": start, "user": False, "last_used": 0, "snaps": snaps}
        for i, snap in enumerate(nodes[keys]["snaps"]):            # copies under other salts add up
            if kv is not None and kv.keys is not None:
                snap["bytes"] += int(kv.keys[i].nbytes) + int(kv.values[i].nbytes)
    return list(nodes.values())


def layers_of(d) -> list:
    """One spec layer per language-model layer: ArraysCache recurrent, RotatingKVCache windowed (its
    max_size), anything else KV."""
    lm = d.model.language_model if hasattr(d.model, "language_model") else d.model
    made = lm.make_cache() if hasattr(lm, "make_cache") else [None] * len(d.model.layers)
    out = []
    for c in made:
        name = type(c).__name__
        if name == "RotatingKVCache":
            out.append({"kind": WINDOWED, "cost": 1, "window": int(c.max_size)})
        else:
            out.append({"kind": "recurrent" if name == "ArraysCache" else "kv", "cost": 1, "window": 0})
    return out


def checkpoint_nodes(d) -> list:
    """Checkpoints (token ids, salt) held in memory or on disk, as a compressed trie of their recorded
    contents: each a node with its layers' state for [0, end) (KV) or at end (recurrent)."""
    held = {}
    for e, content in d.exact.items():
        if d.present_exact(e):
            held.setdefault(tuple(content), []).append(e)
    if not held:
        return []
    mem = {(x.token_ids, x.extra_hash): x for x in d.manager._exact_cache.values()}
    kids: dict = {}
    for path in held:
        for q in held:
            if q != path and q[:len(path)] == path:
                kids.setdefault(path, set()).add(q[len(path)])
    branch = {p[:n] for a in held for b in held for p in (a,) if a != b
              for n in [common_prefix(a, b)] if 0 < n < min(len(a), len(b))}
    kept = sorted(set(held) | branch, key=len)
    out = []
    for path in kept:
        start = max([len(q) for q in kept if len(q) < len(path) and path[:len(q)] == q] + [0])
        snaps = []
        for i, layer in enumerate(layers_of(d)):
            size = sum(int(mem[e].prompt_cache[i].nbytes) for e in held.get(path, ()) if e in mem)
            if path in held:
                kind = layer["kind"]
                snaps.append({"layer": i, "kind": kind, "start": 0 if kind == "kv" else len(path), "end": len(path),
                              "bytes": size, "content": list(state_content(as_layer(layer), path))})
        out.append({"keys": list(path), "start": start, "user": False, "last_used": 0, "snaps": snaps})
    return out


def view_of(d, request: dict | None = None) -> View:
    layers = layers_of(d)
    nodes = nodes_of(d)
    nodes += [n for n in checkpoint_nodes(d) if n["keys"] and tuple(n["keys"]) not in {tuple(m["keys"]) for m in nodes}]
    raw = {"layers": layers, "nodes": nodes, "path": [[]], "offset": 0, "seq": [], "live": [None] * len(layers),
           "counter": int(d.manager.resident_bytes()), "budget": int(d.manager.memory_max_bytes)}
    if request is not None:
        keys, resume = request["keys"], request["resume"]
        live = tuple(request["live"])
        raw.update(offset=resume, seq=list(keys[:resume]),
                   live=[list(state_content(as_layer(layer), live)) for layer in layers],
                   request={"keys": list(keys), "spans": [list(s) for s in request["spans"]],
                            "matched": request["matched"], "resume": resume, "schedule": [],
                            "prefilled": request.get("prefilled", False)})
    return View.from_dict(raw)


def matched(d, keys) -> int:
    """The longest common prefix of `keys` with a node's key path, capped at len - 1."""
    best = max([0] + [common_prefix(tuple(n["keys"]), tuple(keys)) for n in nodes_of(d) + checkpoint_nodes(d)])
    return min(best, len(keys) - 1)
