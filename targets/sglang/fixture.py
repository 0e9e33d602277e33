"""A tiny radix cache with SGLang's RadixCache interface and planted faults, for CI (no sglang).

`FakeApi(fault)` stands where engine.Api stands: `make(allocator)` builds a FakeRadixCache, and
match / insert / evict / tokens call it. The cache is written from the behaviour SGLang documents
(a radix tree over token ids whose node values are KV slot indices; match splits an edge at the
match; insert frees nothing itself and returns the prefix length already cached; evict frees
least recently used unlocked leaves until n tokens are freed; lock counts along the path). With
`fault=None` it breaks no rule; each fault plants one bug:

  "split-value"   a split keeps the whole value on the head (the head's KV spans past its key): S1/C1
  "double-free"   evict frees a leaf's slots and its parent's (already-held) first slot again: A2
  "mru"           evict takes the most recently used leaf first: E3
  "short-match"   match_prefix stops one token short inside an edge: C2
  "crash"         evict reads one past its parent's key when the victim hangs below another node: an
                  IndexError raised inside the cache (PANIC, targets.sglang.crash)
"""
from __future__ import annotations

import itertools

FAULTS = ("split-value", "double-free", "mru", "short-match")
CRASHES = ("crash",)          # faults that raise inside the cache rather than break a rule


class Vec(list):
    """The slot-index vector the fake holds (a list with the tensor calls the driver makes)."""

    def tolist(self):
        return list(self)

    def clone(self):
        return Vec(self)

    def __getitem__(self, i):
        r = list.__getitem__(self, i)
        return Vec(r) if isinstance(i, slice) else r


class Node:
    def __init__(self):
        self.children: dict = {}
        self.parent = None
        self.key: list = []
        self.value = Vec()
        self.lock_ref = 0
        self.last_access_time = 0.0


class FakeRadixCache:
    _clock = itertools.count(1)

    def __init__(self, allocator, fault=None):
        self.alloc, self.fault = allocator, fault
        self.root_node = Node()
        self.root_node.lock_ref = 1
        self.evictable_size_ = self.protected_size_ = 0

    def _tick(self):
        self.now = float(next(self._clock))      # one access time per operation, as SGLang reads it once

    def _touch(self, n):
        n.last_access_time = self.now

    def _split(self, child, at):
        head = Node()
        head.parent, head.key, head.lock_ref = child.parent, child.key[:at], child.lock_ref
        head.value = child.value.clone() if self.fault == "split-value" else child.value[:at].clone()
        head.last_access_time = child.last_access_time
        head.children = {child.key[at]: child}
        child.parent.children[child.key[0]] = head
        child.parent, child.key, child.value = head, child.key[at:], child.value[at:].clone()
        return head

    def match_prefix(self, key):
        self._tick()
        node, i = self.root_node, 0
        self._touch(node)
        while i < len(key) and key[i] in node.children:
            c = node.children[key[i]]
            self._touch(c)
            n = 0
            while n < len(c.key) and i + n < len(key) and c.key[n] == key[i + n]:
                n += 1
            if n < len(c.key):
                if self.fault == "short-match" and n > 1:
                    n -= 1
                node = self._split(c, n)
                break
            node, i = c, i + n
        return [], node

    def insert(self, key, value):
        self._tick()
        node, i = self.root_node, 0
        self._touch(node)
        while i < len(key) and key[i] in node.children:
            c = node.children[key[i]]
            self._touch(c)
            n = 0
            while n < len(c.key) and i + n < len(key) and c.key[n] == key[i + n]:
                n += 1
            if n < len(c.key):
                c = self._split(c, n)
            node, i = c, i + n
        if i < len(key):
            new = Node()
            new.parent, new.key, new.value = node, list(key[i:]), value[i:].clone()
            self._touch(new)
            node.children[key[i]] = new
            self.evictable_size_ += len(new.key)
        return i

    def _leaves(self):
        out, stack = [], [self.root_node]
        while stack:
            n = stack.pop()
            stack += n.children.values()
            if n is not self.root_node and not n.children and n.lock_ref == 0:
                out.append(n)
        return out

    def _end(self, n):
        e = 0
        while n is not self.root_node:
            e, n = e + len(n.key), n.parent
        return e

    def evict(self, num_tokens):
        done = 0
        while done < num_tokens:
            leaves = self._leaves()
            if not leaves:
                break
            order = lambda n: (n.last_access_time, -self._end(n))        # ties: deeper first
            x = max(leaves, key=order) if self.fault == "mru" else min(leaves, key=order)
            self.alloc.free(x.value)
            if self.fault == "double-free" and x.parent is not self.root_node and len(x.parent.value):
                self.alloc.free(x.parent.value[:1])
            if self.fault == "crash" and x.parent is not self.root_node:
                x.parent.key[len(x.parent.key)]                 # the planted off-by-one: IndexError
            done += len(x.value)
            del x.parent.children[x.key[0]]
            self.evictable_size_ -= len(x.key)

    def inc_lock_ref(self, node):
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node):
        while node is not self.root_node:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
            node.lock_ref -= 1
            node = node.parent


class FakeApi:
    where = "fixture"

    def __init__(self, fault=None):
        assert fault is None or fault in FAULTS + CRASHES, fault
        self.fault = fault

    def make(self, allocator, page_size: int = 1):
        return FakeRadixCache(allocator, self.fault)

    @staticmethod
    def tensor(values):
        return Vec(values)

    def match(self, cache, tokens):
        return cache.match_prefix(key=list(tokens))[1]

    def insert(self, cache, tokens, value) -> int:
        return int(cache.insert(list(tokens), value))

    def evict(self, cache, n: int) -> None:
        cache.evict(n)

    @staticmethod
    def tokens(key) -> list:
        return [int(x) for x in key]
