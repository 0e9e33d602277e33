"""Which rules apply to SGLang's SWARadixCache (full attention + a sliding window), and the SGLang
function each violation is attributed to. Full-attention rules are as for RadixCache
(targets.sglang.rules); the windowed layer adds S2 (a window state the tree offers at a node end holds
that prefix's last W keys), C1 on the window the request is served, A2 on SWA slots, and A1 on the
SWA counters."""
from __future__ import annotations

from targets.base import ALL_RULES
from targets.sglang.rules import CAUSES as FULL_CAUSES
from targets.sglang.rules import NOT_APPLICABLE as FULL_NA

RULES = frozenset({"T1", "T2", "T3", "S1", "S2", "S4", "E1", "E2", "E4", "A1", "A2", "C1"})
NOT_APPLICABLE = {
    **{r: why for r, why in FULL_NA.items() if r not in ("S2",)},
    "S3": "SGLang caches a request's KV as it is computed; at close the window state at the frontier is "
          "there unless the window was released (a tombstone), which S2/C1 judge",
    "P1": "SGLang splits an edge at any match, also inside a window that has wrapped (its design: the "
          "head's window state is its SWA slots, kept per token)",
    "C2": "SGLang keeps SWA KV per token, so it resumes inside an edge whose window has wrapped, where the "
          "spec's windowed layer (one state per node end) cannot: what a resume serves is judged by C1",
    "E3": "SWA eviction (tombstoning) takes internal nodes in SWA-LRU order, not leaves in last-use order: "
          "judged by E1/E2/E4 and C1 only",
}
assert set(NOT_APPLICABLE) | RULES == set(ALL_RULES) and not set(NOT_APPLICABLE) & RULES, \
    set(ALL_RULES) ^ (set(NOT_APPLICABLE) | RULES)

CAUSES = {
    **FULL_CAUSES,
    "S2": ("SWARadixCache._match_prefix_helper / evict (tombstones) / _insert_helper",
           "the tree offers a window state at a node end whose SWA slots do not hold that prefix's last keys"),
    "A1": ("SWARadixCache inc_lock_ref / dec_lock_ref / _insert_helper / _delete_leaf",
           "full_* or swa_* evictable + protected differ from the tokens (non-tombstone tokens) the tree holds"),
    "A2": ("SWARadixCache.insert / evict / cache_*_req (frees)",
           "a KV or SWA slot freed twice, freed while the tree holds it, or leaked"),
    "C1": ("SWARadixCache.match_prefix / cache_unfinished_req",
           "a hit serves KV or SWA slots written for another prefix (or released)"),
}

# with EAGLE bigram keys (targets.sglang.swa_eagle) the view's paths are SGLang's bigram keys while the
# pool tags KV and SWA slots with token prefixes: only the rules that read no slot content are judged
EAGLE_RULES = frozenset({"T1", "E1", "E2", "E4", "A1", "A2"})
_EAGLE_WHY = ("EAGLE bigram keys on the SWA cache: the view's paths are bigrams and its KV/SWA contents "
              "token prefixes, so content and shape rules are judged without --eagle only")
EAGLE_NOT_APPLICABLE = {**NOT_APPLICABLE, **{r: _EAGLE_WHY for r in RULES - EAGLE_RULES}}
assert set(EAGLE_NOT_APPLICABLE) | EAGLE_RULES == set(ALL_RULES)
