"""Which rules apply to SGLang 0.5.23's UnifiedRadixCache with its Full and Mamba components: those of
MambaRadixCache (targets.sglang.rules_mamba), with the causes named in the unified cache's functions."""
from __future__ import annotations

from targets.sglang.rules_mamba import NOT_APPLICABLE, RULES  # noqa: F401  (same rule set)
from targets.sglang.rules_mamba import CAUSES as MAMBA_CAUSES

CAUSES = {r: (c.replace("MambaRadixCache", "UnifiedRadixCache/MambaComponent"), w)
          for r, (c, w) in MAMBA_CAUSES.items()}
