"""The fixing commits of the vLLM and SGLang findings (issue 49): the source trees that confirm them.

Both repositories are over the fetch limit here, so no commit can be checked out. A fix is named from
public records (docs/peers.md gives the sources) and confirmed on released code instead: the release
before the fix with only the file at fault taken from the release after it ("swap"), and the release
after the fix with only the fix's own change taken back out ("revert", an exact substitution written
here; targets/onefix.py refuses text it does not find exactly once). Each tree then replays the
saved findings with the engine's own `--replay`.

  build(tree, release_dir, root)    root/<name>/<package>: the tree built from unpacked releases
  replay_command(engine, finding, src)   the ./dev command line that replays one finding on one source
  verdict(engine, output)           'reproduces' | 'does not reproduce' | 'does not load' from its output

`python -m targets.fixcommits [--engine vllm|sglang] [--root /tmp/fixcommits] [--run]
[--vllm-releases DIR] [--sglang-releases DIR]` builds every tree (from DIR/X.Y.Z, else from releases
unpacked by the engines' own helpers: `./dev check-vllm release X`, sglang's release_dir) and prints
each replay command with the outcome expected; `--run` runs them (the engines' interpreters from
VLLM_PYTHON / SGLANG_PYTHON, as for the replays themselves) and prints expected against observed;
exit status 1 when an observed outcome differs from the expected one.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from targets import onefix

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = {"vllm": "vllm", "sglang": "sglang"}
FINDINGS = {"vllm": ROOT / "targets" / "vllm" / "findings", "sglang": ROOT / "targets" / "sglang" / "findings"}
# how each SGLang finding replays (its cache and page size); vLLM's programs carry their layout
SGLANG_FLAGS = {"A2-req-eagle-page2": ["--cache", "req", "--eagle", "--page-size", "2"],
                "A2-swa-eagle-page2": ["--cache", "swa", "--eagle", "--page-size", "2"],
                "A2-swa-eagle-page1": ["--cache", "swa", "--eagle", "--page-size", "1"]}

COORD = "v1/core/kv_cache_coordinator.py"
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
    Tree("vllm-0.26.0-without-46384-gate", "vllm", "0.26.0",
         edits=[(COORD, "                if drop_eagle_block and not isinstance(spec, MambaSpec):\n",
                 "                if drop_eagle_block:\n")],
         expect={"C1-mamba-eagle": "reproduces", "S1-hybrid-eagle": "reproduces",
                 "C1-hybrid-eagle": "does not reproduce"}),
    Tree("vllm-0.25.0-with-0.26.0-coordinator", "vllm", "0.25.0", swaps=[(COORD, "0.26.0")],
         expect={"C1-mamba-eagle": "does not load"}),
    # SGLang #13714: RadixCache.cache_finished_req frees the duplicates from cache_protected_len
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
    # SGLang 0.5.6 -> 0.5.7: SWARadixCache stops freeing the EAGLE page-size-1 tail twice
    Tree("sglang-0.5.6-with-0.5.7-swa", "sglang", "0.5.6", swaps=[(SWA, "0.5.7")],
         expect={"A2-swa-eagle-page1": "does not reproduce", "A2-swa-eagle-page2": "reproduces"}),
    Tree("sglang-0.5.7-with-0.5.6-swa", "sglang", "0.5.7", swaps=[(SWA, "0.5.6")],
         expect={"A2-swa-eagle-page1": "reproduces"}),
    # SGLang 0.5.7 -> 0.5.8: SWARadixCache._insert_helper frees a matched duplicate node whole
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


def _release_dir(engine: str, unpacked: str = ""):
    """release -> directory holding its package: unpacked/<release> when given, else the engine's own
    helper (a PyPI download, cached)."""
    if unpacked:
        return lambda v: Path(unpacked) / v
    if engine == "vllm":
        from targets.vllm.__main__ import release
        return release
    from targets.sglang.__main__ import release_dir
    return release_dir


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m targets.fixcommits")
    ap.add_argument("--engine", choices=("vllm", "sglang"), action="append")
    ap.add_argument("--root", default="/tmp/fixcommits")
    ap.add_argument("--vllm-releases", default="", help="a directory holding unpacked vLLM releases as X.Y.Z/vllm")
    ap.add_argument("--sglang-releases", default="", help="the same for SGLang (X.Y.Z/sglang)")
    ap.add_argument("--run", action="store_true", help="run each replay and compare with the expected outcome")
    a = ap.parse_args(argv)
    bad = 0
    for tree in [t for t in TREES if t.engine in (a.engine or ("vllm", "sglang"))]:
        unpacked = a.vllm_releases if tree.engine == "vllm" else a.sglang_releases
        dst = build(tree, _release_dir(tree.engine, unpacked), Path(a.root))
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
