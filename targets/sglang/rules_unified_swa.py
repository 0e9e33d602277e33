"""Which rules apply to SGLang 0.5.23's UnifiedRadixCache with its SWA component (Full + SWA, and Full +
SWA + Mamba): those of SWARadixCache (targets.sglang.rules_swa; with Mamba the recurrent layer is judged
by the same S2 / C1 / A1 / A2, and C2 / P1 stay out for the SWA reasons), with the causes named in the
unified cache's functions."""
from __future__ import annotations

import re

from targets.sglang.rules_swa import CAUSES as SWA_CAUSES
from targets.sglang.rules_swa import NOT_APPLICABLE, RULES  # noqa: F401  (same rule set)

CAUSES = {r: (re.sub(r"\b(SWA)?RadixCache\b", "UnifiedRadixCache", c), w) for r, (c, w) in SWA_CAUSES.items()}
CAUSES["S4"] = ("UnifiedTreeCore._split_node / TreeComponent.redistribute_on_node_split",
                "the halves of a split node do not hold the two halves of its KV / SWA slots, or a state left the tail")
CAUSES["S2"] = ("SWAComponent.create_match_validator / evict_component / update_component_on_insert_overlap",
                "the tree offers a window (or state) at a node end whose SWA slots (or state) do not hold that "
                "prefix's")
CAUSES["A2"] = ("UnifiedRadixCache.checkpoint_into_tree / free_kv_row / evict, SWAComponent.apply_component_action",
                "a KV, SWA or state slot freed twice, freed while the tree holds it, freed with no SWA peer, or "
                "leaked")
CAUSES["A1"] = ("UnifiedTreeCore inc_lock_ref / dec_lock_ref / insert / evict, SWAComponent.acquire_component_lock / "
                "release_component_lock", "component_evictable_size_ + component_protected_size_ (FULL, SWA or MAMBA) "
                "differ from the tokens / live SWA tokens / states the tree holds")
CAUSES["C1"] = ("UnifiedRadixCache.match_prefix / checkpoint_into_tree",
                "a hit serves KV, SWA slots or a state written for another prefix (or released)")
