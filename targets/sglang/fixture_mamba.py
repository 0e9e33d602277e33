"""A tiny Mamba radix cache with SGLang's MambaRadixCache call surface and planted faults, for CI (no sglang,
no torch). `FakeMambaApi(fault)` stands where targets.sglang.mamba.MambaApi stands.

Written from the behaviour SGLang documents for its Mamba tree (page size 1, no extra buffer): node values
are KV slot indices; a node may hold one mamba state slot (`mamba_value`), set where an insert ends; a
split head holds none; a match backs off to the deepest node with a state and copies that state into the
request's slot (copy on write); `cache_unfinished_req` inserts a *fork* of the request's state,
`cache_finished_req` donates the request's slot itself (freeing it when the tree already had a state
there); evicting mamba from an internal node frees its state and leaves a tombstone; full eviction
removes least-recent unlocked leaves, their states with them. With fault=None it breaks no rule:

  "split-state"     a split leaves the state on the head (which now ends elsewhere)   -> S2
  "no-fork"         cache_unfinished_req donates the request's live slot, no fork     -> S2 / C1
  "state-leak"      a mamba tombstone keeps its slot allocated                        -> A2
  "mamba-counter"   tombstoning leaves mamba_evictable_size_ unchanged                -> A1
  "no-backoff"      match serves the deepest node even without a state               -> C1
"""
from __future__ import annotations

import itertools
from types import SimpleNamespace

from targets.sglang.fixture import Vec
from targets.sglang.fixture_swa import FakeReqToToken
from targets.sglang.mamba import MambaRows

FAULTS = ("split-state", "no-fork", "state-leak", "mamba-counter", "no-backoff")


class AllocBase:
    """What the KV tag allocator subclasses here (SGLang's TokenToKVPoolAllocator in the real target)."""


class FakeRows(MambaRows, FakeReqToToken):
    def __init__(self, api, pool):
        FakeReqToToken.__init__(self, api)
        self.api = api
        self.attach(pool)


class Node:
    _ids = itertools.count(1)

    def __init__(self, parent=None, key=(), value=()):
        self.id = next(self._ids)
        self.parent, self.key, self.value, self.children = parent, list(key), Vec(value), {}
        self.mamba_value = None
        self.full_lock_ref = self.mamba_lock_ref = 0
        self.last_access_time = 0.0

    @property
    def component_data(self):
        """The unified cache's per-component node data (fixture_unified): [FULL, SWA, MAMBA]."""
        return [SimpleNamespace(value=self.value), None, SimpleNamespace(value=self.mamba_value)]


