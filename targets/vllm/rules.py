"""Which rules apply to vLLM's prefix cache (REFERENCE section 3, read for a block cache), and the
vLLM function each violation is attributed to.

Applied, by spec.rules' predicates unchanged on the block-unit view (targets.vllm.view):
  T1, T2, T3  the trie the hash map spells, and the path a hit restores;
  S1  a cached full-attention block holds the tokens of its own block (content identity);
  S2  a cached sliding-window state (the blocks of its window) or Mamba state is the state at its
      block end;
  C1  what the blocks served by get_computed_blocks hold equals a cold prefill of the prefix the
      hit claims (content identity: every served block's tags);
  C2  the hit is the deepest block end every group can serve;
  A1  the hash map and the blocks' own hash metadata agree (counter = hashed blocks);
  A2  no block is held under two block ends of the trie at once.
"""
from __future__ import annotations

from targets.base import ALL_RULES

RULES = frozenset({"T1", "T2", "T3", "S1", "S2", "C1", "C2", "A1", "A2"})
NOT_APPLICABLE = {
    "S3": "no page-out at close: blocks are cached as they fill, while the request runs",
    "S4": "blocks are never split: a node is one block",
    "M1": "media are hashed into the blocks' extra keys; chunking of encoder inputs is the scheduler's",
    "M2": "no capture is scheduled: every full block is cached",
    "M3": "media are not driven by this target (no encoder inputs without a model)",
    "P1": "a hit always ends at a block end; blocks are never split",
    "P2": "no compaction: nodes are blocks, never merged",
    "G1": "blocks never merge",
    "G2": "blocks never merge",
    "E1": "the pool has a fixed number of blocks: allocation fails (None) instead of exceeding a budget",
    "E2": "eviction pops the free queue block by block; a branch point's block goes when its turn comes",
    "E3": "eviction order is the free queue's (time of free, a request's tail first), not last use",
    "E4": "evicting a block drops its hash; descendants stay cached but unreachable (no merge)",
    "E5": "no checkpoint folding: C2 judges the deepest surviving hit",
    "A3": "no allocator: the pool's blocks are preallocated",
}
assert set(NOT_APPLICABLE) | RULES == set(ALL_RULES) and not set(NOT_APPLICABLE) & RULES


# (rule, layout family) -> (module, qualified function, a substring of the responsible line, why).
# The family is "eagle" for -eagle layouts, else "any". Lines are looked up in the version that ran.
CAUSES = {
    ("C1", "eagle"): ("vllm.v1.core.kv_cache_coordinator", "HybridKVCacheCoordinator.find_longest_cache_hit",
                      "curr_hit_length + spec.block_size",
                      "with EAGLE the full-attention group matches one block and drops it; the next group "
                      "(Mamba) is then looked up to the shortened length plus one block and may hit deeper "
                      "than full attention, and the simple-hybrid path stops after one pass: the hit claims "
                      "tokens whose full-attention blocks it does not serve (cf. vllm-project/vllm PR #45614)"),
    ("S1", "eagle"): ("vllm.v1.core.kv_cache_coordinator", "HybridKVCacheCoordinator.find_longest_cache_hit",
                      "curr_hit_length + spec.block_size",
                      "the EAGLE-extended Mamba lookup claims tokens the full-attention group does not serve; "
                      "allocate_slots gives the request fresh full-attention blocks for them that no forward "
                      "writes (they count as computed), and cache_blocks then caches those blocks under the "
                      "prefix's hash: a poisoned entry that later requests are served as a genuine hit"),
    ("C1", "any"): ("vllm.v1.core.kv_cache_coordinator", "HybridKVCacheCoordinator.find_longest_cache_hit",
                    "hit_length", "the hit length and the blocks served per group disagree"),
    ("C2", "any"): ("vllm.v1.core.kv_cache_coordinator", "HybridKVCacheCoordinator.find_longest_cache_hit",
                    "hit_length", "a block end every group can serve is deeper than the hit returned"),
    ("S1", "any"): ("vllm.v1.core.block_pool", "BlockPool.cache_full_blocks", "block_hash",
                    "a block is cached under the hash of tokens it was not written with"),
    ("S2", "any"): ("vllm.v1.core.block_pool", "BlockPool.cache_full_blocks", "block_hash",
                    "a sliding-window or Mamba block is cached under a hash whose state it does not hold"),
    ("A1", "any"): ("vllm.v1.core.block_pool", "BlockPool._maybe_evict_cached_block", "block_hash",
                    "the hash map and the blocks' own hash metadata disagree"),
    ("A2", "any"): ("vllm.v1.core.block_pool", "BlockPool.cache_full_blocks", "block_hash",
                    "one block is cached under two hashes"),
    ("T3", "any"): ("vllm.v1.core.kv_cache_manager", "KVCacheManager.allocate_slots", "new_computed_block",
                    "blocks a hit served are no longer cached while the request holds them"),
}


def cause(rule: str, layout: str) -> tuple | None:
    fam = "eagle" if layout.endswith("-eagle") else "any"
    return CAUSES.get((rule, fam)) or CAUSES.get((rule, "any"))


def where(rule: str, layout: str) -> tuple:
    """(text, why): 'module.function (file line N: `line`)' in the vLLM that runs, and the explanation."""
    import importlib
    import inspect
    c = cause(rule, layout)
    if c is None:
        return "(not attributed)", ""
    module, function, quote, why = c
    try:
        obj = importlib.import_module(module)
        for part in function.split("."):
            obj = getattr(obj, part)
        lines, start = inspect.getsourcelines(obj)
        n, text = next(((start + i, l.strip()) for i, l in enumerate(lines) if quote in l), (start, lines[0].strip()))
        path = inspect.getsourcefile(obj)
        rel = path[path.rfind("vllm/"):] if "vllm/" in path else path
        return f"`{module}.{function}` ({rel} line {n}: `{text}`)", why
    except Exception as e:                       # noqa: BLE001 -- a function moved in this version
        return f"`{module}.{function}` (not found here: {type(e).__name__})", why
