"""SGLang's MambaRadixCache as the read-only view (spec.view) the rules read: targets.sglang.view's
full-attention view plus a recurrent layer.

Mapping (invariants), in addition to targets/sglang/view.py:
- layer 1 is "recurrent"; a node whose `mamba_value` is set offers a state at its end e; that
  snapshot's content is the token prefix its state slot was tagged with (MambaTagPool: the prefix whose
  state the slot holds), or a marker when the slot is free or unwritten, so S2 judges it against the
  node's key path (content identity); 0 bytes (the budget is judged on KV tokens; the state count has
  its own counter below); ident ("mamba", slot);
- a node without a state (a mamba tombstone, a split head) offers none: SGLang's match backs off to
  the deepest node with a state, which C2 then judges as the deepest restore point;
- the request's live state is its state slot's tag (C1: equal to its evaluated keys);
- S2's capture clause is waived: a begin resuming below its match shows a capture scheduled at the
  match. SGLang without the extra buffer (the mode driven) caches states only at the ends it inserts
  (chunk ends, the request's end); its branch-point tracking (`mamba_branching_seqlen`) serves the
  extra-buffer mode only. S2 judges the states' content; C2 the resume;
- counter: full_evictable + full_protected, plus the error of the mamba pair (mamba_evictable +
  mamba_protected minus the nodes holding a state): A1 holds only if both agree with the tree;
- A2 on state slots: a slot freed twice, a node holding a free slot, a slot allocated but neither in
  the tree nor the open request's.
"""
from __future__ import annotations

from spec.view import View

from targets.sglang.view import UNIT, view_dict

STALE = ("stale state",)


def _state(pool, slot: int, n: int) -> list:
    t = pool.content(slot)
    return list(t) if t is not None and len(t) == n else [STALE] * max(n, 1)


def view_of(t) -> View:
    d = view_dict(t)
    add_states(d, t, 1)
    return View.from_dict(d)


def add_states(d: dict, t, layer: int) -> dict:
    """d (view_dict(t), maybe with other layers) with the recurrent layer as layer `layer`."""
    p = t.mpool
    d["layers"].append({"kind": "recurrent", "cost": 1, "window": 0})
    by_keys = {tuple(n["keys"]): n for n in d["nodes"]}
    held, released = set(), list(d["released"])
    for keys, _start, n in t.nodes():
        if n is t.cache.root_node or n.mamba_value is None:
            continue
        slots = [int(x) for x in n.mamba_value.tolist()]
        held.update(slots)
        s = slots[0] if slots else -1
        if any(x not in p.allocated for x in slots):
            released.append(("mamba", s))
        e = len(keys)
        by_keys[tuple(keys)]["snaps"].append({"layer": layer, "kind": "recurrent", "start": e, "end": e, "bytes": 0,
                                              "ident": ("mamba", s), "content": _state(p, s, e)})
    for s in p.double_frees:
        released += [("mamba", s), ("mamba", s)]
    f = getattr(t.fake, "kv", t.fake)                    # the request's kv record (0.5.20 on) or itself
    own = {int(f.mamba_pool_idx)} if f is not None and f.mamba_pool_idx is not None else set()
    leaked = [("mamba", s) for s in p.allocated if s not in held and s not in own]
    if leaked:
        d["created"] = (d["created"] or []) + leaked
    d["released"] = released
    if t.req is None:
        d["live"].append([])
    else:
        off = len(t.req["seq"])
        d["live"].append(_state(p, next(iter(own)), off) if own and off else [STALE] * off)
    q = d["request"]
    if q is not None and q["resume"] < q["matched"]:
        q["schedule"] = [[q["matched"], True]]
    d["counter"] += UNIT * (t.mamba_counted() - len(t.mamba_nodes()))
    return d
