"""Which rules apply to SGLang's MambaRadixCache (full attention + a recurrent state per node end), and
the SGLang function each violation is attributed to. Full-attention rules are as for RadixCache
(targets.sglang.rules); the recurrent layer adds S2 on the states the tree offers, C1 on the state the
request is served, C2 as "the deepest node with a state", A1 on the mamba counters and A2 on state slots."""
from __future__ import annotations

from targets.base import ALL_RULES
from targets.sglang.rules import CAUSES as FULL_CAUSES
from targets.sglang.rules import NOT_APPLICABLE as FULL_NA

RULES = frozenset({"T1", "T2", "T3", "S1", "S2", "S4", "P1", "E1", "E2", "E4", "A1", "A2", "C1", "C2"})
NOT_APPLICABLE = {
    **{r: why for r, why in FULL_NA.items() if r not in ("S2",)},
    "S3": "a recurrent state is cached only where SGLang inserts (chunk ends, the request's end); the "
          "frontier's state is judged by S2 where it is offered",
    "E3": "mamba eviction (tombstoning) takes internal nodes in mamba-LRU order, not leaves in last-use "
          "order: judged by E1/E2/E4 and C1 only",
}
assert set(NOT_APPLICABLE) | RULES == set(ALL_RULES) and not set(NOT_APPLICABLE) & RULES, \
    set(ALL_RULES) ^ (set(NOT_APPLICABLE) | RULES)

CAUSES = {
    **{r: (c.replace("RadixCache", "MambaRadixCache"), w) for r, (c, w) in FULL_CAUSES.items()},
    "S2": ("MambaRadixCache._insert_helper / cache_unfinished_req (fork of the request's state)",
           "the tree offers a state at a node end that is not that prefix's state"),
    "A1": ("MambaRadixCache inc_lock_ref / dec_lock_ref / _insert_helper / evict_mamba",
           "full_* or mamba_* evictable + protected differ from the tokens / states the tree holds"),
    "A2": ("MambaRadixCache.insert / evict / cache_*_req (frees of KV or state slots)",
           "a KV or state slot freed twice, freed while the tree holds it, or leaked"),
    "C1": ("MambaRadixCache.match_prefix (copy on write) / cache_unfinished_req",
           "a hit serves KV slots or a state computed for another prefix (or released)"),
    "C2": ("MambaRadixCache._match_prefix_helper",
           "the match stops short of the deepest cached node that holds a state"),
}
