"""MlxVlmTarget: mlx-vlm's automatic prefix cache (APC) behind the target interface of targets/base.py.

The server serves a request in one go, so the operations map onto ServerDriver like this:
  begin(keys)     the request (prompt ids, images, salt) is inserted and the generator's first step
                  runs: its APC lookup (and, when the suffix is one token, the whole prefill);
                  returns (matched, resume): matched from the view's trie, resume the prefix length
                  the generator's own lookup returned
  prefill(n)      n more generator steps (None: until the request finishes, which stores its blocks);
                  True when it finished
  step(key)       nothing: APC stores prompt blocks only, never decoded tokens (the request runs with
                  max_tokens=1, greedy)
  close()         a request not finished yet is removed (`BatchGenerator.remove`: a cancel)
  set_budget(b)   APCManager.memory_max_bytes, then its own enforcement `prepare_prefill(0)` (the server
                  fixes the budget at start, APC_MEMORY_MAX_GB, and enforces it at each admission)
  view()          targets.mlx_vlm.view.view_of
"""
from __future__ import annotations

from targets.mlx_vlm.driver import ServerDriver
from targets.mlx_vlm.models import items_of
from targets.mlx_vlm.view import matched, view_of

RULES = frozenset({"T1", "S1", "M3", "E1", "A1", "C1"})
CHECKPOINT_RULES = RULES - {"S1"}           # qwen3_5: APC's checkpoint mode
NOT_APPLICABLE = {
    "T2": "the index is a chain of fixed-size blocks: sibling blocks may share their first keys",
    "T3": "no live cache persists between requests: the active path is always the root",
    "S2": "checkpoints are taken at len - guard (and every 2048 tokens), never at the match of a begin "
          "that resumes below it; what a restored checkpoint holds is judged as C1 (content)",
    "S3": "a checkpoint holds every layer (one snapshot of the whole prompt cache); blocks are KV only",
    "S4": "blocks are never split: a node's edge is always one block",
    "M1": "mlx-vlm's language models attend causally over image and video tokens (no bidirectional mask); "
          "the vision tower sees a whole image or clip in one forward in get_input_embeddings, not in prefill "
          "chunks",
    "M2": "blocks end inside image and video runs, harmlessly: their tokens are causal in the language model, "
          "and no restore ends inside or before an item (M3, judged on every item)",
    "P1": "no resume inside an edge: lookups match whole blocks",
    "P2": "no compaction: blocks stay block-sized",
    "G1": "no merges",
    "G2": "no merges",
    "E2": "no protection beyond the open request's leased blocks (ref counts); E1 is judged at rest",
    "E3": "the LRU free list is not shown in the view (last_used is unknown)",
    "E4": "eviction takes single blocks from the free list's head, leaves or not: no shape to judge",
    "E5": "no rewind within a checkpoint: a recurrent checkpoint restores only at its own end (or not at all)",
    "A2": "blocks are Python objects from a preallocated pool: no snapshot identities to count",
    "A3": "allocator memory is not judged per operation (bytes are the blocks' own nbytes)",
    "C2": "by design mlx-vlm restores less than the trie holds: no memory prefix that contains an image, none "
          "that ends before the last image's end, and every block is salted with the whole request's "
          "media; a resume deeper than the keys allow is judged by C1 (content)",
}


S1_CHECKPOINT = "a checkpoint holds KV for [0, end) as one full copy, never per-edge slices (its design)"


class MlxVlmTarget:
    name = "mlx-vlm"
    RULES = RULES
    NOT_APPLICABLE = NOT_APPLICABLE

    def __init__(self, arch: str = "qwen2_vl", images: dict | None = None, budget: int | None = None,
                 **driver_args):
        self.driver = ServerDriver(arch=arch, images=images, **driver_args)
        if self.driver.gen.apc is not None and self.driver.gen.apc.legacy_mode == "exact":
            self.RULES = CHECKPOINT_RULES
            self.NOT_APPLICABLE = dict(NOT_APPLICABLE, S1=S1_CHECKPOINT)
        if budget is not None:
            self.driver.manager.memory_max_bytes = int(budget)
        self._open = None

    def begin(self, keys, spans=()) -> tuple:
        keys = list(keys)
        m = matched(self.driver, keys)
        resume = self.driver.start(keys)
        self._open = {"keys": keys, "spans": [(p, e) for p, e, _ in items_of(keys)], "matched": m,
                      "resume": resume, "live": self.driver.restored()}
        return m, resume

    def prefill(self, max_chunks: int | None = None) -> bool:
        self.driver.advance(max_chunks)
        if self.driver.done:
            self._open["prefilled"] = True
        return self.driver.done

    def step(self, key: int) -> None:
        pass

    def close(self) -> None:
        self.driver.cancel()
        self._open = None

    def set_budget(self, budget: int) -> None:
        self.driver.manager.memory_max_bytes = int(budget)
        self.driver.manager.prepare_prefill(0)

    def view(self):
        return view_of(self.driver, self._open)

    def shutdown(self) -> None:
        self.driver.close()
