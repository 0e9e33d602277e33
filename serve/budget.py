"""The prefix-cache budget of a runner: where its default comes from, and how it is overridden.

- Default: ``DEFAULT_FRACTION`` (25%) of the memory that is free (psutil ``available``) at the
  moment the runner has loaded its model's weights; so the weights are already counted out and
  a second model loaded later gets a quarter of what is then left.
- Override, first found wins: the ``--cache-budget`` flag (serve and runner; ``--budget-bytes``
  is its older spelling), then the ``PREFIX_CACHE_BUDGET`` environment variable. Both accept
  bytes (``1073741824``) or a size with a unit (``512MiB``, ``2GB``, ``1.5g``; powers of 1024 for
  ``Ki/Mi/Gi/Ti`` and for a bare ``K/M/G/T``, powers of 1000 for ``kB/MB/GB/TB``).
- A budget larger than the machine's total memory is refused (``BudgetError``): such a cache
  could never be held, and the old default (2**62 bytes) made /api/ps report 4.6e18.
"""
from __future__ import annotations

import os
import re
from typing import Optional, Union

ENV = "PREFIX_CACHE_BUDGET"
DEFAULT_FRACTION = 0.25

_UNITS = {"": 1, "b": 1,
          "k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10, "kb": 10 ** 3,
          "m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20, "mb": 10 ** 6,
          "g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30, "gb": 10 ** 9,
          "t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40, "tb": 10 ** 12}


class BudgetError(ValueError):
    """A budget that cannot be used: unparsable, negative, or more than the machine has."""


def parse_size(value: Union[str, int]) -> int:
    """Bytes from an int or a string such as '512MiB', '2GB', '1.5g', '1073741824'."""
    if isinstance(value, bool):
        raise BudgetError(f"cache budget {value!r} is not a size")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise BudgetError(f"cache budget {value!r} is not a size (examples: 1073741824, 512MiB, 2GB)")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n < 0:
        raise BudgetError(f"cache budget {value!r} is negative")
    return n


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def total_memory() -> int:
    import psutil
    return int(psutil.virtual_memory().total)


def available_memory() -> int:
    import psutil
    return int(psutil.virtual_memory().available)


def explicit_budget(flag: Optional[Union[str, int]] = None, env: Optional[dict] = None) -> Optional[tuple[int, str]]:
    """The overriding budget (flag, then environment) as (bytes, where it came from), or None."""
    if flag is not None:
        return parse_size(flag), "--cache-budget"
    raw = (os.environ if env is None else env).get(ENV)
    if raw not in (None, ""):
        return parse_size(raw), ENV
    return None


def check_fits(nbytes: int, source: str, total: Optional[int] = None) -> None:
    total = total_memory() if total is None else total
    if nbytes > total:
        raise BudgetError(f"cache budget {nbytes} bytes ({human(nbytes)}, from {source}) is more than this "
                          f"machine's total memory of {total} bytes ({human(total)}); refusing it")


def resolve(flag: Optional[Union[str, int]] = None, *, env: Optional[dict] = None,
            total: Optional[int] = None, available: Optional[int] = None) -> tuple[int, str]:
    """(budget bytes, a sentence saying how it was derived). Call once the weights are loaded."""
    total = total_memory() if total is None else total
    got = explicit_budget(flag, env)
    if got is not None:
        nbytes, source = got
        check_fits(nbytes, source, total)
        return nbytes, f"{human(nbytes)} from {source}"
    free = available_memory() if available is None else available
    nbytes = int(free * DEFAULT_FRACTION)
    return nbytes, (f"{DEFAULT_FRACTION:.0%} of the {human(free)} ({free} bytes) free when the model "
                    f"was loaded (override: --cache-budget or {ENV})")
