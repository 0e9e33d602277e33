"""The trees that confirm the vLLM and SGLang fixing commits (targets/fixcommits.py, issue 49).

Always, no peer needed (well under a second): a tree is built from fake unpacked releases with the file
swapped from the other release and the revert applied, the releases untouched; a revert whose text
the release does not hold is refused; every tree names saved findings that exist and replay flags for
them; the vLLM revert is the exact inverse of the one-line fix targets/vllm/onefix.py applies to
0.25.0; the verdict reader maps both engines' replay lines; a commit tree is the package at that commit
of a git directory (a one-commit repository made here), its links dropped, and a missing git directory,
an unknown commit or a short id is refused; each vLLM and SGLang fix commit is replayed beside its
parent. The real runs are `python -m targets.fixcommits --run [--vllm-git GITDIR] [--sglang-git GITDIR]`
(docs/peers.md, vLLM and SGLang "fixing commit").
"""
from __future__ import annotations

from pathlib import Path

import pytest

from targets import fixcommits as fc
from targets.vllm import onefix as vl


def _releases(root: Path, files: dict) -> Path:
    """root/<release>/<package>/...: {(release, path under root/<release>): text}."""
    for (rel, path), text in files.items():
        f = root / rel / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return root


def test_a_tree_takes_the_swapped_file_and_the_revert_and_leaves_the_releases_alone(tmp_path):
    rel = _releases(tmp_path / "rel", {
        ("1.0", "pkg/__init__.py"): "", ("1.0", "pkg/a.py"): "old a\n", ("1.0", "pkg/b.py"): "keep\nfix\n",
        ("2.0", "pkg/__init__.py"): "", ("2.0", "pkg/a.py"): "new a\n"})
    fc.PACKAGE["toy"] = "pkg"
    try:
        tree = fc.Tree("t", "toy", "1.0", swaps=[("a.py", "2.0")], edits=[("b.py", "fix\n", "unfixed\n")])
        dst = fc.build(tree, lambda v: rel / v, tmp_path / "trees")
    finally:
        del fc.PACKAGE["toy"]
    assert (dst / "pkg" / "a.py").read_text() == "new a\n"
    assert (dst / "pkg" / "b.py").read_text() == "keep\nunfixed\n"
    assert (rel / "1.0" / "pkg" / "a.py").read_text() == "old a\n"
    assert (rel / "1.0" / "pkg" / "b.py").read_text() == "keep\nfix\n"


def test_a_revert_whose_text_the_release_lacks_is_refused(tmp_path):
    rel = _releases(tmp_path / "rel", {("0.26.0", "vllm/__init__.py"): "",
                                       ("0.26.0", f"vllm/{fc.COORD}"): "                if drop_eagle_block:\n"})
    tree = next(t for t in fc.TREES if t.name == "vllm-0.26.0-without-46384-gate")
    with pytest.raises(ValueError, match="occurs 0 times"):
        fc.build(tree, lambda v: rel / v, tmp_path / "trees")


def test_every_tree_names_saved_findings_and_how_to_replay_them(tmp_path):
    for tree in fc.TREES:
        assert tree.expect, tree.name
        for finding, want in tree.expect.items():
            assert (fc.FINDINGS[tree.engine] / f"{finding}.json").exists(), (tree.name, finding)
            assert want in ("reproduces", "does not reproduce", "does not load"), (tree.name, want)
            cmd = fc.replay_command(tree.engine, finding, tmp_path)
            assert str(tmp_path) in cmd and cmd[0].endswith("dev")
    assert fc.replay_command("sglang", "A2-swa-eagle-page1", tmp_path)[-4:-2] == ["--page-size", "1"]


def test_the_vllm_revert_is_the_inverse_of_the_one_line_fix():
    (fix_old, fix_new), = [(o, n) for _, o, n in vl.FIXES["mamba-no-eagle-margin"]]
    (_, rev_old, rev_new), = next(t for t in fc.TREES if t.name == "vllm-0.26.0-without-46384-gate").edits
    assert rev_old in fix_new and rev_new in fix_old and rev_old not in fix_old


@pytest.mark.parametrize("engine, out, want", [
    ("vllm", "/tmp/t (vLLM 0.26.0): C1-mamba-eagle.json: reproduces\nx.json: reproduces from /tmp/t on", "reproduces"),
    ("vllm", "/tmp/t (vLLM 0.26.0): C1-hybrid-eagle.json: does not reproduce\nx: reproduces on none", "does not reproduce"),
    ("vllm", "/tmp/t: could not run (TypeError: get_kv_cache_coordinator() got ...)", "does not load"),
    ("sglang", "sglang 0.5.8 (/tmp/t) SWARadixCache: A2-swa-eagle-page2.json (A2): reproduces\n"
               "A2-swa-eagle-page2.json: still reproduces", "reproduces"),
    ("sglang", "sglang 0.5.6 (/tmp/t) SWARadixCache: A2-swa-eagle-page1.json (A2): does not reproduce (other rules: "
               "A1)\nA2-swa-eagle-page1.json: stops reproducing at sglang 0.5.6", "does not reproduce"),
    ("sglang", "/tmp/t: could not load (ImportError: cannot import name 'MatchPrefixParams')", "does not load"),
    ("sglang", "", "no verdict"),
])
def test_the_verdict_is_read_from_the_replays_own_lines(engine, out, want):
    assert fc.verdict(engine, out) == want


