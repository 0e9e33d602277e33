"""Section 1: a media item's key is its fold, a hash of its bytes and
preprocessing with FOLD_BIT set, so it never equals a token id. impl folds
with its own code (impl.media); the spec with spec.media. The conformance
machines send impl the keys impl's code makes and compare them with the
spec's; this property checks the two folds directly, on any bytes, dims,
run length and causality."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import impl.media
import spec.media
from stateful_tests.requests import BytesOnlyItem, BytesOnlyMedia, impl_item

items = st.builds(dict, data=st.binary(max_size=64), dims=st.lists(st.integers(0, 4096), max_size=3).map(tuple),
                  length=st.integers(1, 1 << 20), causal=st.booleans())


@given(item=items, token=st.integers(0, spec.media.TOKEN_LIMIT - 1))
def test_impl_and_spec_fold_agree_set_the_bit_and_never_equal_a_token(item, token):
    mine = impl.media.MediaItem(pos=0, **item).fold
    theirs = spec.media.fold_key(item["data"], item["dims"], item["length"], item["causal"])
    assert mine == theirs == spec.media.MediaItem(pos=0, **item).fold
    assert mine & impl.media.FOLD_BIT and mine & spec.media.FOLD_BIT
    assert spec.media.TOKEN_LIMIT <= mine < 2 * spec.media.FOLD_BIT
    assert mine != token
    assert impl.media.FOLD_BIT == spec.media.FOLD_BIT and impl.media.TOKEN_LIMIT == spec.media.TOKEN_LIMIT


@given(item=items, pos=st.integers(0, 8), tail=st.lists(st.integers(1, 9), min_size=1, max_size=4))
def test_prompt_keys_are_the_specs(item, pos, tail):
    """impl's key stream of a prompt with one item is spec's keys_of, also for
    the machines' bytes-only items (folded by each side's own fold of the bytes)."""
    length = min(item["length"], 16)
    tokens = [1] * pos + [0] * length + tail
    for cls in (spec.media.MediaItem, BytesOnlyItem):
        it = cls(pos=pos, **dict(item, length=length))
        mine = impl_item(it)
        assert isinstance(mine, BytesOnlyMedia) == (cls is BytesOnlyItem)
        assert impl.media.keys_of(tokens, [mine]) == spec.media.keys_of(tokens, [it])
        assert impl.media.noncausal_spans([mine]) == spec.media.noncausal_spans([it])
