"""An exception raised inside SGLang's own code is a finding (PANIC), one raised in ours is a bug of ours.

`Guarded(target)` wraps any targets.sglang target: every program operation (begin, prefill, step,
close, set_budget) runs inside `classify`. The traceback is walked from the innermost frame outward,
skipping frames of other libraries (torch, the standard library): the first frame that is SGLang's
(a file of the loaded `sglang` package, or of the CI fixtures targets/sglang/fixture*.py, which play
SGLang's part) makes the exception an `SglangCrash` -- a targets.ollama.target.TargetPanic, so the rule
machines report it as rule PANIC, `minimize` shrinks it and replay reproduces it; the first frame that is
ours (any other file of this repository) re-raises the exception unchanged: a driver bug fails loudly.
`reset` is not guarded (a cache that cannot be built is a setup failure, never a finding).

Invariants: the crash's `where` is (file relative to SGLang's package root, line, function) of that
frame; `signature` = (exception type, file, function) is what a shrunk program must keep reproducing.
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

from targets.ollama.target import TargetPanic

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OPS = ("begin", "prefill", "step", "close", "set_budget")


class SglangCrash(TargetPanic):
    def __init__(self, exc: BaseException, where: tuple):
        self.exc, self.where = exc, where
        file, line, func = where
        text = str(exc).splitlines()[0] if str(exc) else ""
        super().__init__(f"{type(exc).__name__} in {func} ({file}:{line})" + (f": {text[:200]}" if text else ""))

    @property
    def signature(self) -> tuple:
        return type(self.exc).__name__, self.where[0], self.where[2]


def _sglang_roots() -> list:
    m = sys.modules.get("sglang")
    return [Path(p).resolve() for p in getattr(m, "__path__", [])] if m is not None else []


def owner(filename: str) -> tuple:
    """("sglang", path shown) | ("ours", path) | ("other", path) for a frame's file."""
    p = Path(filename).resolve()
    for root in _sglang_roots():
        if p.is_relative_to(root):
            return "sglang", str(Path("sglang") / p.relative_to(root))
    if p.parent == HERE and p.name.startswith("fixture"):
        return "sglang", str(p.relative_to(REPO))           # the CI fixtures stand for SGLang
    if p.is_relative_to(REPO) and ".venv" not in p.parts:
        return "ours", str(p.relative_to(REPO))
    return "other", str(p)


def classify(exc: BaseException):
    """An SglangCrash for `exc` when its innermost own-or-SGLang frame is SGLang's, else None. An
    AttributeError on one of our objects (a pool or request of ours lacking what SGLang reads) is
    ours wherever it is raised."""
    obj = getattr(exc, "obj", None) if isinstance(exc, AttributeError) else None
    if obj is not None and owner(getattr(sys.modules.get(type(obj).__module__), "__file__", None) or "-")[0] == "ours":
        return None
    for fs in reversed(traceback.extract_tb(exc.__traceback__)):
        who, shown = owner(fs.filename)
        if who == "sglang":
            return SglangCrash(exc, (shown, fs.lineno, fs.name))
        if who == "ours":
            return None
    return None


class Guarded:
    """A target whose operations turn SGLang's exceptions into SglangCrash (see the module docstring)."""

    def __init__(self, target):
        object.__setattr__(self, "inner", target)

    def __getattr__(self, item):
        attr = getattr(self.inner, item)
        if item not in OPS:
            return attr

        def op(*a, **kw):
            try:
                return attr(*a, **kw)
            except TargetPanic:
                raise
            except Exception as e:                  # noqa: BLE001 -- sorted by the traceback, ours re-raised
                crash = classify(e)
                if crash is None:
                    raise
                raise crash from e
        return op

    def __setattr__(self, item, value):
        setattr(self.inner, item, value)


def guard(target):
    return target if isinstance(target, Guarded) else Guarded(target)
