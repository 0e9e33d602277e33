"""vLLM's prefix cache as the read-only view (spec.view) the rules read -- in units of blocks.

vLLM caches whole blocks named by a hash chain, and only ever resumes at a block end, so the view's
alphabet is blocks: a view key is a block's token tuple, interned to a small int (the target's
`ids`), and offsets count blocks. A request's keys are the full blocks of its prompt but the last
token, then one key for the rest (so the decode-seed back-off of the rules is vLLM's cap at
num_tokens - 1, floored to a block).

Mapping (invariants):
- Nodes: for every (hash, group, block) in BlockPool's hash map whose hash the adapter has seen a
  request compute (hash -> token prefix), the node at that prefix and all its ancestors; each node
  is one block [e - 1, e). Unknown hashes are counted in `unknown` (none expected).
- Layers, one per KV cache group: full attention -> "kv" (a snapshot per cached block, content =
  the tags the block holds, ident = block id, 1 unit); sliding window -> "windowed" with window
  engine.window_blocks() (a snapshot at node e when the blocks covering the last WINDOW - 1
  positions before e are all cached on this path; content = their tags; 0 units: the blocks are
  shared by neighbouring states); Mamba -> "recurrent" (a snapshot per cached block; content = the
  prefix whose state the block holds; ident = block id; 1 unit). Where one hash maps to several
  blocks (vLLM does not de-duplicate), the snapshot counts them all (units) and shows a block whose
  content is wrong, if any.
- counter: pool blocks whose metadata holds a hash, sliding-window groups excepted (A1 then states
  that the hash map and the blocks' own hashes agree); budget: 2**62 (the pool is fixed).
- last_used: the adapter's clock of the block's last use (a hit, a computed chunk, a free).
- Active path: after begin, root to the node at the hit (resume), with the live content what the
  served blocks hold (C1: content identity); otherwise (and for a request the pool refused) the root
  alone at offset 0.
"""
from __future__ import annotations

from spec.view import View

from targets.vllm.engine import BLOCK, window_blocks


def intern(t, tup) -> int:
    k = t.ids.get(tup)
    if k is None:
        k = t.ids[tup] = len(t.ids) + 1
    return k


def blocks_of(t, tokens) -> tuple:
    return tuple(intern(t, tuple(tokens[i:i + BLOCK])) for i in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK))


def request_keys(t, keys) -> tuple:
    q = (len(keys) - 1) // BLOCK
    return blocks_of(t, keys[:q * BLOCK]) + (intern(t, ("tail",) + tuple(keys[q * BLOCK:])),)


def _content(t, tags, start_pos):
    if tags is None:
        return intern(t, ("unwritten",))
    return intern(t, tuple(tags.get(start_pos + j) for j in range(BLOCK)))


def state_of(t, prefix) -> tuple:
    """A Mamba tag (token prefix) as a block-key sequence; (-1,) when it is no block end's state."""
    if prefix is None or len(prefix) % BLOCK:
        return (-1,)
    return blocks_of(t, prefix)


def view_of(t) -> View:
    kinds = t.kinds
    wb = window_blocks()
    layers = [{"kind": {"full": "kv", "swa": "windowed", "mamba": "recurrent"}[k], "cost": 1,
               "window": wb if k == "swa" else 0} for k in kinds]
    cached = {}                          # (token prefix, group) -> [block ids]
    t.unknown = 0
    for h, g, bid in t.engine.cached(t.m):
        path = t.paths.get(h)
        if path is None:
            t.unknown += 1
            continue
        cached.setdefault((path, g), []).append(bid)
    prefixes = {()}
    for (path, _g) in cached:
        for e in range(BLOCK, len(path) + 1, BLOCK):
            prefixes.add(path[:e])
    nodes = []
    for path in sorted(prefixes, key=len):
        e = len(path) // BLOCK
        vkeys = blocks_of(t, path)
        snaps = []
        for g, kind in enumerate(kinds):
            if not path:
                break
            if kind == "full" and (path, g) in cached:
                bids = cached[(path, g)]
                conts = [_content(t, t.tags.get(b), (e - 1) * BLOCK) for b in bids]
                pick = next((i for i, c in enumerate(conts) if c != vkeys[-1]), 0)
                snaps.append({"layer": g, "kind": "kv", "start": e - 1, "end": e, "bytes": len(bids),
                              "content": [conts[pick]], "ident": bids[pick]})
            elif kind == "swa":
                lo = max(1, e - wb + 1)
                need = [path[:i * BLOCK] for i in range(lo, e + 1)]
                if all((p, g) in cached for p in need):
                    cont = [_content(t, t.tags.get(cached[(p, g)][0]), len(p) - BLOCK) for p in need]
                    snaps.append({"layer": g, "kind": "windowed", "start": e, "end": e, "bytes": 0,
                                  "content": cont})
            elif kind == "mamba" and (path, g) in cached:
                bids = cached[(path, g)]
                conts = [state_of(t, t.mtags.get(b)) for b in bids]
                pick = next((i for i, c in enumerate(conts) if c != vkeys), 0)
                snaps.append({"layer": g, "kind": "recurrent", "start": e, "end": e, "bytes": len(bids),
                              "content": list(conts[pick]), "ident": bids[pick]})
        last = t.last.get(path, 0)
        nodes.append({"keys": list(vkeys), "start": max(0, e - 1), "user": False, "last_used": last,
                      "snaps": snaps})
    counter = sum(1 for g, _ in t.engine.hashed(t.m) if kinds[g] != "swa")
    d = {"layers": layers, "nodes": nodes, "path": [[]], "offset": 0, "seq": [], "live": [None] * len(kinds),
         "counter": counter, "budget": 1 << 62, "clock": t.clock}
    r = t.req
    if r is not None and not r["refused"]:          # a refused request holds nothing: shown as idle
        vkeys = request_keys(t, r["keys"])
        nb = r["hit"] // BLOCK
        chunks = [(p // BLOCK, -(-q // BLOCK)) for p, q in r["chunks"]]
        d["request"] = {"keys": list(vkeys), "spans": [], "matched": t.outcome_begin[0],
                        "resume": nb, "schedule": [[r["boundary"] // BLOCK, True]] if r["boundary"] else [],
                        "chunks": chunks, "prefilled": bool(r["prefilled"])}
        if not chunks and not r["prefilled"]:
            d["path"] = [list(vkeys[:i]) for i in range(nb + 1)]
            d["offset"] = nb
            d["seq"] = list(vkeys[:nb])
            live = []
            for g, kind in enumerate(kinds):
                got = r["live"][g]
                if kind == "mamba":
                    live.append(list(state_of(t, got[1])) if nb else [])
                else:
                    live.append([intern(t, b) if b is not None else intern(t, ("null block",)) for b in got])
            d["live"] = live
    return View.from_dict(d)
