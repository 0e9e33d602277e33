"""A finding's program as a standalone pytest test against SGLang's public radix-cache API.

The test builds `RadixCache` as SGLang's own unit tests do (CacheInitParams in 0.5.x, keyword
arguments before), with a small KV pool that tags each slot with the prefix it was written for, replays
the program's requests with the scheduler's cache calls (match_prefix, insert, free of duplicates,
inc/dec_lock_ref, evict), and asserts, after every operation, what the tree itself shows:
  S1  every node's value has as many slots as its key, each holding that node's prefix (content);
  C1  the slots a match serves hold exactly the prompt's prefix;
  C2  (page size 1) the match is the longest cached prefix of the prompt, capped at len - 1;
  A1  evictable_size_ + protected_size_ equals the slots the tree holds;
  A2  no slot freed twice, none held by the tree while free.
It needs only sglang (and torch) importable; it fails on the affected version and passes once fixed.
Invariants: no import of this project; the program is embedded as a literal.
"""
from __future__ import annotations

import json

TEMPLATE = '''"""{title}

Found by prefix-trie-mlx (targets/sglang) on {what}; rule {rule}: {message}
Replays the shrunk program with SGLang's own RadixCache and the scheduler's cache calls.
"""
import inspect

import torch
from sglang.srt.mem_cache import radix_cache as rc

OPS = {ops}
PAGE = {page}


class Pool:
    def __init__(self, n=4096):
        self.device, self.free_list, self.held, self.tags, self.double = "cpu", list(range(n - 1, 0, -1)), set(), {{}}, []

    def alloc(self, seq, a, b):
        out = [self.free_list.pop() for _ in range(b - a)]
        for i, s in enumerate(out):
            self.held.add(s)
            self.tags[s] = tuple(seq[:a + i + 1])
        return out

    def free(self, idx, *_, **__):
        for s in [int(x) for x in torch.as_tensor(idx).reshape(-1).tolist()]:
            if s not in self.held:
                self.double.append(s)
            else:
                self.held.discard(s)
                self.free_list.append(s)

    free_segment = free

    def free_group_begin(self):
        pass

    def free_group_end(self):
        pass


def make(pool):
    if "params" in inspect.signature(rc.RadixCache.__init__).parameters:
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        return rc.RadixCache(CacheInitParams(disable=False, req_to_token_pool=None,
                                             token_to_kv_pool_allocator=pool, page_size=PAGE))
    return rc.RadixCache(req_to_token_pool=None, token_to_kv_pool_allocator=pool, page_size=PAGE, disable=False)


def key(t):
    return rc.RadixKey(list(t)) if hasattr(rc, "RadixKey") else list(t)


def match(c, t):
    from sglang.srt.mem_cache import base_prefix_cache as bp
    P = getattr(bp, "MatchPrefixParams", None)
    r = c.match_prefix(P(key=key(t))) if P else c.match_prefix(key=key(t))
    return r.last_device_node if hasattr(r, "last_device_node") else r[1]


def insert(c, t, v):
    from sglang.srt.mem_cache import base_prefix_cache as bp
    P = getattr(bp, "InsertParams", None)
    r = c.insert(P(key=key(t), value=v)) if P else c.insert(key(t), v)
    return int(getattr(r, "prefix_len", r))


def evict(c, n):
    from sglang.srt.mem_cache import base_prefix_cache as bp
    P = getattr(bp, "EvictParams", None)
    c.evict(P(num_tokens=n)) if P else c.evict(n)


def path(c, node):
    out = []
    while node is not None and node is not c.root_node:
        out.append(node)
        node = node.parent
    return out[::-1]


def walk(c):
    stack, out = [((), c.root_node)], []
    while stack:
        ks, n = stack.pop()
        out.append((ks, n))
        for ch in n.children.values():
            stack.append((ks + tuple(int(x) for x in ch.key), ch))
    return out


def check(c, pool):
    total = 0
    for ks, n in walk(c):
        if n is c.root_node:
            continue
        slots = [int(s) for s in n.value.tolist()]
        total += len(slots)
        start = len(ks) - len(n.key)
        assert len(slots) == len(n.key), f"S1: node {{ks}} holds {{len(slots)}} slots for {{len(n.key)}} keys"
        for i, s in enumerate(slots):
            assert s in pool.held, f"A2: node {{ks}} holds slot {{s}}, which the pool has free"
            assert pool.tags[s] == ks[:start + i + 1], f"S1: node {{ks}} slot {{s}} holds another prefix's KV"
    assert not pool.double, f"A2: slots freed twice: {{pool.double}}"
    assert c.evictable_size_ + c.protected_size_ == total, \\
        f"A1: evictable {{c.evictable_size_}} + protected {{c.protected_size_}} != {{total}} slots held"


def test_{name}():
    pool, budget, req = Pool(), 1 << 40, None
    c = make(pool)
    for op in OPS[1:]:
        if op["op"] == "begin":
            keys = list(op["keys"])
            longest = max([0] + [sum(1 for _ in __import__("itertools").takewhile(lambda p: p[0] == p[1],
                                                                              zip(ks, keys))) for ks, _ in walk(c)])
            node = match(c, keys[:-1])
            slots = [int(s) for n in path(c, node) for s in n.value.tolist()]
            assert all(pool.tags.get(s) == tuple(keys[:i + 1]) for i, s in enumerate(slots)), "C1: a hit serves another prefix's KV"
            if PAGE == 1:
                assert len(slots) == min(longest, len(keys) - 1), f"C2: matched {{len(slots)}} of {{min(longest, len(keys) - 1)}}"
            c.inc_lock_ref(node)
            req = dict(keys=keys, seq=keys[:len(slots)], slots=slots, node=node, prot=len(slots))
        elif op["op"] in ("prefill", "step"):
            end = len(req["keys"]) - 1
            todo = [op["key"]] if op["op"] == "step" else []
            while op["op"] == "prefill" and len(req["seq"]) < end:
                p = len(req["seq"])
                q = min(end, p + {chunk})
                req["seq"] += req["keys"][p:q]
                req["slots"] += pool.alloc(req["seq"], p, q)
                n = len(req["seq"]) // PAGE * PAGE
                if n > req["prot"]:
                    v = torch.tensor(req["slots"], dtype=torch.int64)
                    pl = insert(c, req["seq"][:n], v[:n])
                    pool.free(v[req["prot"]:pl])
                    node = match(c, req["seq"][:n])
                    new = [int(s) for m in path(c, node) for s in m.value.tolist()]
                    req["slots"][req["prot"]:len(new)] = new[req["prot"]:]
                    c.dec_lock_ref(req["node"])
                    c.inc_lock_ref(node)
                    req["node"], req["prot"] = node, len(new)
                if op.get("max_chunks"):
                    break
            for k in todo:
                p = len(req["seq"])
                req["seq"].append(k)
                req["slots"] += pool.alloc(req["seq"], p, p + 1)
        elif op["op"] == "close":
            n = len(req["seq"]) // PAGE * PAGE
            v = torch.tensor(req["slots"], dtype=torch.int64)
            if n:
                pl = insert(c, req["seq"][:n], v[:n])
                pool.free(v[req["prot"]:pl])
            if len(req["slots"]) > max(n, req["prot"]):
                pool.free(v[max(n, req["prot"]):])
            c.dec_lock_ref(req["node"])
            req = None
        if op["op"] in ("close", "set_budget"):
            budget = op.get("budget", budget)
            if req is None:
                over = sum(len(m.value) for _, m in walk(c) if m is not c.root_node) - budget // 4
                if over > 0:
                    evict(c, over)
        check(c, pool)
'''


def export(rule: str, what: str, message: str, ops: list, page_size: int = 1, chunk: int = 8) -> str:
    name = f"{rule.lower()}_radix_cache"
    body = "[\n" + ",\n".join("    " + json.dumps({k: v for k, v in o.items() if k not in ("tokens", "media")})
                              for o in ops) + "\n]"
    return TEMPLATE.format(title=f"SGLang RadixCache: rule {rule} broken", what=what, rule=rule,
                           message=message.replace('"', "'"), ops=body, page=page_size, name=name, chunk=chunk)
