"""Platform setup (docs/platform.md): the one place that knows how MLX's CPU backend is made fast.

MLX's CPU wheel links the reference BLAS; Debian's OpenBLAS, preloaded, makes matmuls about 10x
faster. Its worker threads, by default, busy-wait for about 2^28 cycles (~0.1 s) after each
parallel call; on a 2-core machine that spinning takes the core MLX's own stream thread needs for
the small ops between matmuls (cache copies: 2-4x slower), so ``OPENBLAS_THREAD_TIMEOUT`` (2^n cycles,
n >= 4) is set to its minimum: the workers sleep at once (docs/platform.md, "OpenBLAS's spinning
workers"). A preload and this setting only take effect when a process starts, so:
- ``preload_env(env)`` is the environment a child process (a runner) is started with;
- ``reexec_with_openblas(module, guard)`` re-executes an entry point (``python -m module``) once
  with the preload, when the library exists and is not loaded yet.
Without the library (or off Linux) both leave the preload alone and everything still works, slower.
``./dev`` reads ``OPENBLAS`` from this file, so the path is written once.

glibc's malloc defers coalescing small freed blocks (its "fastbins") to the next request of 1 KiB or
more, whoever makes it. A forward frees thousands of MLX graph nodes at its end; the first large
allocation after it paid about 1 ms for them on SmolLM2, and that was often a prefix-cache list
growing by a few keys, so the forward's cost was counted as bookkeeping. ``settle_allocator()``, called
where a forward ends, pays that deferred work there (the next forward paid it otherwise: the total is
unchanged); docs/engine.md, "The allocator's deferred frees".

``OPENBLAS_CORETYPE`` is a request, not a fact: OpenBLAS 0.3.21 (Debian's) does not know the name
``Cooperlake`` (it prints "Core not found" and takes the first set the CPU's instructions allow, which
need not be the set it picks unasked), so a cell is named by ``openblas_core()``, the kernel set the
loaded library runs, and ``coretype_mismatch(env)`` says when the two differ (docs/platform.md,
"Which kernels run"). Debian's 0.3.21 runs a set it is asked for without checking the CPU: on an
AVX2-only CPU ``OPENBLAS_CORETYPE=SkylakeX`` is in force and the first matmul stops the process with
an illegal instruction (SIGILL). ``kernels_unsupported()`` says so from the CPU's flags, and every
entry point stops with that message first (``reexec_with_openblas``, ``apply_device_env``).

``PREFIX_TRIE_DEVICE=cpu|gpu`` picks MLX's default device for the suite, the fuzz campaign and runner
processes (``apply_device_env()``): a GPU machine's CPU backend is a cell of docs/platform.md's matrix.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Mapping

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
OPENBLAS_THREAD_TIMEOUT = "4"


def _glibc():
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return None
    except (AttributeError, ValueError, OSError):
        return None
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    return libc


_LIBC = _glibc()
_LARGE = 1040      # bytes: a chunk past the per-thread cache (1032) and in the large bins (>= 1024)


def settle_allocator() -> None:
    """Make glibc coalesce the small blocks freed so far now (one large allocation, freed at once);
    nothing elsewhere."""
    if _LIBC is not None:
        _LIBC.free(_LIBC.malloc(_LARGE))


def apply_device_env() -> None:
    """Make ``$PREFIX_TRIE_DEVICE`` (cpu or gpu) MLX's default device; unset: MLX's own default. Stops
    first where the OpenBLAS kernels in force need instructions this CPU lacks."""
    require_supported_kernels()
    name = os.environ.get("PREFIX_TRIE_DEVICE", "").strip().lower()
    if not name:
        return
    if name not in ("cpu", "gpu"):
        raise SystemExit(f"PREFIX_TRIE_DEVICE must be cpu or gpu, not {name!r}")
    import mlx.core as mx
    mx.set_default_device(mx.cpu if name == "cpu" else mx.gpu)


def cpu_only_allocator() -> bool:
    """True where MLX's build has no GPU backend: its CPU allocator counts active bytes exactly and
    keeps freed buffers in its pool. A CUDA or Metal build serves CPU-device arrays from its own
    allocator, which rounds small blocks up (a 16,384 B buffer counted 24,832 B on an H200) and may
    return freed buffers at once, whatever the default device is."""
    import mlx.core as mx
    return not (mx.metal.is_available() or mx.cuda.is_available())


def openblas_available() -> bool:
    return sys.platform.startswith("linux") and os.path.exists(OPENBLAS)


def preloaded(env: Mapping[str, str]) -> bool:
    return OPENBLAS in env.get("LD_PRELOAD", "").split(":")


def platform_env(env: Mapping[str, str]) -> dict:
    """``env`` with OpenBLAS first in LD_PRELOAD (when available) and OPENBLAS_THREAD_TIMEOUT
    defaulting to OPENBLAS_THREAD_TIMEOUT (a value the caller set is kept)."""
    out = dict(env)
    if openblas_available() and not preloaded(out):
        pre = out.get("LD_PRELOAD", "")
        out["LD_PRELOAD"] = OPENBLAS + (":" + pre if pre else "")
    out.setdefault("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_THREAD_TIMEOUT)
    return out


def command(module: str) -> str:
    """The shell command that runs ``python -m module`` from the project's root with these settings
    (as reports record it)."""
    return f"LD_PRELOAD={OPENBLAS} OPENBLAS_THREAD_TIMEOUT={OPENBLAS_THREAD_TIMEOUT} .venv/bin/python -m {module}"


def preload_env(env: Mapping[str, str]) -> dict:
    """``platform_env(env)`` with OPENBLAS_NUM_THREADS defaulting to 1 (callers run one process per
    core)."""
    out = platform_env(env)
    out.setdefault("OPENBLAS_NUM_THREADS", "1")
    return out


def reexec_with_openblas(module: str, guard: str, one_thread: bool = True) -> None:
    """Re-execute ``python -m module`` with the current arguments and the platform settings
    (``preload_env``; ``platform_env`` with ``one_thread=False``: OpenBLAS keeps its default threads),
    once: the environment variable ``guard`` marks the re-executed process. Returns when there is
    nothing to do (no OpenBLAS, or already preloaded: whoever preloaded it chose the settings)."""
    if not openblas_available() or preloaded(os.environ) or os.environ.get(guard):
        require_supported_kernels()
        return
    env = preload_env(os.environ) if one_thread else platform_env(os.environ)
    env[guard] = "1"
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], env)


def openblas_core() -> str | None:
    """The kernel set the OpenBLAS loaded in this process runs (``openblas_get_corename``), or None when
    none is loaded into its global symbols (no preload: MLX's reference BLAS)."""
    try:
        get = ctypes.CDLL(None).openblas_get_corename
    except (AttributeError, OSError, TypeError):    # no such symbol; no dlopen(NULL) (Windows)
        return None
    get.restype, get.argtypes = ctypes.c_char_p, []
    name = get()
    return name.decode() if name else None


def describe_blas(core: str | None) -> str:
    """How reports name the CPU's BLAS, from ``openblas_core()``'s answer."""
    if core:
        return f"OpenBLAS {core} kernels"
    return "no OpenBLAS loaded (the BLAS MLX links: the reference BLAS on Linux, Accelerate on macOS)"


def coretype_mismatch(env: Mapping[str, str]) -> str | None:
    """What to tell a user whose ``OPENBLAS_CORETYPE`` the loaded OpenBLAS does not run; None when it
    does, when none is asked for or when no OpenBLAS is loaded."""
    asked, core = env.get("OPENBLAS_CORETYPE", "").strip(), openblas_core()
    if not asked or core is None or asked.lower() == core.lower():
        return None
    return (f"OPENBLAS_CORETYPE={asked} is not in force: the loaded OpenBLAS runs its {core} kernels "
            f"(docs/platform.md, \"Which kernels run\")")


# The instructions (Linux /proc/cpuinfo flag names) each of OpenBLAS's x86-64 kernel sets executes
# ("pni" is SSE3). A set not listed is not checked.
_AVX512 = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})
KERNEL_NEEDS = {
    "Prescott": frozenset({"pni"}), "Core2": frozenset({"ssse3"}), "Nehalem": frozenset({"sse4_2"}),
    "Sandybridge": frozenset({"avx"}), "Haswell": frozenset({"avx2", "fma"}), "Zen": frozenset({"avx2", "fma"}),
    "SkylakeX": _AVX512, "Cooperlake": _AVX512 | {"avx512_bf16"},
}


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset | None:
    """The first CPU's instruction flags, or None where they cannot be read (not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def kernels_unsupported(core: str | None = None, flags: frozenset | None = None,
                        env: Mapping[str, str] = os.environ) -> str | None:
    """What to tell a user whose loaded OpenBLAS runs kernels this CPU cannot execute (the first
    matmul would die with SIGILL); None when it can, or when the set or the flags are unknown."""
    core = openblas_core() if core is None else core
    flags = cpu_flags() if flags is None else flags
    need = KERNEL_NEEDS.get(core or "")
    if need is None or flags is None or need <= flags:
        return None
    runnable = ", ".join(k for k, v in KERNEL_NEEDS.items() if v <= flags) or "none known"
    asked = env.get("OPENBLAS_CORETYPE")
    running, fix = (f"{core} kernels (OPENBLAS_CORETYPE={asked})", "Unset OPENBLAS_CORETYPE or ask") if asked is not None \
        else (f"{core} kernels", "Ask")
    return (f"OpenBLAS runs its {running}, which need {', '.join(sorted(need - flags))}: this CPU lacks them, so "
            f"the first matmul would stop the process with an illegal instruction. {fix} for a set this CPU runs "
            f"({runnable}); docs/platform.md, \"Which kernels run\"")


def require_supported_kernels() -> None:
    """Stop with ``kernels_unsupported()``'s message, before any matmul, where it has one."""
    why = kernels_unsupported()
    if why:
        raise SystemExit(why)


def platform_line(env: Mapping[str, str] = os.environ) -> str:
    """One line naming what this process computes with: MLX's version and default device, the CPU's
    BLAS and, when one was asked for and is not in force, the kernel set asked for (the test session's
    header, `python -m fuzz.exactness`)."""
    import mlx.core as mx
    line = f"mlx {mx.__version__}, device {mx.default_device()}, {describe_blas(openblas_core())}"
    kernels = coretype_mismatch(env)
    return line + (f"; {kernels}" if kernels else "")
