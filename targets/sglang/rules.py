"""Which rules apply to SGLang's RadixCache (full attention), and the SGLang function each
violation is attributed to.

Every applicable rule is judged by spec.rules' predicates alone on the views of
targets.sglang.view; C1 is content identity (no forward: each KV slot is tagged with the prefix it
was written for, and the request's served slots must carry exactly its keys), A2 is slot ownership
(no double free, no slot in the tree while free in the pool, no slot leaked).
"""
from __future__ import annotations

from targets.base import ALL_RULES

RULES = frozenset({"T1", "T2", "T3", "S1", "S4", "P1", "E1", "E2", "E3", "E4", "A1", "A2", "C1", "C2"})
NOT_APPLICABLE = {
    "S2": "full attention only: the tree holds no whole-state (SWA/Mamba) snapshots in this target",
    "S3": "full attention only: every node's KV is its edge's slots; there is no page-out of a live state",
    "M1": "no non-causal media: the radix key is token ids (an extra_key namespace is not media)",
    "M2": "no non-causal media: the radix key is token ids (an extra_key namespace is not media)",
    "M3": "no non-causal media: the radix key is token ids (an extra_key namespace is not media)",
    "P2": "no compaction by design: split nodes are never merged back (a policy, not a lost restore point: "
          "every KV prefix stays a restore point)",
    "G1": "nodes never merge (only leaves are evicted), so no KV ranges are concatenated",
    "G2": "nodes never merge (only leaves are evicted)",
    "E5": "every cached KV prefix is a restore point; there is no checkpoint to fold away (C2 covers resumes)",
    "A3": "memory figures per operation are not in the view; slot ownership is judged by A2",
}
assert set(NOT_APPLICABLE) | RULES == set(ALL_RULES) and not set(NOT_APPLICABLE) & RULES

# with page_size > 1 the tree holds whole pages and a match floors to a page boundary (its design):
PAGED = {
    "C2": "page_size > 1: a match floors to a page boundary by design (judged with page_size 1)",
    "P1": "page_size > 1: a match inside an edge splits at the page floor, not at the token (judged with page_size 1)",
    "T3": "page_size > 1: the request's unaligned tail is its own, not the tree's (judged with page_size 1)",
    "T2": "page_size > 1: children are keyed by their first page; siblings may share a first token",
}

# with EAGLE bigram keys (is_eagle, 0.5.3 on; targets.sglang.reqcalls) the view's keys are SGLang's
# bigrams, so the rules read them as token keys; only C2 is set aside
EAGLE = {
    "C2": "EAGLE bigram keys: C2 reads the begin's token keys while the view's paths are bigrams (a match "
          "needs the token after its last position, so it stops one token short of the token prefix by design)",
}

# rule -> (SGLang function responsible, what it does wrong when the rule breaks)
CAUSES = {
    "T1": ("RadixCache._split_node / _insert_helper", "a node's key, parent link or offsets do not agree"),
    "T2": ("RadixCache._insert_helper", "two children of one node start with the same token"),
    "T3": ("RadixCache.match_prefix", "the request's locked node does not end where its slots end"),
    "S1": ("RadixCache._split_node / _insert_helper",
           "a node's value (KV slots) does not span its key exactly, or holds another prefix's KV"),
    "S4": ("RadixCache._split_node", "the halves of a split node do not hold the two halves of its KV"),
    "P1": ("RadixCache._match_prefix_helper", "a match inside an edge does not split it at the match"),
    "E1": ("RadixCache.evict", "evict(n) freed fewer tokens than asked while evictable leaves remained"),
    "E2": ("RadixCache.evict", "a locked or branching node was evicted"),
    "E3": ("RadixCache.evict", "a leaf was evicted before an older evictable one (LRU order)"),
    "E4": ("RadixCache.evict / _delete_leaf", "a node with children was removed"),
    "A1": ("RadixCache.inc_lock_ref / dec_lock_ref / _insert_helper / _delete_leaf",
           "evictable_size_ + protected_size_ differs from the tokens the tree holds"),
    "A2": ("RadixCache.evict / cache_finished_req (free of duplicates)",
           "a KV slot freed twice, freed while the tree still holds it, or leaked"),
    "C1": ("RadixCache.match_prefix", "a hit serves KV slots written for another prefix"),
    "C2": ("RadixCache.match_prefix", "the match stops short of the longest cached prefix"),
}
