"""SGLang's RadixCache driven through its own request calls where the release has them (0.5.23:
`checkpoint(req, up_to)`, `free_kv_row`, `lock` / `unlock`), instead of the re-expressed insert / free /
match steps of targets.sglang.target.

The scheduler's request protocol in 0.5.23 (mem_cache/common.py):
  admission   match_prefix(key) -> last node; req.lock = lock(last node); the row takes the prefix's slots;
              req.kv.cache_protected_len = the prefix length
  each chunk  checkpoint_kv_cache: checkpoint(req, up_to=extend end) (insert, free the duplicates, split at
              the prompt boundary, match again, rewrite the row, move the lock)
  finish      release_kv_cache: checkpoint(req, up_to=owned length), free_kv_row(req.kv, [(protected, owned)]),
              unlock(req.lock)
`checkpoint_kv_cache` / `release_kv_cache` themselves read the process's runtime context (server args,
speculative settings) that a CPU harness does not publish, so their cache calls are made here in their
order; every tree and allocator operation is SGLang's.

`CheckpointTarget` is used for `--cache full` when the loaded RadixCache has `checkpoint`
(targets.sglang.__main__); older releases keep SglangTarget. Its view is targets.sglang.view's.
"""
from __future__ import annotations

from types import SimpleNamespace

from targets.sglang.pool import TagAllocator
from targets.sglang.swa import ReqToToken
from targets.sglang.target import SglangTarget


def has_checkpoint(api) -> bool:
    return hasattr(api.RadixCache, "checkpoint")


def fixture_target(fault, page_size: int = 1):
    """CheckpointTarget on targets/sglang/fixture_checkpoint.py's planted-fault fake (CI)."""
    from targets.sglang.fixture_checkpoint import FakeCheckpointApi
    return CheckpointTarget(FakeCheckpointApi(fault), page_size=page_size)


class SegmentAllocator(TagAllocator):
    """TagAllocator with the batched frees 0.5.23's free_kv_row makes."""

    def free_segments(self, segments) -> None:
        for kv, _start in segments:
            self.free(kv)

    def free_full_segments(self, segments) -> None:
        self.free_segments(segments)


class ReqKv(SimpleNamespace):
    """The request's kv record fields 0.5.23's checkpoint / free_kv_row read."""

    def get_evicted_seqlen(self, _component) -> int:
        return 0

    def swa_dead_lo(self, _page_size) -> int:
        return 0


class CheckpointTarget(SglangTarget):
    name = "sglang"

    def reset(self, budget: int = 1 << 40, chunk: int | None = None, **_config):
        self.chunk = chunk or self.chunk
        self.alloc = SegmentAllocator(tensor=self.api.tensor)
        self.r2t = getattr(self.api, "req_to_token", ReqToToken)(self.api)
        self.cache = self.api.RadixCache(self.api.CacheInitParams(
            disable=False, req_to_token_pool=self.r2t, token_to_kv_pool_allocator=self.alloc,
            page_size=self.page_size))
        self.budget = self.shown_budget = budget
        self.req = self.fake = self.outcome = None
        self.clock = 0
        self.victims: list = []
        self.used: dict = {}

    def begin(self, keys, spans=()) -> tuple:
        out = super().begin(keys, spans)           # match_prefix + inc_lock_ref (= lock) on the last node
        r = self.req
        self.cache.dec_lock_ref(r["node"])          # ... taken again as the scheduler does: a TreeLock
        self.fake = SimpleNamespace(origin_input_ids=list(r["keys"]), full_untruncated_fill_ids=[],
                                    extra_key=None, cache_salt=None, priority=None, last_node=r["node"],
                                    lock=self.cache.lock(r["node"]),
                                    kv=ReqKv(req_pool_idx=0, swa_evict_floor=0, cache_inserted_len=0,
                                             cache_protected_len=len(r["slots"])))
        self.r2t.req_to_token[0, :len(r["slots"])] = self.api.tensor(r["slots"])
        return out

    def _forward(self, keys) -> None:
        super()._forward(keys)
        r = self.req
        self.r2t.req_to_token[0, :len(r["slots"])] = self.api.tensor(r["slots"])

    def _checkpoint(self, up_to: int) -> None:
        r, f = self.req, self.fake
        f.full_untruncated_fill_ids = list(r["seq"])
        self.cache.checkpoint(f, up_to=up_to)
        r["slots"] = [int(x) for x in self.r2t.req_to_token[0, :len(r["seq"])].tolist()]
        r["node"], r["protected"] = f.last_node, int(f.kv.cache_protected_len)

    def _cache_unfinished(self) -> None:
        self._checkpoint(len(self.req["seq"]))

    def close(self) -> None:
        n = len(self.req["seq"])
        self._checkpoint(n)
        f = self.fake
        self.cache.free_kv_row(f.kv, [(int(f.kv.cache_protected_len), n)])
        self.cache.unlock(f.lock)
        self.req = self.fake = None
        self.clock += 1
        self.outcome = None
        self._enforce()
