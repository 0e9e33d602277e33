"""The Hypothesis example database of the suite, shared with the nightly (docs/fuzz.md "Sharded
nightly", docs/stateful_tests.md "Profiles, database, replaying failures").

- always: the local DirectoryBasedExampleDatabase (HYPOTHESIS_DATABASE_DIR, default
  .hypothesis/examples), where a run saves what it finds; each nightly shard uploads it, and the
  nightly's merge job uploads the union of the shards' as the artifact "hypothesis-example-db";
- when HYPOTHESIS_GITHUB_REPO=owner/name is set (with GITHUB_TOKEN: required for a private
  repository and for the API's rate limit): that artifact of the repository's latest run, read only
  (GitHubArtifactDatabase, cached a day under .hypothesis/github-artifacts/), layered under the
  local one with MultiplexedDatabase, so a run replays first whatever the nightly's shards found and
  saves only locally. Without network or token Hypothesis warns (HypothesisWarning) and goes on
  with the local database alone.

Without HYPOTHESIS_GITHUB_REPO nothing changes: the root conftest.py leaves the profiles on
Hypothesis's default database (the same directory). A derandomized profile (ci, mutation) has no
database at all, whatever the environment.
"""
from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from hypothesis.database import (DirectoryBasedExampleDatabase, ExampleDatabase, GitHubArtifactDatabase,
                                 MultiplexedDatabase, ReadOnlyDatabase)

ARTIFACT = "hypothesis-example-db"
CACHE = Path(".hypothesis") / "github-artifacts"      # downloads, kept a day (cache_timeout)


def example_database(env=None) -> ExampleDatabase:
    """The database the environment `env` (default os.environ) asks for (module docstring)."""
    env = os.environ if env is None else env
    local = DirectoryBasedExampleDatabase(env.get("HYPOTHESIS_DATABASE_DIR", ".hypothesis/examples"))
    repo = env.get("HYPOTHESIS_GITHUB_REPO", "")
    if not repo:
        return local
    owner, _, name = repo.partition("/")
    if not owner or not name or "/" in name:
        raise ValueError(f"HYPOTHESIS_GITHUB_REPO={repo!r}: expected owner/name (the repository whose "
                         f"nightly uploads the artifact {ARTIFACT!r})")
    artifact = env.get("HYPOTHESIS_ARTIFACT_NAME", ARTIFACT)
    # Hypothesis's own cache location, given explicitly: without `path` the constructor touches its
    # storage directory, which Hypothesis flags during conftest initialization.
    shared = GitHubArtifactDatabase(owner, name, artifact_name=artifact, path=CACHE / artifact)
    return MultiplexedDatabase(local, ReadOnlyDatabase(shared))


@cache
def shared_example_database() -> ExampleDatabase | None:
    """One database per process for this environment (one artifact download): None without
    HYPOTHESIS_GITHUB_REPO (keep Hypothesis's default)."""
    return example_database() if os.environ.get("HYPOTHESIS_GITHUB_REPO") else None
