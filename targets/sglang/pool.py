"""A KV slot allocator on CPU tensors that tags every slot with what was written into it.

SGLang's radix cache holds, per node, a tensor of KV slot indices and gives slots back through its
allocator (`free`, or `free_segment` in 0.5.x). This allocator stands where SGLang's
TokenToKVPoolAllocator stands (same calls the radix cache makes, `device`, `available_size`), and
records, instead of K/V rows, the *content* of each slot: the key path (token ids [0, pos]) whose last
position it was written for. Without a model forward that is what C1 compares: a slot served for
position p of a prompt must carry exactly the prompt's keys [0, p].

Invariants:
- a slot is free or allocated; `alloc` hands out free slots only and each gets a fresh serial;
- freeing a free slot is recorded as a double free (never raised: the checker reports it, A2);
- `tags[slot]` is kept after the free (a later hit that still serves the slot shows stale content).
"""
from __future__ import annotations


class TagAllocator:
    def __init__(self, size: int = 1 << 14, device: str = "cpu", tensor=list):
        self.capacity = size
        self.device = device
        self.tensor = tensor                                # list -> the engine's index vector
        self.page_size = 1
        self.free_slots = list(range(size - 1, 0, -1))     # slot 0 is reserved, as SGLang's pools do
        self.allocated: set = set()
        self.tags: dict = {}                                # slot -> key path it was written for
        self.double_frees: list = []                        # slots freed while free
        self.frees = 0

    # ---- the calls SGLang's radix cache makes
    def available_size(self) -> int:
        return len(self.free_slots)

    def free(self, free_index) -> None:
        vals = free_index.tolist() if hasattr(free_index, "tolist") else list(free_index)
        for s in (int(x) for x in vals):
            self.frees += 1
            if s not in self.allocated:
                self.double_frees.append(s)
                continue
            self.allocated.discard(s)
            self.free_slots.append(s)

    def free_segment(self, free_index, *, start_pos: int = 0) -> None:
        self.free(free_index)

    def free_group_begin(self):
        pass

    def free_group_end(self):
        pass

    # ---- the driver's calls (a forward writing K/V)
    def alloc_for(self, seq: tuple, start: int, end: int):
        """Slots for positions [start, end) of `seq`, each tagged with seq[:pos + 1]."""
        n = end - start
        if n > len(self.free_slots):
            raise MemoryError(f"pool exhausted: {n} slots asked, {len(self.free_slots)} free")
        out = [self.free_slots.pop() for _ in range(n)]
        for i, s in enumerate(out):
            self.allocated.add(s)
            self.tags[s] = tuple(seq[:start + i + 1])
        return self.tensor(out)

    def content(self, slot: int, pos: int):
        """What slot `slot` holds as seen from position `pos`: the key it was written for when the
        slot is allocated and was written for position `pos`, else a marker no key equals."""
        t = self.tags.get(slot)
        if t is None or slot not in self.allocated or len(t) != pos + 1:
            return ("stale", slot)
        return t[-1]

    def holds(self, slot: int, prefix: tuple) -> bool:
        """Does `slot` hold the KV of prefix[-1] after exactly `prefix`?"""
        return slot in self.allocated and self.tags.get(slot) == tuple(prefix)
