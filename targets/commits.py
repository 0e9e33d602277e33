"""An engine's package as it was at one commit of its git history, for replays on commits.

  commit_dir(engine, git_dir, sha, root)   root/_commits/<sha>/<package>: `git archive` of the package at
                                           the 40-hex commit `sha` of git_dir (a checkout or a bare
                                           repository), without its symbolic links (links out of the
                                           package, as SGLang's .clang-format, break the copy); kept for
                                           the next caller
  range_trees(engine, git_dir, rng, under, root)   [(sha, commit_dir)] for each commit of `rng` (A..B,
                                           oldest first) that touched the path `under`

Used by targets/fixcommits.py (trees built from commits) and by the replays over a commit range
(`check-vllm replay --repo --range`, `check-sglang --replay --repo --range`).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

PACKAGE = {"vllm": "vllm", "sglang": "sglang"}
# where each engine's package lies in its repository
IN_REPO = {"vllm": "vllm", "sglang": "python/sglang"}
COMMIT = re.compile(r"[0-9a-f]{40}")


def commit_dir(engine: str, git_dir, sha: str, root: Path) -> Path:
    """root/_commits/<sha>/<package>: the engine's package at commit `sha` of the git directory git_dir
    (git archive, without its symbolic links; kept for the next tree)."""
    if not COMMIT.fullmatch(sha):
        raise ValueError(f"{sha!r} is not a 40-hex commit id")
    dst = Path(root) / "_commits" / sha
    if (dst / PACKAGE[engine] / "__init__.py").exists():
        return dst
    if not git_dir:
        raise ValueError(f"commit {sha[:9]}: a commit tree needs --{engine}-git (a git directory with its history)")
    r = subprocess.run(["git", "-C", str(git_dir), "archive", sha, IN_REPO[engine]], capture_output=True)
    if r.returncode:
        err = (r.stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1]
        raise ValueError(f"commit {sha[:9]}: no {IN_REPO[engine]} there in {git_dir} ({err})")
    dst.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "--strip-components", str(IN_REPO[engine].count("/")), "-C", str(dst)],
                   input=r.stdout, check=True)
    for f in [f for f in dst.rglob("*") if f.is_symlink()]:   # links out of the package (.clang-format)
        f.unlink()
    return dst


def range_trees(engine: str, git_dir, rng: str, under: str, root: Path) -> list:
    """(commit id, tree) for each commit of `rng` (A..B, oldest first) that touched `under` (a path in
    the repository), each tree the package at that commit (commit_dir)."""
    revs = subprocess.run(["git", "-C", str(git_dir), "rev-list", "--reverse", rng, "--", under],
                          capture_output=True, text=True, check=True).stdout.split()
    return [(rev, commit_dir(engine, git_dir, rev, root)) for rev in revs]
