"""Attention masks with non-causal media spans (REFERENCE M1).

Invariants:
- With no span touching the current forward, masks are exactly what mlx-lm's own caches return
  (the same function calls), so logits match stock mlx-lm bit for bit.
- With spans, the mask is a boolean array [N, K]: query position q may attend key position k when
  k <= q (and q - k < window for sliding-window layers), or when q and k lie in the same span
  [start, end) (bidirectional inside one media item). Spans are absolute token positions.
- A single-token forward ignores spans: one position cannot see later positions of its own item,
  and M1 requires a non-causal item to be evaluated in one forward anyway.
"""

from __future__ import annotations

from typing import Optional, Sequence

import mlx.core as mx


def spans_touching(spans: Sequence[tuple[int, int]], q_start: int, n: int) -> list[tuple[int, int]]:
    """The spans that contain at least one query position of the forward [q_start, q_start+n)."""
    q_end = q_start + n
    return [(s, e) for s, e in spans if e > s and s < q_end and e > q_start]


def span_mask(
    q_start: int,
    n: int,
    k_start: int,
    k_len: int,
    spans: Sequence[tuple[int, int]],
    window_size: Optional[int] = None,
) -> mx.array:
    """Boolean mask for queries at [q_start, q_start+n) over keys at [k_start, k_start+k_len)."""
    q = mx.arange(q_start, q_start + n)[:, None]
    k = mx.arange(k_start, k_start + k_len)[None]
    mask = q >= k
    if window_size is not None:
        mask = mask & (q < k + window_size)
    for s, e in spans:
        inside = ((q >= s) & (q < e)) & ((k >= s) & (k < e))
        mask = mask | inside
    return mask
