"""Platform setup (docs/platform.md): the one place that knows how MLX's CPU backend is made fast.

MLX's CPU wheel links the reference BLAS; Debian's OpenBLAS, preloaded, makes matmuls about 10x
faster. A preload only takes effect when a process starts, so:
- ``preload_env(env)`` is the environment a child process (a runner) is started with;
- ``reexec_with_openblas(module, guard)`` re-executes an entry point (``python -m module``) once
  with the preload, when the library exists and is not loaded yet.
Without the library (or off Linux) both leave the preload alone and everything still works, slower.
``./dev`` reads ``OPENBLAS`` from this file, so the path is written once.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"


def openblas_available() -> bool:
    return sys.platform.startswith("linux") and os.path.exists(OPENBLAS)


def preloaded(env: Mapping[str, str]) -> bool:
    return OPENBLAS in env.get("LD_PRELOAD", "").split(":")


def preload_env(env: Mapping[str, str]) -> dict:
    """``env`` with OpenBLAS first in LD_PRELOAD (when available) and OPENBLAS_NUM_THREADS
    defaulting to 1 (callers run one process per core)."""
    out = dict(env)
    if openblas_available() and not preloaded(out):
        pre = out.get("LD_PRELOAD", "")
        out["LD_PRELOAD"] = OPENBLAS + (":" + pre if pre else "")
    out.setdefault("OPENBLAS_NUM_THREADS", "1")
    return out


def reexec_with_openblas(module: str, guard: str) -> None:
    """Re-execute ``python -m module`` with the current arguments and the preload, once: the
    environment variable ``guard`` marks the re-executed process. Returns when there is nothing to do."""
    if not openblas_available() or preloaded(os.environ) or os.environ.get(guard):
        return
    env = preload_env(os.environ)
    env[guard] = "1"
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], env)
