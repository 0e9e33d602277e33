"""Executable model of the scheduler and the runner client (REFERENCE.md rules F1, F2, R1).

Plain Python: nothing here imports mlx or impl. Reviewers should be able to check every
function by reading it; serve/scheduler.py and serve/client.py call or mirror these and the tests
check that they agree.

Invariants stated here
- F1  ``fit_available``: while other models are loaded, the memory a new load may use is
      bounded by the system's free memory as well as the device figure, on shared-memory
      devices (Apple silicon; on Linux CPU system memory *is* device memory). A first load,
      with nothing else loaded, uses the device figure alone.
- F2  ``fit_decision``: a load that does not fit evicts the least recently used *idle* model
      and the caller retries with fresh figures; it never starts a load that does not fit.
      A model that does not fit with nothing else loaded is refused. If every loaded model is
      busy the caller waits ("wait") for one to become idle - busy runners are never evicted.
      Memory that grows after load (KV caches, snapshots) is not covered by the check.
- R1  ``client_transition``: a runner client goes new -> loading -> loaded; ``close`` from any
      state ends in ``closed`` and only once the runner process has been reaped; ``load`` after
      close is refused. The start of a load and the recording of its process happen under the
      client's lock, so a close either sees the process (and kills and reaps it) or makes the
      load refuse.

Each rule is a named function with a docstring citing its id. The pure functions carry PEP 316
contracts (``pre:`` / ``post:``) for CrossHair: ``crosshair check spec/scheduler.py``.
"""
from __future__ import annotations

from typing import List, Tuple, Union

# ---------------------------------------------------------------------------------------- F1


def fit_available(device_free: int, system_free: int, others_loaded: int,
                  shared_memory: bool = True) -> int:
    """F1: bytes a new load may use.

    With nothing else loaded the device figure alone decides. With other models loaded on a
    shared-memory device, the system's free memory bounds it too (it sees memory held by
    other applications, which the device figure does not).

    pre: device_free >= 0
    pre: system_free >= 0
    pre: others_loaded >= 0
    post: __return__ <= device_free
    post: others_loaded == 0 or not shared_memory or __return__ <= system_free
    post: others_loaded > 0 or __return__ == device_free
    """
    if others_loaded > 0 and shared_memory:
        return min(device_free, system_free)
    return device_free


def fits(required: int, available: int) -> bool:
    """F1/F2: a load fits when its required bytes do not exceed the available figure.

    pre: required >= 0
    post: __return__ == (required <= available)
    """
    return required <= available


def overcommits(required: int, device_free: int, system_free: int, others_loaded: int,
                shared_memory: bool = True) -> bool:
    """F1 oracle used by tests: starting this load would exceed a bound that F1 says applies.

    pre: required >= 0
    post: __return__ == (not fits(required, fit_available(device_free, system_free, others_loaded, shared_memory)))
    """
    if required > device_free:
        return True
    return others_loaded > 0 and shared_memory and required > system_free


# ---------------------------------------------------------------------------------------- F2

Loaded = Tuple[str, bool, float]          # (name, idle, last_used)
Decision = Union[str, Tuple[str, str]]    # "load" | ("evict", name) | "wait" | "refuse"


def lru_idle(loaded: List[Loaded]) -> Union[str, None]:
    """F2: the least recently used idle model (ties broken by name), or None if none is idle.

    post: __return__ is None or any(n == __return__ and idle for (n, idle, _t) in loaded)
    post: __return__ is not None or not any(idle for (_n, idle, _t) in loaded)
    """
    idle = [(t, n) for (n, i, t) in loaded if i]
    if not idle:
        return None
    return min(idle)[1]


def fit_decision(required: int, device_free: int, system_free: int,
                 loaded: List[Loaded], shared_memory: bool = True,
                 alone_free: Union[int, None] = None) -> Decision:
    """F2: what the scheduler does for a load that needs ``required`` bytes.

    - "load" when it fits under F1's bound;
    - ("evict", name) of the least recently used idle model when it does not: the caller
      closes that runner (R1: waits for the reap) and asks again with fresh figures;
    - "wait" when nothing idle can be evicted but something loaded is busy;
    - "refuse" when it cannot fit alone: nothing is loaded and it still does not fit, or
      ``alone_free`` (the device figure as if nothing were loaded, when the caller knows it)
      is already too small - then nothing is evicted for a load that could never start.

    pre: required >= 0
    pre: device_free >= 0
    pre: system_free >= 0
    post: (__return__ == "load") == fits(required, fit_available(device_free, system_free, len(loaded), shared_memory))
    post: __return__ != "refuse" or len(loaded) == 0 or (alone_free is not None and required > alone_free)
    post: not isinstance(__return__, tuple) or __return__ == ("evict", lru_idle(loaded))
    """
    if fits(required, fit_available(device_free, system_free, len(loaded), shared_memory)):
        return "load"
    if alone_free is not None and not fits(required, alone_free):
        return "refuse"
    victim = lru_idle(loaded)
    if victim is not None:
        return ("evict", victim)
    if loaded:
        return "wait"
    return "refuse"


# ---------------------------------------------------------------------------------------- R1

NEW, LOADING, LOADED, CLOSED = "new", "loading", "loaded", "closed"
STATES = (NEW, LOADING, LOADED, CLOSED)
EVENTS = ("load", "ready", "died", "close")


class IllegalTransition(Exception):
    """A runner-client event that R1 forbids in the current state."""


def client_transition(state: str, event: str, process_reaped: bool = True) -> str:
    """R1: the runner client's life cycle.

    - load:  new -> loading (the process is started and recorded under the client's lock);
             refused once closed, and refused while a process already exists.
    - ready: loading -> loaded.
    - died:  the runner exited on its own; the client stays in its state until close (a
             request then reports a clear error), except closed stays closed.
    - close: any state -> closed, but only once the process has been reaped
             (``process_reaped``); close returning with the process alive is illegal.

    raises: IllegalTransition
    post: __return__ in STATES
    post: event != "close" or __return__ == CLOSED
    post: state != CLOSED or __return__ == CLOSED
    """
    if state not in STATES or event not in EVENTS:
        raise IllegalTransition(f"unknown state/event {state!r}/{event!r}")
    if event == "close":
        if not process_reaped:
            raise IllegalTransition("R1: close must not return before the runner process is reaped")
        return CLOSED
    if state == CLOSED:
        if event == "load":
            raise IllegalTransition("R1: load after close is refused")
        return CLOSED
    if event == "load":
        if state != NEW:
            raise IllegalTransition(f"R1: load from {state!r}: a client starts one process at most")
        return LOADING
    if event == "ready":
        if state != LOADING:
            raise IllegalTransition(f"ready from {state!r}")
        return LOADED
    return state  # died: reported on the next request, cleaned up by close


def no_orphan_after_close(closed: bool, process_alive: bool) -> bool:
    """R1 predicate: once close has returned, no runner process of this client is alive.

    post: __return__ == (not closed or not process_alive)
    """
    return not closed or not process_alive
