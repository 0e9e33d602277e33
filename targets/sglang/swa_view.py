"""SGLang's SWARadixCache as the read-only view (spec.view) the rules read: targets.sglang.view's
full-attention view plus a windowed layer.

Mapping (invariants), in addition to targets/sglang/view.py:
- layer 1 is "windowed" with window W (the cache's sliding_window_size);
- a node offers a window state at its end e when SGLang's own match would stop there: no tombstone on
  its path, or at least W non-tombstone tokens since the last one (`_match_prefix_helper`'s criterion);
  that snapshot's content is, per position of [max(0, e - W), e), what the SWA slot mapped from the
  path's full slot holds (SwaTagPool.swa_content: the key it was written for, or a marker when the
  slot was released or written for another prefix), so S2 judges it against the prefix's last W keys;
- the request's live window is the SWA content of its slots for the last W positions (C1);
- a begin resuming below its match schedules a capture at the match: SGLang's next insert of the
  request's evaluated prefix (cache_unfinished_req / cache_finished_req) gives the tombstoned nodes
  on it the request's SWA slots again (`_insert_helper`'s tombstone recovery);
- counter: full_evictable + full_protected, plus the error of the SWA counters (swa_evictable +
  swa_protected minus the non-tombstone tokens): A1 holds only if both pairs agree with the tree;
- A2 on SWA slots too: an SWA slot freed twice, held by a non-tombstone node while free, or allocated
  but neither in the tree nor the open request's.
"""
from __future__ import annotations

from spec.view import View

from targets.sglang.view import UNIT, view_dict


def view_of(t) -> View:
    d = view_dict(t)
    add_window(d, t, 1)
    return View.from_dict(d)


def add_window(d: dict, t, layer: int) -> dict:
    """d (view_dict(t), maybe with other layers) with the windowed layer as layer `layer`. A node whose
    own SWA indices are readable (`swa_value`: UnifiedRadixCache's SWA component) and differ from what
    the pool maps its full slots to shows those positions' content as a marker (the tree would free
    other slots than the ones a hit reads)."""
    a, W = t.alloc, t.window
    d["layers"].append({"kind": "windowed", "cost": 1, "window": W})
    root = t.cache.root_node
    by_keys = {tuple(n["keys"]): n for n in d["nodes"]}
    swa_held, released = set(), list(d["released"])
    for keys, start, n in t.nodes():
        if n is root:
            continue
        path = t.path_of(n)
        since = None                                     # non-tombstone tokens since the last tombstone
        for m in path:
            if getattr(m, "swa_tombstone", False):
                since = 0
            elif since is not None:
                since += len(m.value)
        slots = t.slots_of(n)
        off = 0
        for m in path:
            own = getattr(m, "swa_value", None)
            full = [int(x) for x in m.value.tolist()]
            if own is not None and [int(x) for x in own.tolist()] != [a.mapping.get(s, 0) for s in full]:
                slots[off:off + len(full)] = [("swa value differs", s) for s in full]
            off += len(full)
        if not getattr(n, "swa_tombstone", False):
            for s in (int(x) for x in n.value.tolist()):
                w = a.mapping.get(s, 0)
                swa_held.add(w)
                if not w or w not in a.swa_allocated:
                    released.append(("swa of", ("node", id(n))))
        e = len(keys)
        if since is None or since >= W:
            lo = max(0, e - W)
            by_keys[tuple(keys)]["snaps"].append(
                {"layer": layer, "kind": "windowed", "start": e, "end": e, "bytes": 0,
                 "content": [a.swa_content(slots[p], p) for p in range(lo, e)]})
    for w in a.swa_double_frees:
        released += [("swa", w), ("swa", w)]
    r = t.req
    live_swa = {a.mapping.get(s, 0) for s in r["slots"]} if r else set()
    leaked = [("swa", w) for w in a.swa_allocated if w not in swa_held and w not in live_swa]
    if leaked:
        d["created"] = (d["created"] or []) + leaked
    d["released"] = released
    if r is None:
        d["live"].append([])
    else:
        off = len(r["seq"])
        d["live"].append([a.swa_content(r["slots"][p], p) for p in range(max(0, off - W), off)])
    q = d["request"]
    if q is not None and q["resume"] < q["matched"]:
        q["schedule"] = [[q["matched"], True]]
    d["counter"] += UNIT * (t.swa_counted() - t.swa_cached())
    return d