class FakeMambaCache:
    _clock = itertools.count(1)

    def __init__(self, alloc, rows, fault=None):
        self.alloc, self.rows, self.fault = alloc, rows, fault
        self.root_node = Node()
        self.root_node.full_lock_ref = self.root_node.mamba_lock_ref = 1
        self.full_evictable_size_ = self.full_protected_size_ = 0
        self.mamba_evictable_size_ = self.mamba_protected_size_ = 0

    # ------------------------------------------------------------ tree
    def _touch(self, n):
        t = float(next(self._clock))
        while n is not None:
            n.last_access_time, t, n = t, t - 1e-6, n.parent

    def _split(self, child, k):
        head = Node(child.parent, child.key[:k], child.value[:k])
        head.full_lock_ref, head.last_access_time = child.full_lock_ref, child.last_access_time
        if self.fault == "split-state":
            head.mamba_value, child.mamba_value = child.mamba_value, None
            head.mamba_lock_ref, child.mamba_lock_ref = child.mamba_lock_ref, 0
        head.children = {child.key[k]: child}
        child.parent.children[child.key[0]] = head
        child.parent, child.key, child.value = head, child.key[k:], child.value[k:]
        return head

    def _walk(self, key):
        """(values along the path, last node, (values, node) at the deepest state)."""
        node, key, value, best = self.root_node, list(key), [], (0, self.root_node)
        while key and key[0] in node.children:
            c = node.children[key[0]]
            k = next((i for i, (a, b) in enumerate(zip(c.key, key)) if a != b), min(len(c.key), len(key)))
            split = k < len(c.key)
            if split:
                c = self._split(c, k)
            value.extend(c.value)
            node, key = c, key[k:]
            if node.mamba_value is not None or self.fault == "no-backoff":
                best = (len(value), node)
            if split:
                break
        return value, best

    def match_prefix(self, key, req=None, cow_mamba=False):
        value, (n, node) = self._walk(key)
        self._touch(node)
        if cow_mamba and req is not None and node.mamba_value is not None:
            if req.mamba_pool_idx is None:
                if not self.rows.mamba_allocator.available_size():
                    self.inc_lock_ref(node)
                    self.evict(0, 1)
                    self.dec_lock_ref(node)
                req.mamba_pool_idx = self.rows.mamba_allocator.alloc(1)[0]
            self.rows.mamba_pool.copy_from(node.mamba_value, Vec([int(req.mamba_pool_idx)]))
        return Vec(value[:n]), node

    def insert(self, key, value, mamba_value, prev_prefix_len=0):
        node, key, value, done = self.root_node, list(key), Vec(value), 0
        while key and key[0] in node.children:
            c = node.children[key[0]]
            k = next((i for i, (a, b) in enumerate(zip(c.key, key)) if a != b), min(len(c.key), len(key)))
            if k < len(c.key):
                c = self._split(c, k)
            lo = max(0, prev_prefix_len - done)
            if lo < k:
                self.alloc.free(value[lo:k])
            done, node, key, value = done + k, c, key[k:], value[k:]
        if key:
            n = Node(node, key, value)
            n.mamba_value = mamba_value
            node.children[key[0]] = n
            self.full_evictable_size_ += len(key)
            self.mamba_evictable_size_ += 1
            self._touch(n)
            return done, False
        self._touch(node)
        if node.mamba_value is None and node is not self.root_node:
            node.mamba_value = mamba_value
            self.mamba_evictable_size_ += 1
            return done, False
        return done, True

    # ------------------------------------------------------------ requests
    def cache_unfinished_req(self, req, chunked=False):
        n = len(req.fill_ids)
        row = self.rows.req_to_token[req.req_pool_idx, :n]
        own = Vec([int(req.mamba_pool_idx)])
        state = own if self.fault == "no-fork" else self.rows.mamba_pool.fork_from(own)
        if state is None:
            self.evict(0, 1)
            state = self.rows.mamba_pool.fork_from(own)
        _, exist = self.insert(req.fill_ids, row, state, req.cache_protected_len)
        if exist and self.fault != "no-fork":
            self.rows.mamba_pool.free(state)
        new, node = self.match_prefix(req.fill_ids)
        self.rows.write((req.req_pool_idx, slice(req.cache_protected_len, len(new))), new[req.cache_protected_len:])
        req.cache_protected_len = len(new)
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(node)
        req.last_node = node
        req.prefix_indices = Vec(list(new) + list(row[len(new):]))

    def cache_finished_req(self, req, is_insert=True):
        n = req.pop_committed_kv_cache()
        _, exist = self.insert((req.origin_input_ids + req.output_ids)[:n],
                               self.rows.req_to_token[req.req_pool_idx, :n], Vec([int(req.mamba_pool_idx)]),
                               req.cache_protected_len)
        self.rows.free(req.req_pool_idx, free_mamba_cache=exist)
        self.dec_lock_ref(req.last_node)

    # ------------------------------------------------------------ locks
    def inc_lock_ref(self, node):
        if node.mamba_value is not None:
            if node.mamba_lock_ref == 0:
                self.mamba_evictable_size_ -= 1
                self.mamba_protected_size_ += 1
            node.mamba_lock_ref += 1
        while node is not self.root_node:
            if node.full_lock_ref == 0:
                self.full_evictable_size_ -= len(node.value)
                self.full_protected_size_ += len(node.value)
            node.full_lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node):
        if node.mamba_value is not None:
            if node.mamba_lock_ref == 1:
                self.mamba_evictable_size_ += 1
                self.mamba_protected_size_ -= 1
            node.mamba_lock_ref -= 1
        while node is not self.root_node:
            if node.full_lock_ref == 1:
                self.full_evictable_size_ += len(node.value)
                self.full_protected_size_ -= len(node.value)
            node.full_lock_ref -= 1
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
        if x.mamba_value is not None:
            self.rows.mamba_pool.free(x.mamba_value)
            self.mamba_evictable_size_ -= 1
        del x.parent.children[x.key[0]]
        self.full_evictable_size_ -= len(x.value)
        p = x.parent
        if p is not self.root_node and not p.children and p.mamba_value is None and p.full_lock_ref == 0:
            self._delete(p)

    def evict(self, full, mamba=0):
        freed = 0
        while freed < full:
            leaves = [n for n in self._nodes() if not n.children and n.full_lock_ref == 0]
            if not leaves:
                break
            x = min(leaves, key=lambda n: n.last_access_time)
            freed += len(x.value)
            self._delete(x)
        done = 0
        while done < mamba:
            cand = [n for n in self._nodes() if n.mamba_value is not None and n.mamba_lock_ref == 0
                    and n.full_lock_ref == 0]
            if not cand:
                break
            x = min(cand, key=lambda n: n.last_access_time)
            done += 1
            if x.children:
                if self.fault != "state-leak":
                    self.rows.mamba_pool.free(x.mamba_value)
                x.mamba_value = None
                if self.fault != "mamba-counter":
                    self.mamba_evictable_size_ -= 1
            else:
                self._delete(x)


class FakeMambaApi:
    Alloc = AllocBase
    where = "fixture"

    def __init__(self, fault=None):
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.fault = fault

    tensor = staticmethod(Vec)
    rows = FakeRows

    @staticmethod
    def tokens(key):
        return [int(x) for x in key]

    def make(self, alloc, rows):
        return FakeMambaCache(alloc, rows, self.fault)

    @staticmethod
    def match(cache, tokens, req):
        v, n = cache.match_prefix(list(tokens), req=req, cow_mamba=True)
        return list(v), n

    @staticmethod
    def evict(cache, full, mamba):
        cache.evict(full, mamba)

    @staticmethod
    def finish(cache, req):
        cache.cache_finished_req(req)
