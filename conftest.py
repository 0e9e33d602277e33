"""Hypothesis profiles for the whole suite.

ci:      bounded and derandomised (seeded; the seed is printed), no deadline.
dev:     the default for local runs.
crosshair: the optional hypothesis-crosshair backend, when installed.
nightly: many more examples and longer state-machine runs.
mutation: the ci volume without shrinking, for stateful_tests/mutation.py;
         mutation-deep: its second pass (400 examples of 60 steps).
Select with HYPOTHESIS_PROFILE; CI=true selects "ci".

A test whose model cannot load in $PREFIX_TRIE_DTYPE on this backend (impl.models.DtypeUnsupported: a
half-precision load whose first token needs a kernel the backend lacks, e.g. the MoE models on MLX's
CPU) is skipped with that message; float32 loads never raise it.

Example database: Hypothesis's default (.hypothesis/examples) unless HYPOTHESIS_GITHUB_REPO=owner/name
is set; then dev and nightly read the nightly's merged database of that repository too, read only
(stateful_tests/database.py, docs/fuzz.md "Sharded nightly"). Derandomized profiles have none.
"""
import importlib.util
import os

import pytest
from hypothesis import HealthCheck, Phase, settings

from impl.platform import apply_device_env, platform_line
from stateful_tests.database import shared_example_database

apply_device_env()        # PREFIX_TRIE_DEVICE=cpu|gpu (impl/platform.py)
SHARED = {} if shared_example_database() is None else {"database": shared_example_database()}

try:
    from impl.models import DtypeUnsupported
except ImportError:          # an engine's own interpreter without MLX (the targets' real-engine tests)
    class DtypeUnsupported(Exception):
        pass

settings.register_profile(
    "ci", max_examples=60, stateful_step_count=40, deadline=None, derandomize=True,
    print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "dev", max_examples=100, stateful_step_count=50, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow], **SHARED)
settings.register_profile(
    "nightly", max_examples=5000, stateful_step_count=200, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], **SHARED)
# For stateful_tests/mutation.py: the ci volume, derandomised, no shrinking (a kill needs one failure).
settings.register_profile(
    "mutation", max_examples=60, stateful_step_count=40, deadline=None, derandomize=True,
    phases=[Phase.explicit, Phase.generate], print_blob=False, suppress_health_check=list(HealthCheck))
settings.register_profile(     # its second pass, on the mutants that survived the first
    "mutation-deep", parent=settings.get_profile("mutation"), max_examples=400, stateful_step_count=60)
if importlib.util.find_spec("hypothesis_crosshair_provider") is not None:
    # Optional symbolic backend: pip install -e ".[crosshair]", then HYPOTHESIS_PROFILE=crosshair.
    settings.register_profile(
        "crosshair", backend="crosshair", max_examples=200, deadline=None, database=None,
        suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def pytest_report_header(config):
    return [f"hypothesis profile: {settings._current_profile}", f"platform: {platform_line()}"]


def pytest_terminal_summary(terminalreporter):
    """The platform again at the end, where -q runs (CI's) show it beside any failure."""
    terminalreporter.write_line(f"platform: {platform_line()}")


def _dtype_unsupported_is_a_skip():
    try:
        return (yield)
    except DtypeUnsupported as e:
        pytest.skip(f"{e} (PREFIX_TRIE_DTYPE={os.environ.get('PREFIX_TRIE_DTYPE')})")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _dtype_unsupported_is_a_skip())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _dtype_unsupported_is_a_skip())
