"""Fixtures for the spec's own tests; helpers live in spec_helpers.py."""
import pytest
from spec_helpers import HYBRID

from spec.cache import PrefixCache


@pytest.fixture
def hybrid():
    return PrefixCache(HYBRID)
