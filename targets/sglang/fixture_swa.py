"""A tiny sliding-window radix cache with SGLang's SWARadixCache interface and planted faults, for CI
(no sglang, no torch). `FakeSwaApi(fault)` stands where targets.sglang.swa.SwaApi stands.

Written from the behaviour SGLang documents for its SWA tree: node values are full-KV slot indices,
each with an SWA slot (the pool's mapping); evicting SWA from an internal node frees its SWA slots and
makes it a *tombstone*; a match stops where fewer than W non-tombstone tokens follow the last tombstone;
insert frees the request's duplicates past `prev_prefix_len` and gives a tombstone the request's slots
back; locks take the full path and the last W tokens' SWA. With fault=None it breaks no rule:

  "tombstone-match"  match ignores tombstones: a hit serves released SWA slots (C1)
  "swa-leak"         tombstoning marks the node without freeing its SWA slots (A2: created and lost)
  "swa-counter"      tombstoning leaves swa_evictable_size_ unchanged (A1)
"""
from __future__ import annotations

import itertools

from targets.sglang.fixture import Vec

FAULTS = ("tombstone-match", "swa-leak", "swa-counter")


class AllocBase:
    """What SwaTagPool subclasses here (SGLang's SWATokenToKVPoolAllocator in the real target)."""


class Row:
    """req_to_token[0, a:b] reads and writes over a list (the real target uses a tensor)."""

    def __init__(self, width=4096):
        self.v = [0] * width

    def __getitem__(self, ix):
        return Vec(self.v[ix[1]])

    def __setitem__(self, ix, vals):
        sl = ix[1]
        vals = list(vals.tolist() if hasattr(vals, "tolist") else vals)
        self.v[sl.start or 0:(sl.start or 0) + len(vals)] = vals


class FakeReqToToken:
    def __init__(self, api):
        self.req_to_token = Row()

    def write(self, ix, values):
        self.req_to_token[ix] = values

    def free(self, _):
        pass


class Node:
    _ids = itertools.count(1)

    def __init__(self, parent=None, key=(), value=()):
        self.parent, self.key, self.value, self.children = parent, list(key), Vec(value), {}
        self.full_lock_ref = self.swa_lock_ref = 0
        self.swa_tombstone, self.swa_uuid, self.last_access_time, self.id = False, None, 0.0, next(self._ids)


