"""SGLang's radix tree as the read-only view (spec.view) the rules read.

Mapping (invariants):
- one layer, kind "kv" (full attention; the tree's node values are KV slot indices);
- each radix node is a view node with the same key path and start; its KV snapshot spans
  [start, start + len(value)) and its content is, slot by slot, the key the slot was written for
  when the slot is allocated and was written for that very prefix (TagAllocator.content), else a
  marker no key equals: S1 then sees a slot holding another prefix's KV (content identity);
- `bytes` = UNIT x len(value); `counter` = UNIT x (evictable_size_ + protected_size_), SGLang's own
  counters; `budget` is the budget last enforced (a change waits until no request holds the tree);
- `last_used` is the newest last_access_time (SGLang's LRU clock, integer nanoseconds) in the node's
  subtree, ever (kept by the target across views): using a node's KV reads every ancestor's (the
  prefix it attends to), and SGLang stamps a new leaf after its path, so an ancestor is used
  whenever a descendant is;
- the active path is the request's locked path (root -> its last node); idle: the root alone;
  `live` is what the request's slots hold for positions [0, offset) (C1 compares it with the keys);
- A2 on KV slots: a slot freed twice shows as an ident released twice; a slot a node holds while
  the pool has it free shows as that node's snapshot released; a slot allocated but neither in the
  tree nor held by the open request shows as created and lost (a leak).
"""
from __future__ import annotations

from spec.view import View


UNIT = 4            # bytes the view counts per cached token (the machine's budgets are in bytes)


def clock(n) -> int:
    """A node's last_access_time as an integer clock, the same in every view (nanoseconds)."""
    return int(round(float(getattr(n, "last_access_time", 0.0)) * 1e9))


def view_of(t) -> View:
    return View.from_dict(view_dict(t))


def view_dict(t) -> dict:
    """The view as spec.view's dict (targets.sglang.swa adds its windowed layer to it)."""
    a = t.alloc
    entries = t.nodes()
    root = t.cache.root_node
    used = t.used                                          # node -> newest clock its subtree has had
    for keys, _, n in sorted(entries, key=lambda e: -len(e[0])):
        used[n] = max([used.get(n, 0), clock(n)] + [used[c] for c in n.children.values()])
    nodes, held, released = [], set(), []
    for keys, start, n in entries:
        snaps = []
        if n is not root:
            slots = [int(s) for s in n.value.tolist()]
            held.update(slots)
            ident = ("node", id(n))
            if any(s not in a.allocated for s in slots):
                released.append(ident)                    # held by the tree, free in the pool
            snaps.append({"layer": 0, "kind": "kv", "start": start, "end": start + len(slots),
                          "bytes": UNIT * len(slots), "ident": ident,
                          "content": [a.content(s, start + i) for i, s in enumerate(slots)]})
        nodes.append({"keys": list(keys), "start": start, "user": False,
                      "last_used": used[n], "snaps": snaps})
    for s in a.double_frees:
        released += [("slot", s), ("slot", s)]
    r = t.req
    created = None
    live_slots = set(r["slots"]) if r else set()
    leaked = [s for s in a.allocated if s not in held and s not in live_slots]
    if leaked:
        created = [("slot", s) for s in leaked]
    if r is None:
        path, offset, seq, live, req = [[]], 0, [], [[]], None
    else:
        path = [[]] + [list(t.keys_of(n)) for n in t.path_of(r["node"])]
        seq = list(r["seq"])
        offset = len(seq)
        live = [[a.content(s, i) for i, s in enumerate(r["slots"])]]
        req = {"keys": list(r["keys"]), "spans": [], "matched": r["matched"], "resume": r["resume"],
               "schedule": [], "chunks": [list(c) for c in r["chunks"]], "prefilled": r["prefilled"]}
    counter = UNIT * t.counted()
    return {"layers": [{"kind": "kv", "cost": 1, "window": 0}], "nodes": nodes, "path": path,
            "offset": offset, "seq": seq, "live": live, "counter": counter,
            "budget": t.shown_budget, "clock": t.clock, "request": req,
            "released": released, "created": created}
