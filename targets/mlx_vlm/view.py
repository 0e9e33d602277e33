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
- `counter` is `APCManager.resident_bytes()`, `budget` its `memory_max_bytes`.
- At rest the active path is the root, offset 0, no live content. While a request is open (after
  begin) the request shows its keys, its media items as spans (every item: mlx-vlm promises never to
  resume inside one), matched (the longest common prefix of its keys with a node's key path, capped at
  len - 1) and resume (the prefix length the generator's own lookup returned); the live offset is the
  resume and every layer's live content is what the restored blocks hold (their records).
"""
from __future__ import annotations

from spec.trie import common_prefix
from spec.view import View


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


def view_of(d, request: dict | None = None) -> View:
    layers = [{"kind": "kv", "cost": 1, "window": 0} for _ in d.model.layers]
    nodes = nodes_of(d)
    raw = {"layers": layers, "nodes": nodes, "path": [[]], "offset": 0, "seq": [], "live": [None] * len(layers),
           "counter": int(d.manager.resident_bytes()), "budget": int(d.manager.memory_max_bytes)}
    if request is not None:
        keys, resume = request["keys"], request["resume"]
        live = list(request["live"])
        raw.update(offset=resume, seq=list(keys[:resume]), live=[live] * len(layers),
                   request={"keys": list(keys), "spans": [list(s) for s in request["spans"]],
                            "matched": request["matched"], "resume": resume, "schedule": [],
                            "prefilled": request.get("prefilled", False)})
    return View.from_dict(raw)


def matched(d, keys) -> int:
    """The longest common prefix of `keys` with a node's key path, capped at len - 1."""
    best = max([0] + [common_prefix(tuple(n["keys"]), tuple(keys)) for n in nodes_of(d)])
    return min(best, len(keys) - 1)
