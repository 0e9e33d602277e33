"""F1 needs a model's size before its first load: estimate_bytes reads it
from the configuration and must equal what the load then holds."""
import pytest

from impl.models import MODEL_NAMES, _loaded, estimate_bytes, load


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_estimate_before_load_equals_loaded_weight_bytes(name):
    _loaded.pop(name, None)
    before = estimate_bytes(name)
    assert before == load(name).weight_bytes


def test_unknown_model_is_refused():
    with pytest.raises(KeyError, match="unknown model"):
        estimate_bytes("gpt-5")
