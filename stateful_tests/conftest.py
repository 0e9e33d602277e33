"""Example database for the state machines (docs/stateful_tests.md).

The profiles (ci / dev / nightly) come from the root conftest.py; the database from
stateful_tests/database.py: the local DirectoryBasedExampleDatabase (HYPOTHESIS_DATABASE_DIR,
default .hypothesis/examples) and, with HYPOTHESIS_GITHUB_REPO=owner/name, the nightly's merged
artifact "hypothesis-example-db" read only under it (MultiplexedDatabase), so a local run replays
first whatever the nightly found.

The ci profile is derandomized, which in Hypothesis implies database=None:
CI runs stay hermetic and reproduce by seed (print_blob is on), and
`stateful_settings()` leaves them alone.
"""
from __future__ import annotations

from hypothesis import settings

from stateful_tests.database import example_database, shared_example_database

DATABASE = example_database() if shared_example_database() is None else shared_example_database()


def stateful_settings(**overrides) -> settings:
    """The current profile, with the example database above unless the
    profile is derandomized (ci), plus per-machine `overrides`."""
    if settings.default.derandomize or "database" in overrides:
        return settings(**overrides)
    return settings(database=DATABASE, **overrides)


def pytest_report_header(config):
    kind = type(DATABASE).__name__
    return f"stateful_tests example database: {kind}" + (
        " (ignored: derandomized profile)" if settings.default.derandomize else "")
