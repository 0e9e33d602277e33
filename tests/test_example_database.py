"""The shared Hypothesis example database (stateful_tests/database.py, docs/fuzz.md "Sharded nightly").

The nightly's path, offline: each shard saves into its own DirectoryBasedExampleDatabase and uploads
that directory; the merge job downloads them all into one directory (download-artifact's
merge-multiple: the union of the files, whose names are hashes of key and value) and uploads it as
the artifact that GitHubArtifactDatabase reads. Here the artifact is the zip of that directory,
placed where GitHubArtifactDatabase caches downloads, so no network is involved.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
import warnings
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis.database import (DirectoryBasedExampleDatabase, GitHubArtifactDatabase, MultiplexedDatabase,
                                 ReadOnlyDatabase)
from hypothesis.errors import HypothesisWarning

from stateful_tests.database import ARTIFACT, CACHE, example_database

ROOT = Path(__file__).resolve().parents[1]


def _artifact(tmp_path: Path, shard_dirs: list[Path], root: str = "") -> Path:
    """The merge job's artifact: the shards' directories merged, zipped relative to `root`
    (upload-artifact zips the uploaded directory's contents), in GitHubArtifactDatabase's cache."""
    merged = tmp_path / "merged"
    for d in shard_dirs:
        shutil.copytree(d, merged, dirs_exist_ok=True)
    cache = tmp_path / "cache"
    cache.mkdir()
    stamp = datetime.now(timezone.utc).isoformat().replace(":", "_")     # as GitHubArtifactDatabase names it
    with zipfile.ZipFile(cache / f"{stamp}.zip", "w") as z:
        for f in sorted(merged.rglob("*")):
            z.write(f, str(Path(root) / f.relative_to(merged)))
    return cache


def _shards(tmp_path: Path) -> list[Path]:
    dirs = [tmp_path / "shard0", tmp_path / "shard1"]
    a, b = (DirectoryBasedExampleDatabase(d) for d in dirs)
    a.save(b"test_a", b"found by shard 0")
    a.save(b"test_both", b"0")
    b.save(b"test_both", b"1")
    b.save(b"test_b", b"found by shard 1")
    return dirs


def test_the_merged_artifact_holds_every_shards_examples(tmp_path):
    shared = GitHubArtifactDatabase("owner", "repo", path=_artifact(tmp_path, _shards(tmp_path)))
    assert set(shared.fetch(b"test_a")) == {b"found by shard 0"}
    assert set(shared.fetch(b"test_b")) == {b"found by shard 1"}
    assert set(shared.fetch(b"test_both")) == {b"0", b"1"}
    assert list(shared.fetch(b"never saved")) == []


def test_an_artifact_of_the_wrong_directory_is_read_as_empty(tmp_path):
    """Uploading .hypothesis instead of .hypothesis/examples puts every entry under examples/: the
    database then finds nothing (which is why the workflow uploads the examples directory itself)."""
    shared = GitHubArtifactDatabase("owner", "repo", path=_artifact(tmp_path, _shards(tmp_path), root="examples"))
    assert list(shared.fetch(b"test_a")) == []


def test_local_runs_read_the_shared_database_and_write_only_locally(tmp_path):
    local = DirectoryBasedExampleDatabase(tmp_path / "local")
    shared = GitHubArtifactDatabase("owner", "repo", path=_artifact(tmp_path, _shards(tmp_path)))
    db = MultiplexedDatabase(local, ReadOnlyDatabase(shared))
    db.save(b"test_a", b"found here")
    db.delete(b"test_a", b"found by shard 0")          # e.g. fixed here: no longer fails
    assert set(db.fetch(b"test_a")) == {b"found here", b"found by shard 0"}
    assert set(local.fetch(b"test_a")) == {b"found here"}
    assert set(shared.fetch(b"test_a")) == {b"found by shard 0"}


def test_the_environment_picks_the_database(tmp_path):
    local = str(tmp_path / "db")
    db = example_database({"HYPOTHESIS_DATABASE_DIR": local})
    assert db == DirectoryBasedExampleDatabase(local)
    db = example_database({"HYPOTHESIS_DATABASE_DIR": local, "HYPOTHESIS_GITHUB_REPO": "owner/repo"})
    assert isinstance(db, MultiplexedDatabase)
    assert db == MultiplexedDatabase(DirectoryBasedExampleDatabase(local), ReadOnlyDatabase(
        GitHubArtifactDatabase("owner", "repo", artifact_name=ARTIFACT, path=CACHE / ARTIFACT)))
    for bad in ("owner", "owner/", "/repo", "a/b/c"):
        with pytest.raises(ValueError, match="expected owner/name"):
            example_database({"HYPOTHESIS_GITHUB_REPO": bad})


def test_offline_the_shared_database_warns_and_the_local_one_still_works(tmp_path, monkeypatch):
    def offline(*a, **k):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    name = f"test-offline-{uuid.uuid4().hex}"              # its own (empty) download cache
    db = example_database({"HYPOTHESIS_DATABASE_DIR": str(tmp_path / "db"), "HYPOTHESIS_GITHUB_REPO": "o/r",
                           "HYPOTHESIS_ARTIFACT_NAME": name})
    gh = db._wrapped[1]._wrapped                            # Multiplexed(local, ReadOnly(GitHubArtifact))
    assert isinstance(gh, GitHubArtifactDatabase)
    try:
        db.save(b"k", b"v")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert list(db.fetch(b"k")) == [b"v"]
        assert any(issubclass(w.category, HypothesisWarning) and "Could not connect" in str(w.message)
                   for w in seen), [str(w.message) for w in seen]
    finally:
        shutil.rmtree(gh.path, ignore_errors=True)


@pytest.mark.parametrize("repo, profile, want", [
    ("", "dev", "default"),                    # unset: Hypothesis's default, as before
    ("", "nightly", "default"),
    ("owner/repo", "dev", "MultiplexedDatabase"),
    ("owner/repo", "nightly", "MultiplexedDatabase"),
    ("owner/repo", "ci", "NoneType"),              # derandomized: no database at all
    ("owner/repo", "mutation", "NoneType"),
])
def test_the_profiles_take_it_only_when_asked(repo, profile, want):
    code = "import conftest; from hypothesis import settings; print(type(settings.get_profile(%r).database))" % profile
    env = {k: v for k, v in os.environ.items() if k not in ("HYPOTHESIS_GITHUB_REPO", "CI")}
    if repo:
        env["HYPOTHESIS_GITHUB_REPO"] = repo
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = p.stdout.split()[-1]
    if want == "default":           # Hypothesis's own (its class is private): a directory database, no GitHub
        assert "Multiplexed" not in got and "NoneType" not in got, got
    else:
        assert got.endswith(f"{want}'>"), got
