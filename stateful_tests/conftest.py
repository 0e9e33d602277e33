"""Example database for the state machines (docs/stateful_tests.md).

The profiles (ci / dev / nightly) come from the root conftest.py. Here we only
choose where failing examples are saved and replayed from:

- always: the local DirectoryBasedExampleDatabase (HYPOTHESIS_DATABASE_DIR,
  default .hypothesis/examples), where the nightly run saves what it finds
  and which its workflow uploads as the artifact "hypothesis-example-db";
- when HYPOTHESIS_GITHUB_REPO=owner/name is set (and GITHUB_TOKEN, needed
  for private repositories and for the API rate limit): that artifact, read
  only, layered under the local one with MultiplexedDatabase, so a local
  run replays first whatever the nightly (or CI) found.

The ci profile is derandomized, which in Hypothesis implies database=None:
CI runs stay hermetic and reproduce by seed (print_blob is on), and
`stateful_settings()` leaves them alone.
"""
from __future__ import annotations

import os

from hypothesis import settings
from hypothesis.database import (DirectoryBasedExampleDatabase, GitHubArtifactDatabase, MultiplexedDatabase,
                                 ReadOnlyDatabase)

ARTIFACT = os.environ.get("HYPOTHESIS_ARTIFACT_NAME", "hypothesis-example-db")


def example_database(env=None):
    """The database the environment asks for (see the module docstring)."""
    env = os.environ if env is None else env
    local = DirectoryBasedExampleDatabase(env.get("HYPOTHESIS_DATABASE_DIR", ".hypothesis/examples"))
    repo = env.get("HYPOTHESIS_GITHUB_REPO", "")
    if "/" not in repo:
        return local
    owner, name = repo.split("/", 1)
    shared = ReadOnlyDatabase(GitHubArtifactDatabase(owner, name, artifact_name=env.get(
        "HYPOTHESIS_ARTIFACT_NAME", ARTIFACT)))
    return MultiplexedDatabase(local, shared)


DATABASE = example_database()


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