class FakeSwaCache:
    _clock = itertools.count(1)
    node_class = Node                     # fixture_unified_swa's nodes also show per-component data

    def __init__(self, alloc, r2t, window, fault=None):
        self.alloc, self.r2t, self.W, self.fault = alloc, r2t, window, fault
        self.root_node = self.node_class()
        self.root_node.full_lock_ref = self.root_node.swa_lock_ref = 1
        self.full_evictable_size_ = self.full_protected_size_ = 0
        self.swa_evictable_size_ = self.swa_protected_size_ = 0

    # ------------------------------------------------------------ tree
    def _touch(self, n):
        t = float(next(self._clock))
        while n is not None:
            n.last_access_time, t, n = t, t - 1e-6, n.parent

    def _split(self, child, k):
        head = self.node_class(child.parent, child.key[:k], child.value[:k])
        for a in ("full_lock_ref", "swa_lock_ref", "swa_tombstone", "last_access_time"):
            setattr(head, a, getattr(child, a))
        head.children = {child.key[k]: child}
        child.parent.children[child.key[0]] = head
        child.parent, child.key, child.value = head, child.key[k:], child.value[k:]
        return head

    def match_prefix(self, key):
        node, key, value, since, best = self.root_node, list(key), [], None, (0, self.root_node)
        while key and key[0] in node.children:
            c = node.children[key[0]]
            if c.swa_tombstone and self.fault != "tombstone-match":
                if since is None or since >= self.W:
                    best = (len(value), node)
                since = 0
            k = next((i for i, (a, b) in enumerate(zip(c.key, key)) if a != b), min(len(c.key), len(key)))
            split = k < len(c.key)
            if split:
                c = self._split(c, k)
            value.extend(c.value)
            if not c.swa_tombstone and since is not None:
                since += len(c.value)
            node, key = c, key[k:]
            if split:
                break
        if since is None or since >= self.W:
            best = (len(value), node)
        self._touch(best[1])
        return Vec(value[:best[0]]), best[1]

    def insert(self, key, value, prev_prefix_len=0):
        node, key, value, done = self.root_node, list(key), Vec(value), 0
        while key and key[0] in node.children:
            c = node.children[key[0]]
            k = next((i for i, (a, b) in enumerate(zip(c.key, key)) if a != b), min(len(c.key), len(key)))
            if k < len(c.key):
                c = self._split(c, k)
            lo = max(0, prev_prefix_len - done)
            if c.swa_tombstone and lo < k:
                self.alloc.free(c.value[lo:k])
                c.value = Vec(list(c.value[:lo]) + list(value[lo:k]))
                c.swa_tombstone = False
                self.swa_evictable_size_ += len(c.value)
            elif lo < k:
                self.alloc.free(value[lo:k])
            done, node, key, value = done + k, c, key[k:], value[k:]
        if key:
            n = self.node_class(node, key, value)
            node.children[key[0]] = n
            self.full_evictable_size_ += len(key)
            self.swa_evictable_size_ += len(key)
            self._touch(n)
        return done

    # ------------------------------------------------------------ requests
    def cache_unfinished_req(self, req, chunked=False):
        n = len(req.fill_ids)
        row = self.r2t.req_to_token[req.req_pool_idx, :n]
        self.insert(req.fill_ids, row, req.cache_protected_len)
        new, node = self.match_prefix(req.fill_ids)
        self.r2t.write((req.req_pool_idx, slice(req.cache_protected_len, len(new))), new[req.cache_protected_len:])
        req.cache_protected_len = len(new)
        self.dec_lock_ref(req.last_node, req.swa_uuid_for_lock)
        req.last_node, req.swa_uuid_for_lock = node, self.inc_lock_ref(node)
        req.prefix_indices = Vec(list(new) + list(row[len(new):]))

    def cache_finished_req(self, req, is_insert=True):
        n = req.pop_committed_kv_cache()
        self.insert((req.origin_input_ids + req.output_ids)[:n], self.r2t.req_to_token[req.req_pool_idx, :n],
                    req.cache_protected_len)
        self.dec_lock_ref(req.last_node, req.swa_uuid_for_lock)

    # ------------------------------------------------------------ locks
    def inc_lock_ref(self, node):
        seen, uuid = 0, None
        while node is not self.root_node:
            if node.full_lock_ref == 0:
                self.full_evictable_size_ -= len(node.value)
                self.full_protected_size_ += len(node.value)
            node.full_lock_ref += 1
            if seen < self.W:
                if node.swa_lock_ref == 0:
                    self.swa_evictable_size_ -= len(node.value)
                    self.swa_protected_size_ += len(node.value)
                node.swa_lock_ref += 1
                seen += len(node.value)
                if seen >= self.W:
                    node.swa_uuid = node.swa_uuid or node.id
                    uuid = node.swa_uuid
            node = node.parent
        return uuid

    def dec_lock_ref(self, node, uuid=None):
        swa = True
        while node is not self.root_node:
            if node.full_lock_ref == 1:
                self.full_evictable_size_ += len(node.value)
                self.full_protected_size_ -= len(node.value)
            node.full_lock_ref -= 1
            if swa:
                if node.swa_lock_ref == 1:
                    self.swa_evictable_size_ += len(node.value)
                    self.swa_protected_size_ -= len(node.value)
                node.swa_lock_ref -= 1
                swa = not (uuid and node.swa_uuid == uuid)
            node = node.parent

    # ------------------------------------------------------------ eviction
    def _nodes(self):
        out, stack = [], [self.root_node]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out[1:]

    def _delete(self, x):
        self.alloc.free(x.value)
        del x.parent.children[x.key[0]]
        self.full_evictable_size_ -= len(x.value)
        if not x.swa_tombstone:
            self.swa_evictable_size_ -= len(x.value)
        p = x.parent
        if p is not self.root_node and not p.children and p.swa_tombstone and p.full_lock_ref == 0:
            self._delete(p)

    def evict(self, full, swa=0):
        freed = 0
        while freed < full:
            leaves = [n for n in self._nodes() if not n.children and n.full_lock_ref == 0]
            if not leaves:
                break
            x = min(leaves, key=lambda n: n.last_access_time)
            freed += len(x.value)
            self._delete(x)
        while freed < swa:
            cand = [n for n in self._nodes() if not n.swa_tombstone and n.swa_lock_ref == 0 and n.full_lock_ref == 0]
            if not cand:
                break
            x = min(cand, key=lambda n: n.last_access_time)
            freed += len(x.value)
            if x.children:
                if self.fault != "swa-leak":
                    self.alloc.free_swa(x.value)
                x.swa_tombstone = True
                if self.fault != "swa-counter":
                    self.swa_evictable_size_ -= len(x.value)
            else:
                self._delete(x)


class FakeSwaApi:
    Alloc = AllocBase
    req_to_token = FakeReqToToken
    where = "fixture"

    def __init__(self, fault=None):
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.fault = fault

    tensor = staticmethod(Vec)

    @staticmethod
    def tokens(key):
        return [int(x) for x in key]

    def make(self, alloc, r2t, window):
        return FakeSwaCache(alloc, r2t, window, self.fault)

    @staticmethod
    def match(cache, tokens):
        v, n = cache.match_prefix(list(tokens))
        return list(v), n

    @staticmethod
    def lock(cache, node):
        return cache.inc_lock_ref(node)

    @staticmethod
    def evict(cache, full, swa):
        cache.evict(full, swa)
