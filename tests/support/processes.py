"""psutil questions about a process that may vanish between two calls (exits and is reaped, or its
pid is reused by a short-lived process): each answers None once it is gone, instead of raising."""
from __future__ import annotations

import psutil


def status(pid: int) -> str | None:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return None


def parent(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.NoSuchProcess:
        return None


def runner_processes() -> list:
    """This process's live (not zombie) runner descendants: what a close must leave none of (R1)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "serve.runner" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out
