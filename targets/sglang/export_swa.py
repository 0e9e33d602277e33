"""A `--cache swa` finding as a standalone pytest test against SGLang's public API: the request-call
replay of targets.sglang.export_req on `SWARadixCache` (window 4 tokens), with an allocator that is an
instance of SGLang's `SWATokenToKVPoolAllocator` (the cache asserts the class) and tags full slots as
export_req's pool does. It asserts S1 and A2 on full slots, no SWA slot freed twice, and A1 on the
full counters (`full_evictable_size_ + full_protected_size_`) after every operation; it fails on the
affected version and passes once fixed. Invariants: no import of this project; the program is
embedded as a literal.
"""
from __future__ import annotations

import json

TEMPLATE = '''"""{title}

Found by prefix-trie-mlx (targets/sglang, --cache swa) on {what}; rule {rule}: {message}
Replays the shrunk program through SGLang's own SWARadixCache request calls (cache_unfinished_req,
cache_finished_req), one request at a time, as the scheduler makes them.
"""
import inspect
from types import SimpleNamespace

import torch
from sglang.srt.mem_cache import radix_cache as rc
from sglang.srt.mem_cache import swa_radix_cache as swa

OPS = {ops}
PAGE, EAGLE, CHUNK, WINDOW = {page}, {eagle}, {chunk}, {window}


class Pool(swa.SWATokenToKVPoolAllocator):
    """Stands for SGLang's SWA allocator (the cache asserts its class; its __init__, which sizes GPU
    pools, is not run): each full slot tagged with the tokens [0, pos] it was written for, with an
    SWA slot of its own; free releases both, free_swa the SWA one."""

    def __init__(self, n=4096):
        self.device, self.free_list, self.held, self.tags, self.double = "cpu", list(range(n - 1, 0, -1)), set(), {{}}, []
        self.swa_of, self.swa_double = {{}}, []

    def free_swa(self, idx, *_, **__):
        for s in [int(x) for x in torch.as_tensor(idx).reshape(-1).tolist()]:
            if self.swa_of.pop(s, None) is None:
                self.swa_double.append(s)

    free_swa_segment = free_swa

    def full_available_size(self):
        return len(self.free_list)

    def swa_available_size(self):
        return 4096

    def alloc(self, seq, a, b):
        out = [self.free_list.pop() for _ in range(b - a)]
        for i, s in enumerate(out):
            self.held.add(s)
            self.tags[s] = tuple(seq[:a + i + 1])
            self.swa_of[s] = True
        return out

    def free(self, idx, *_, **__):
        for s in [int(x) for x in torch.as_tensor(idx).reshape(-1).tolist()]:
            if s not in self.held:
                self.double.append(s)
            else:
                self.swa_of.pop(s, None)
                self.held.discard(s)
                self.free_list.append(s)

    free_segment = free

    def free_group_begin(self):
        pass

    def free_group_end(self):
        pass


class Table:
    """The request-to-token table (one row)."""

    def __init__(self):
        self.req_to_token = torch.zeros((1, 4096), dtype=torch.int64)

    def write(self, index, values):
        self.req_to_token[index] = values

    def free(self, idx):
        pass


class Req(SimpleNamespace):
    def pop_committed_kv_cache(self):
        return self.committed

    def get_fill_ids(self):
        return self.fill_ids


def make(pool, table):
    extra = {{"is_eagle": True}} if EAGLE else {{}}
    sig = inspect.signature(swa.SWARadixCache.__init__).parameters
    if "params" in sig:
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        fields = dict(disable=False, req_to_token_pool=table, token_to_kv_pool_allocator=pool, page_size=PAGE, **extra)
        if "sliding_window_size" in sig:
            return swa.SWARadixCache(CacheInitParams(**fields), sliding_window_size=WINDOW)
        return swa.SWARadixCache(CacheInitParams(**fields, sliding_window_size=WINDOW))
    return swa.SWARadixCache(req_to_token_pool=table, token_to_kv_pool_allocator=pool, sliding_window_size=WINDOW,
                             page_size=PAGE, disable=False, **extra)


def params(name, **kw):
    from sglang.srt.mem_cache import base_prefix_cache as bp
    P = getattr(bp, name, None)
    return (P(**kw),) if P else (), ({{}} if P else kw)


def match(c, t):
    a, kw = params("MatchPrefixParams", key=rc.RadixKey(list(t)))
    r = c.match_prefix(*a, **kw)
    return r[1]


def evict(c, n):
    a, kw = params("EvictParams", num_tokens=n, swa_num_tokens=0)
    c.evict(*a, **kw) if a else c.evict(n, 0)


def tok(k):
    return int(k[0]) if isinstance(k, tuple) else int(k)


def walk(c):
    stack, out = [((), c.root_node)], []
    while stack:
        ks, n = stack.pop()
        out.append((ks, n))
        for ch in n.children.values():
            stack.append((ks + tuple(tok(x) for x in ch.key), ch))
    return out


def path_slots(c, node):
    out = []
    while node is not None and node is not c.root_node:
        out = [int(s) for s in node.value.tolist()] + out
        node = node.parent
    return out


def check(c, pool, table, req):
    total, tree = 0, []
    for ks, n in walk(c):
        if n is c.root_node:
            continue
        slots = [int(s) for s in n.value.tolist()]
        total += len(slots)
        start = len(ks) - len(slots)
        assert len(slots) == len(list(n.key)), f"S1: node {{ks}} holds {{len(slots)}} slots for {{len(list(n.key))}} keys"
        for i, s in enumerate(slots):
            assert s in pool.held, f"A2: node {{ks}} holds slot {{s}}, which the pool has free"
            assert pool.tags[s] == ks[:start + i + 1], f"S1: node {{ks}} slot {{s}} holds another prefix's KV"
        tree += slots
    assert not pool.double, f"A2: slots freed twice: {{pool.double}}"
    own = set(table.req_to_token[0, :len(req["seq"])].tolist()) if req else set()
    leaked = pool.held - set(tree) - own
    assert not leaked, f"A2: slots {{sorted(leaked)}} are neither in the tree nor held by a request (leaked)"
    assert not pool.swa_double, f"A2: SWA slots of {{pool.swa_double}} freed twice"
    assert c.full_evictable_size_ + c.full_protected_size_ == total, \\
        f"A1: full evictable {{c.full_evictable_size_}} + protected {{c.full_protected_size_}} != {{total}} slots held"


def forward(pool, table, req, toks):
    p = len(req["seq"])
    req["seq"] += list(toks)
    table.req_to_token[0, p:len(req["seq"])] = torch.tensor(pool.alloc(req["seq"], p, len(req["seq"])))


def sync(req, closing=False):
    f, seq, n = req["req"], list(req["seq"]), len(req["keys"])
    f.origin_input_ids, f.output_ids = seq[:n], seq[n:] + [0]
    f.fill_ids = seq[:n] if closing else seq
    f.committed = len(seq)


def unfinished(c, req):
    sync(req)
    fn = c.cache_unfinished_req
    fn(req["req"], chunked=True) if "chunked" in inspect.signature(fn).parameters else fn(req["req"])


def prefill(c, pool, table, req, max_chunks=None):
    end, chunk, done = len(req["keys"]) - 1, -(-CHUNK // PAGE) * PAGE, 0
    while len(req["seq"]) < end and (max_chunks is None or done < max_chunks):
        q = min(end, len(req["seq"]) + chunk)
        forward(pool, table, req, req["keys"][len(req["seq"]):q])
        if q % PAGE == 0:
            unfinished(c, req)
        done += 1


def test_{name}():
    pool, table, budget, req = Pool(), Table(), OPS[0].get("budget", 1 << 40), None
    c = make(pool, table)
    for op in OPS[1:]:
        if op["op"] == "begin":
            keys = list(op["keys"])
            node = match(c, keys[:-1])
            slots = path_slots(c, node)
            uuid = c.inc_lock_ref(node)
            uuid = getattr(uuid, "swa_uuid_for_lock", uuid)
            table.req_to_token[0, :len(slots)] = torch.tensor(slots, dtype=torch.int64)
            m = len(slots)
            f = Req(rid="r", req_pool_idx=0, origin_input_ids=keys, output_ids=[], fill_ids=keys,
                    prefix_indices=torch.tensor(slots, dtype=torch.int64), last_node=node, extra_key=None,
                    cache_salt=None, priority=0, cache_protected_len=m, last_matched_prefix_len=m, committed=0,
                    swa_uuid_for_lock=uuid, swa_evicted_seqlen=0, swa_prefix_lock_released=False)
            f.kv = f
            req = dict(keys=keys, seq=keys[:m], req=f)
        elif op["op"] == "prefill":
            prefill(c, pool, table, req, op.get("max_chunks"))
        elif op["op"] == "step":
            forward(pool, table, req, [op["key"]])
        elif op["op"] == "close":
            if len(req["seq"]) < len(req["keys"]):       # a request finishes only after its prefill
                prefill(c, pool, table, req)
                forward(pool, table, req, req["keys"][len(req["seq"]):])
            sync(req, closing=True)
            c.cache_finished_req(req["req"])
            req = None
        if op["op"] in ("close", "set_budget"):
            budget = op.get("budget", budget)
            if req is None:
                over = sum(len(m.value) for _, m in walk(c) if m is not c.root_node) - budget // 4
                if over > 0:
                    evict(c, over)
        check(c, pool, table, req)
'''


def export(rule: str, what: str, message: str, ops: list, page_size: int = 1, eagle: bool = False,
           chunk: int = 8, window: int = 4) -> str:
    name = f"{rule.lower()}_swa_radix_cache_requests" + ("_eagle" if eagle else "")
    body = "[\n" + ",\n".join("    " + json.dumps({k: v for k, v in o.items() if k not in ("tokens", "media")})
                              for o in ops) + "\n]"
    title = f"SGLang SWARadixCache{' (EAGLE bigram keys)' if eagle else ''}, page size {page_size}: rule {rule} broken"
    return TEMPLATE.format(title=title, what=what, rule=rule, message=message.replace('"', "'"), ops=body,
                           page=page_size, eagle=eagle, chunk=chunk, window=window, name=name)