def _git_repo(root: Path, in_repo: str = "python/sglang") -> tuple:
    """A git directory whose one commit holds <in_repo>/{__init__.py,a.py} and a link out of the
    package (as SGLang's cpp_radix_tree/.clang-format); -> (git dir, commit id)."""
    import subprocess
    def git(*args):
        return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()
    pkg = root / in_repo
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("keep\nfix\n")
    (pkg / "link").symlink_to("../../elsewhere")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "one")
    return root / ".git", git("rev-parse", "HEAD")


def test_a_commit_tree_is_the_package_at_that_commit_without_links_and_with_the_revert(tmp_path):
    git_dir, sha = _git_repo(tmp_path / "repo")
    tree = fc.Tree("t", "sglang", sha, edits=[("a.py", "fix\n", "unfixed\n")])
    dst = fc.build(tree, fc._release_dir("sglang", "", str(git_dir), tmp_path / "trees"), tmp_path / "trees")
    assert (dst / "sglang" / "a.py").read_text() == "keep\nunfixed\n"
    assert not (dst / "sglang" / "link").is_symlink()
    assert (tmp_path / "trees" / "_commits" / sha / "sglang" / "a.py").read_text() == "keep\nfix\n"


def test_a_vllm_commit_tree_is_its_top_level_package(tmp_path):
    git_dir, sha = _git_repo(tmp_path / "repo", "vllm")
    dst = fc.commit_dir("vllm", str(git_dir), sha, tmp_path / "trees")
    assert (dst / "vllm" / "a.py").read_text() == "keep\nfix\n" and not (dst / "vllm" / "link").exists()
    with pytest.raises(ValueError, match="needs --vllm-git"):
        fc.commit_dir("vllm", "", "1" * 40, tmp_path / "trees")


def test_a_commit_tree_refuses_a_missing_history_an_unknown_commit_and_a_short_id(tmp_path):
    git_dir, sha = _git_repo(tmp_path / "repo")
    with pytest.raises(ValueError, match="needs --sglang-git"):
        fc.commit_dir("sglang", "", sha, tmp_path / "trees")
    with pytest.raises(ValueError, match="no python/sglang there"):
        fc.commit_dir("sglang", str(git_dir), "0" * 40, tmp_path / "trees")
    with pytest.raises(ValueError, match="not a 40-hex commit id"):
        fc.commit_dir("sglang", str(git_dir), sha[:9], tmp_path / "trees")


def test_each_fix_commit_is_replayed_with_its_parent():
    """The commit trees name each fix by replay: the parent reproduces, the fix commit does not."""
    by_base = {t.base: t for t in fc.TREES if fc.COMMIT.fullmatch(t.base) and not t.edits}
    vllm = [("8e981630c", "481e481be", f) for f in ("C1-mamba-eagle", "S1-hybrid-eagle", "C1-hybrid-eagle")]
    for parent, fix, finding in vllm + [("a92afb00c", "ac4382263", "A2-req-eagle-page2"),
                                 ("a0985dd5e", "160a06cab", "A2-swa-eagle-page1"),
                                 ("7520b9292", "a618202fc", "A2-swa-eagle-page2")]:
        (p,), (f,) = ([t for b, t in by_base.items() if b.startswith(x)] for x in (parent, fix))
        assert p.expect[finding] == "reproduces" and f.expect[finding] == "does not reproduce"


def test_the_vllm_commit_trees_are_skipped_without_vllm_git_and_built_from_it_when_given(tmp_path, capsys):
    gate = "                if drop_eagle_block and not isinstance(spec, MambaSpec):\n"
    rel = _releases(tmp_path / "rel", {(v, f"vllm/{f}"): t for v in ("0.25.0", "0.26.0")
                                       for f, t in (("__init__.py", ""), (fc.COORD, gate))})
    args = ["--engine", "vllm", "--vllm-releases", str(rel), "--root", str(tmp_path / "trees")]
    assert fc.main(args) == 0
    assert "vllm-481e481be-46384: skipped (a commit tree: needs --vllm-git)" in capsys.readouterr().out
    git_dir, _ = _git_repo(tmp_path / "repo", "vllm")          # a history without the vLLM commits
    with pytest.raises(ValueError, match="commit 8e981630c: no vllm there"):
        fc.main(args + ["--vllm-git", str(git_dir), "--sglang-git", "/nonexistent"])


def test_a_replay_over_a_range_takes_each_commit_that_touched_the_caches(tmp_path):
    """`check-sglang --replay P --repo GITDIR --range A..B` (and check-vllm's): one tree per commit of the
    range that changed the caches' folder, oldest first; a commit elsewhere is not replayed."""
    import subprocess

    from targets.commits import range_trees
    git_dir, first = _git_repo(tmp_path / "repo")

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path / "repo"), "-c", "user.name=t", "-c", "user.email=t@t",
                               *args], check=True, capture_output=True, text=True).stdout.strip()

    def commit(path, text, msg):
        f = tmp_path / "repo" / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
        git("add", "-A")
        git("commit", "-q", "-m", msg)
        return git("rev-parse", "HEAD")
    two = commit("python/sglang/srt/mem_cache/radix_cache.py", "v2\n", "cache")
    commit("python/sglang/srt/other.py", "x\n", "elsewhere")
    four = commit("python/sglang/srt/mem_cache/radix_cache.py", "v4\n", "cache again")
    trees = range_trees("sglang", git_dir, f"{first}..{four}", "python/sglang/srt/mem_cache", tmp_path / "trees")
    assert [sha for sha, _ in trees] == [two, four]
    assert [(t / "sglang/srt/mem_cache/radix_cache.py").read_text() for _, t in trees] == ["v2\n", "v4\n"]
