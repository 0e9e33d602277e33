"""The fixing commits of the vLLM and SGLang findings (issue 49): the source trees that confirm them.

vLLM's and SGLang's own repositories are over the fetch limit here. A fix is named from public records
(docs/peers.md gives the sources) and confirmed on released code: the release before the fix with only
the file at fault taken from the release after it ("swap"), and the release after the fix with only the
fix's own change taken back out ("revert", an exact substitution written here; targets/onefix.py
refuses text it does not find exactly once). Where a git directory holding the engine's history is
given (a fork's snapshot that carries upstream's main with upstream's commit ids -- SGLang: modal-labs/
sglang, up to 2026-03-26; vLLM: jsboige/vllm, up to 2026-08-14, or RhizoNymph/vllm, up to 2026-07-24),
a tree's base may also be a commit id: the package as it was at that commit (`git archive`), so the fix
commit and its parent are replayed themselves. Each tree then replays the saved findings with the
engine's own `--replay`.

  build(tree, release_dir, root)    root/<name>/<package>: the tree built from unpacked releases or commits
  commit_dir(engine, git_dir, sha, root)   root/_commits/<sha>/<package>: the package at one commit
                                    (targets/commits.py)
  replay_command(engine, finding, src)   the ./dev command line that replays one finding on one source
  verdict(engine, output)           'reproduces' | 'does not reproduce' | 'does not load' from its output

`python -m targets.fixcommits [--engine vllm|sglang] [--root /tmp/fixcommits] [--run]
[--vllm-releases DIR] [--sglang-releases DIR] [--vllm-git GITDIR] [--sglang-git GITDIR]` builds every
tree (from DIR/X.Y.Z, else from releases unpacked by the engines' own helpers: `./dev check-vllm
release X`, sglang's release_dir; an engine's commit trees from its GITDIR, skipped with the reason
when it is not given) and prints each replay command with the outcome expected; `--run` runs them (the
engines' interpreters from VLLM_PYTHON / SGLANG_PYTHON, as for the replays themselves) and prints
expected against observed; exit status 1 when an observed outcome differs from the expected one.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from targets import onefix
from targets.commits import COMMIT, PACKAGE, commit_dir

ROOT = Path(__file__).resolve().parents[1]
FINDINGS = {"vllm": ROOT / "targets" / "vllm" / "findings", "sglang": ROOT / "targets" / "sglang" / "findings"}
# how each SGLang finding replays (its cache and page size); vLLM's programs carry their layout
SGLANG_FLAGS = {"A2-req-eagle-page2": ["--cache", "req", "--eagle", "--page-size", "2"],
                "A2-swa-eagle-page2": ["--cache", "swa", "--eagle", "--page-size", "2"],
                "A2-swa-eagle-page1": ["--cache", "swa", "--eagle", "--page-size", "1"]}


COORD = "v1/core/kv_cache_coordinator.py"
# vLLM #46384's gate taken back out: the Mamba group gets the EAGLE margin again
GATE_OUT = (COORD, "                if drop_eagle_block and not isinstance(spec, MambaSpec):\n",
            "                if drop_eagle_block:\n")
RADIX, SWA = "srt/mem_cache/radix_cache.py", "srt/mem_cache/swa_radix_cache.py"


@dataclass
class Tree:
    name: str
    engine: str
    base: str                                        # the release the tree starts from
    swaps: list = field(default_factory=list)        # [(file under the package, release to take it from)]
    edits: list = field(default_factory=list)        # [(file under the package, old text, new text)]
    expect: dict = field(default_factory=dict)       # {finding stem: expected verdict}


TREES = [
    # vLLM #46384 (481e481be786): the hybrid coordinator gives Mamba groups no EAGLE margin
    Tree("vllm-0.26.0-without-46384-gate", "vllm", "0.26.0", edits=[GATE_OUT],
         expect={"C1-mamba-eagle": "reproduces", "S1-hybrid-eagle": "reproduces",
                 "C1-hybrid-eagle": "does not reproduce"}),
    Tree("vllm-0.25.0-with-0.26.0-coordinator", "vllm", "0.25.0", swaps=[(COORD, "0.26.0")],
         expect={"C1-mamba-eagle": "does not load"}),
    # vLLM commit trees (--vllm-git): #46384's commit and its parent on main
    Tree("vllm-8e981630c-before-46384", "vllm", "8e981630c9336233ca9de91452f68918bddbc4e2",
         expect={"C1-mamba-eagle": "reproduces", "S1-hybrid-eagle": "reproduces", "C1-hybrid-eagle": "reproduces"}),
    Tree("vllm-481e481be-46384", "vllm", "481e481be786c1ca3229e26aa34c15ffd22375af",
         expect={"C1-mamba-eagle": "does not reproduce", "S1-hybrid-eagle": "does not reproduce",
                 "C1-hybrid-eagle": "does not reproduce"}),
    # the rest of #46384 alone stops C1-hybrid-eagle; the gate stops the other two
    Tree("vllm-481e481be-46384-without-gate", "vllm", "481e481be786c1ca3229e26aa34c15ffd22375af", edits=[GATE_OUT],
         expect={"C1-mamba-eagle": "reproduces", "S1-hybrid-eagle": "reproduces",
                 "C1-hybrid-eagle": "does not reproduce"}),
    # SGLang #13714 (ac4382263451): RadixCache.cache_finished_req frees the duplicates from cache_protected_len
    Tree("sglang-0.5.6-without-protected-len-free", "sglang", "0.5.6",
         edits=[(RADIX, """        # Radix Cache takes one ref in memory pool
        if is_insert:
            priority = getattr(req, "priority", 0) or 0
            new_prefix_len = self.insert(radix_key, values, priority=priority)
            # Free the duplicates that were already in the tree
            self.token_to_kv_pool_allocator.free(
                kv_indices[req.cache_protected_len : new_prefix_len]
""", """        start = len(req.prefix_indices)
        if self.is_eagle and start > req.cache_protected_len:
            start -= 1
        # Radix Cache takes one ref in memory pool
        if is_insert:
            priority = getattr(req, "priority", 0) or 0
            new_prefix_len = self.insert(radix_key, values, priority=priority)
            # Free the duplicates that were already in the tree
            self.token_to_kv_pool_allocator.free(
                kv_indices[start:new_prefix_len]
""")], expect={"A2-req-eagle-page2": "reproduces"}),
    Tree("sglang-0.5.5.post3-with-0.5.6-radix", "sglang", "0.5.5.post3", swaps=[(RADIX, "0.5.6")],
         expect={"A2-req-eagle-page2": "does not load"}),
    # SGLang 0.5.6 -> 0.5.7 (#15207, 160a06cab23f): SWARadixCache stops freeing the EAGLE page-size-1 tail twice
    Tree("sglang-0.5.6-with-0.5.7-swa", "sglang", "0.5.6", swaps=[(SWA, "0.5.7")],
         expect={"A2-swa-eagle-page1": "does not reproduce", "A2-swa-eagle-page2": "reproduces"}),
    Tree("sglang-0.5.7-with-0.5.6-swa", "sglang", "0.5.7", swaps=[(SWA, "0.5.6")],
         expect={"A2-swa-eagle-page1": "reproduces"}),
    # SGLang 0.5.7 -> 0.5.8 (#17220, ce8a6ac69086): SWARadixCache._insert_helper frees a matched duplicate node
    # whole; the page-2 leak stops only with #17417 (a618202fc7d3) as well, trees below
    Tree("sglang-0.5.8-without-whole-node-free", "sglang", "0.5.8",
         edits=[(SWA, "                    self.token_to_kv_pool_allocator.free(value[:prefix_len])\n\n"
                      "            total_prefix_length += prefix_len\n",
                 "                    self.token_to_kv_pool_allocator.free(\n"
                 "                        value[max(0, update_kv_after_len - total_prefix_length) : prefix_len]\n"
                 "                    )\n\n"
                 "            total_prefix_length += prefix_len\n")],
         expect={"A2-swa-eagle-page2": "reproduces"}),
    Tree("sglang-0.5.7-with-0.5.8-swa", "sglang", "0.5.7", swaps=[(SWA, "0.5.8")],
         expect={"A2-swa-eagle-page2": "does not load"}),
    # SGLang commit trees (--sglang-git): each fix commit and its parent on main
    Tree("sglang-a92afb00c-before-13714", "sglang", "a92afb00c67588e23fab6d40d5eb1da216169eb2",
         expect={"A2-req-eagle-page2": "reproduces"}),
    Tree("sglang-ac4382263-13714", "sglang", "ac4382263451a9e3111fc9cba928fd34e0601d74",
         expect={"A2-req-eagle-page2": "does not reproduce"}),
    # #15207 adds `if not self.is_eagle:` before the tail free (the page-size-1 double free stops) and so
    # leaves the EAGLE tail unfreed for page sizes > 1, until #17417 frees it again
    Tree("sglang-a0985dd5e-before-15207", "sglang", "a0985dd5e51296e64f13f030e664f75a89afc182",
         expect={"A2-swa-eagle-page1": "reproduces"}),
    Tree("sglang-160a06cab-15207", "sglang", "160a06cab23ffedf3069df2721cc976ec6df63f4",
         expect={"A2-swa-eagle-page1": "does not reproduce", "A2-swa-eagle-page2": "reproduces"}),
    # #17220 frees a matched duplicate node whole in _insert_helper; the unfreed EAGLE tail still leaks
    Tree("sglang-ce8a6ac69-17220", "sglang", "ce8a6ac69086df099c1331e0ed0f059f99940318",
         expect={"A2-swa-eagle-page2": "reproduces"}),
    Tree("sglang-ce8a6ac69-17220-with-17417-tail-free", "sglang", "ce8a6ac69086df099c1331e0ed0f059f99940318",
         edits=[(SWA, "            page_aligned_kv_indices = kv_indices.to(dtype=torch.int64, copy=True)\n"
                      "            if self.is_eagle:\n"
                      "                self.token_to_kv_pool_allocator.free(kv_indices[page_aligned_len:])\n",
                 "            page_aligned_kv_indices = kv_indices.to(dtype=torch.int64, copy=True)\n"),
                (SWA, "        if not self.is_eagle:\n"
                      "            self.token_to_kv_pool_allocator.free(kv_indices[page_aligned_len:])\n",
                 "        self.token_to_kv_pool_allocator.free(kv_indices[page_aligned_len:])\n")],
         expect={"A2-swa-eagle-page2": "does not reproduce"}),
    Tree("sglang-7520b9292-before-17417", "sglang", "7520b92927a503d83bae9c91eb6a17caf88a628f",
         expect={"A2-swa-eagle-page2": "reproduces"}),
    Tree("sglang-a618202fc-17417", "sglang", "a618202fc7d35cde0704cbc4ca9c50a9d64aa98b",
         expect={"A2-swa-eagle-page2": "does not reproduce"}),
]


def build(tree: Tree, release_dir, root: Path) -> Path:
    """root/<tree.name>/<package>: release `tree.base` with its swaps and edits; release_dir(v) gives the
    directory holding release v's unpacked package."""
    pkg = PACKAGE[tree.engine]
    dst = onefix.build(Path(release_dir(tree.base)), pkg, Path(root) / tree.name, tree.edits)
    for rel, version in tree.swaps:
        src = Path(release_dir(version)) / pkg / rel
        if not src.exists():
            raise FileNotFoundError(f"{tree.name}: release {version} has no {pkg}/{rel}")
        shutil.copyfile(src, dst / pkg / rel)
    return dst


def replay_command(engine: str, finding: str, src: Path) -> list:
    prog = str(FINDINGS[engine] / f"{finding}.json")
    if engine == "vllm":
        return [str(ROOT / "dev"), "check-vllm", "replay", "--src", str(src), prog]
    return [str(ROOT / "dev"), "check-sglang", "--replay", prog, *SGLANG_FLAGS[finding], "--srcs", str(src)]


def verdict(engine: str, output: str) -> str:
    """The replay's verdict on its one source, from its printed lines."""
    for line in output.splitlines():
        if "could not run" in line or "could not load" in line:
            return "does not load"
        if line.rstrip().endswith("does not reproduce") or ": does not reproduce (" in line:
            return "does not reproduce"
        if line.rstrip().endswith(": reproduces") or ": reproduces (" in line:
            return "reproduces"
    return "no verdict"


def _release_dir(engine: str, unpacked: str = "", git_dir: str = "", root: Path = Path("/tmp/fixcommits")):
    """release or commit id -> directory holding its package: a commit from git_dir (commit_dir);
    a release from unpacked/<release> when given, else from the engine's own helper (a PyPI download,
    cached)."""
    if unpacked:
        rel = lambda v: Path(unpacked) / v                                  # noqa: E731
    elif engine == "vllm":
        from targets.vllm.__main__ import release as rel
    else:
        from targets.sglang.__main__ import release_dir as rel
    return lambda v: commit_dir(engine, git_dir, v, root) if COMMIT.fullmatch(v) else rel(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m targets.fixcommits")
    ap.add_argument("--engine", choices=("vllm", "sglang"), action="append")
    ap.add_argument("--root", default="/tmp/fixcommits")
    ap.add_argument("--vllm-releases", default="", help="a directory holding unpacked vLLM releases as X.Y.Z/vllm")
    ap.add_argument("--sglang-releases", default="", help="the same for SGLang (X.Y.Z/sglang)")
    ap.add_argument("--vllm-git", default="", help="a git directory with vLLM's history (`fetch` of "
                    "jsboige/vllm or RhizoNymph/vllm) for the commit trees; without it they are skipped")
    ap.add_argument("--sglang-git", default="", help="the same for SGLang (`fetch` of modal-labs/sglang)")
    ap.add_argument("--run", action="store_true", help="run each replay and compare with the expected outcome")
    a = ap.parse_args(argv)
    bad = 0
    for tree in [t for t in TREES if t.engine in (a.engine or ("vllm", "sglang"))]:
        unpacked = a.vllm_releases if tree.engine == "vllm" else a.sglang_releases
        git_dir = a.vllm_git if tree.engine == "vllm" else a.sglang_git
        if COMMIT.fullmatch(tree.base) and not git_dir:
            print(f"{tree.name}: skipped (a commit tree: needs --{tree.engine}-git)", flush=True)
            continue
        dst = build(tree, _release_dir(tree.engine, unpacked, git_dir, Path(a.root)), Path(a.root))
        for finding, want in tree.expect.items():
            cmd = replay_command(tree.engine, finding, dst)
            line = f"{tree.name}: {finding}: expected {want}"
            if a.run:
                r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
                got = verdict(tree.engine, r.stdout + r.stderr)
                bad += got != want
                line += f"; observed {got}" + ("" if got == want else "  <-- differs")
            print(line + "\n  " + " ".join(cmd), flush=True)
    return int(bool(bad))


if __name__ == "__main__":
    sys.exit(main())
