"""F1 needs a model's size before its first load: estimate_bytes reads it
from the configuration and must equal what the load then holds, in the dtype the load uses."""
import pytest

from impl.models import MODEL_NAMES, _key, _loaded, default_dtype, estimate_bytes, load


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_estimate_before_load_equals_loaded_weight_bytes(name):
    _loaded.pop(_key(name, default_dtype()), None)
    before = estimate_bytes(name)
    assert before == load(name).weight_bytes


@pytest.mark.parametrize("name,dtype", [("smollm2", "q4"), ("smollm2", "bfloat16"), ("qwen3next", "float16")])
def test_the_estimate_follows_the_dtype_asked_for(name, dtype):
    """A half-precision load holds half the float32 bytes, SmolLM2's q4 the GGUF's packed tensors; the
    scheduler's F1 check would otherwise count a bfloat16 runner twice (PREFIX_TRIE_DTYPE=bfloat16)."""
    _loaded.pop(_key(name, dtype), None)
    before = estimate_bytes(name, dtype)
    assert before == load(name, dtype).weight_bytes
    assert before < estimate_bytes(name, "float32")


def test_unknown_model_or_dtype_is_refused():
    with pytest.raises(KeyError, match="unknown model"):
        estimate_bytes("gpt-5")
    with pytest.raises(KeyError, match="q4"):
        estimate_bytes("gemma3", "q4")
