"""Scheduler: loads models on demand into runner processes, one model per runner (F1, F2, R1).

- Fit check (F1): the device figure is ``device_total() - memory reported by our runners``
  (on Linux CPU, psutil's total memory: system memory *is* the device memory); while other
  models are loaded the system's free memory (psutil ``available``) bounds it too, which sees
  memory held by other applications. A first load uses the device figure alone.
- A miss (F2) evicts the least recently used idle runner - closing it waits for its process to
  be reaped (R1) - and retries with fresh figures, instead of starting the load. A model that
  does not fit with nothing else loaded is refused (``ModelTooLarge``). If every loaded runner
  is busy, the load waits for one to become idle (bounded by ``wait_timeout``).
- Every decision is ``spec.scheduler.fit_decision`` applied to the figures of the moment; each
  is recorded in ``decisions`` so tests can check it against the spec.
- Requests to one runner are serialised; loads are serialised with each other.
- A runner that died is dropped (and reaped); the request that saw it fails with
  ``RunnerDied``, and the next request loads a fresh runner. A request that got no line from the
  runner before it died (it died idle, before its exit was seen) is run once more on a fresh runner.

Memory figures, the size estimate and the runner factory are injectable for tests (a runner
without a process: tests/support/in_process_runner.py).
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from serve.budget import available_memory, total_memory
from serve.client import ClientClosed, RunnerClient, RunnerDied, RunnerError
from spec.scheduler import fit_decision


class SchedulerError(Exception):
    status = 500


class UnknownModel(SchedulerError):
    status = 404


class NotLoaded(SchedulerError):
    status = 404


class ModelTooLarge(SchedulerError):
    status = 507


class SchedulerBusy(SchedulerError):
    status = 503


class SchedulerClosed(SchedulerError):
    status = 503


def runner_bytes(mem: dict) -> int:
    """Bytes a runner holds, from its /memory answer: weights + live caches + paged-out when the
    engine reports them, else the process RSS."""
    parts = [mem.get(k) for k in ("weights", "live_caches", "paged_out")]
    if any(isinstance(p, int) for p in parts):
        return sum(p for p in parts if isinstance(p, int))
    return int(mem.get("rss", 0) or 0)


def default_required_bytes(name: str) -> int:
    """Estimated bytes to load ``name`` (``impl.models.estimate_bytes``); 0 when it cannot be
    estimated here (the load is then checked with what the runner reports once loaded, learned
    for next time). An unknown name raises KeyError."""
    try:
        from impl.models import estimate_bytes
        return int(estimate_bytes(name))
    except KeyError:
        raise
    except Exception:
        return 0


def default_known_model(name: str) -> bool:
    """Whether ``name`` is one of ``impl.models.MODEL_NAMES``."""
    from impl.models import MODEL_NAMES
    return name in MODEL_NAMES


@dataclass
class Entry:
    name: str
    client: Any
    refs: int = 0                      # requests holding or queued on it: idle iff 0
    last_used: float = 0.0
    memory: int = 0                    # bytes the runner reported holding
    ready: threading.Event = field(default_factory=threading.Event)
    error: Optional[BaseException] = None
    dropped: bool = False
    req_lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Decision:
    name: str
    required: int
    device_free: int
    system_free: int
    loaded: list                       # [(name, idle, last_used)]
    shared_memory: bool
    outcome: Any
    at: float
    alone_free: Optional[int] = None


class Scheduler:
    def __init__(self, runner_factory: Optional[Callable[[str], Any]] = None, *,
                 engine: str = "real", runner_args=(), budget_bytes: Optional[int] = None,
                 device_total: Callable[[], int] = total_memory,
                 system_free: Callable[[], int] = available_memory,
                 required_bytes: Callable[[str], int] = default_required_bytes,
                 known_model: Optional[Callable[[str], bool]] = None,
                 shared_memory: bool = True, wait_timeout: float = 120.0,
                 load_timeout: float = 300.0, clock: Callable[[], float] = time.monotonic):
        if runner_factory is None:
            def runner_factory(name: str):
                return RunnerClient(name, engine=engine, runner_args=runner_args,
                                    budget_bytes=budget_bytes, load_timeout=load_timeout)
        if engine != "real":
            # An engine from a factory (serve/runner.py --engine MODULE:FACTORY) is not one of
            # impl.models: any name is a model, and its size is learned at load.
            if known_model is None:
                known_model = lambda _n: True
            if required_bytes is default_required_bytes:
                required_bytes = lambda _n: 0
        if known_model is None:
            known_model = default_known_model
        self.factory = runner_factory
        self.device_total = device_total
        self.system_free = system_free
        self.required_bytes = required_bytes
        self.known_model = known_model
        self.shared_memory = shared_memory
        self.wait_timeout = wait_timeout
        self.clock = clock
        self._cv = threading.Condition()
        self._entries: dict[str, Entry] = {}
        self._loading = False              # one load (decide/evict/start) at a time
        self._closed = False
        self._learned: dict[str, int] = {}
        self.decisions: collections.deque = collections.deque(maxlen=1000)
        self.events: collections.deque = collections.deque(maxlen=1000)

    # ----------------------------------------------------------------- figures
    def _event(self, kind: str, name: str, **extra) -> None:
        self.events.append((time.monotonic(), kind, name, extra))

    def figures(self) -> tuple[int, int]:
        """(device_free, system_free) now. Caller holds the lock."""
        held = sum(e.memory for e in self._entries.values())
        return max(0, int(self.device_total()) - held), max(0, int(self.system_free()))

    def required(self, name: str) -> int:
        return max(int(self.required_bytes(name) or 0), self._learned.get(name, 0))

    def _loaded_list(self) -> list:
        return [(e.name, e.refs == 0, e.last_used) for e in self._entries.values()]

    # ----------------------------------------------------------------- acquire / release
    def _acquire(self, name: str) -> Entry:
        if not self.known_model(name):
            raise UnknownModel(f"unknown model {name!r}")
        deadline = time.monotonic() + self.wait_timeout
        with self._cv:
            while True:
                if self._closed:
                    raise SchedulerClosed("scheduler is shut down")
                self._purge_dead_locked()
                e = self._entries.get(name)
                if e is not None:
                    e.refs += 1
                    break
                if self._loading:
                    self._wait_locked(deadline, f"waiting for another load to finish before {name!r}")
                    continue
                required = self.required(name)
                device_free, system_free = self.figures()
                loaded = self._loaded_list()
                alone = max(0, int(self.device_total()))
                outcome = fit_decision(required, device_free, system_free, loaded, self.shared_memory,
                                       alone_free=alone)
                self.decisions.append(Decision(name, required, device_free, system_free, loaded,
                                               self.shared_memory, outcome, self.clock(), alone))
                if outcome == "load":
                    e = Entry(name, None, refs=1, last_used=self.clock())
                    self._entries[name] = e
                    self._loading = True
                    break
                if outcome == "refuse":
                    self._event("refuse", name, required=required)
                    raise ModelTooLarge(
                        f"model {name!r} needs {required} bytes but only "
                        f"{alone} are available "
                        f"with nothing else loaded (F2: refused)")
                if outcome == "wait":
                    self._wait_locked(deadline, f"every loaded model is busy; cannot make room for {name!r}")
                    continue
                victim = self._entries.pop(outcome[1])
                victim.dropped = True
                self._loading = True
                self._cv.release()
                try:
                    self._event("evict", victim.name, pid=getattr(victim.client, "pid", None), for_model=name)
                    victim.client.close()           # R1: returns once the process is reaped
                    self._event("closed", victim.name, pid=getattr(victim.client, "pid", None))
                finally:
                    self._cv.acquire()
                    self._loading = False
                    self._cv.notify_all()
        if e.client is None:
            self._load(e)
        else:
            self._await_ready(e)
        return e

    def _wait_locked(self, deadline: float, why: str) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SchedulerBusy(f"timed out after {self.wait_timeout:.0f}s: {why}")
        self._cv.wait(min(left, 0.5))

    def _load(self, e: Entry) -> None:
        try:
            client = self.factory(e.name)
            with self._cv:   # R1 at this level: close() either sees the client or we see closed
                if self._closed or e.dropped:
                    client.close()
                    raise SchedulerClosed("scheduler is shut down")
                e.client = client
            self._event("load_start", e.name)
            info = client.load()
            self._event("load_done", e.name, pid=getattr(client, "pid", None))
            mem = (info or {}).get("memory", {}) if isinstance(info, dict) else {}
            e.memory = runner_bytes(mem)
            self._learned[e.name] = max(self._learned.get(e.name, 0), e.memory)
        except BaseException as exc:
            e.error = exc
            with self._cv:
                if self._entries.get(e.name) is e:
                    del self._entries[e.name]
                e.dropped = True
                e.refs -= 1
                self._loading = False
                self._cv.notify_all()
            e.ready.set()
            if e.client is not None:
                e.client.close()
            raise
        with self._cv:
            e.last_used = self.clock()
            self._loading = False
            self._cv.notify_all()
        e.ready.set()

    def _await_ready(self, e: Entry) -> None:
        if not e.ready.wait(self.wait_timeout):
            self._release(e)
            raise SchedulerBusy(f"timed out waiting for {e.name!r} to load")
        if e.error is not None:
            self._release(e)
            raise RunnerError(f"loading {e.name!r} failed: {e.error}")

    def _release(self, e: Entry) -> None:
        with self._cv:
            e.refs -= 1
            e.last_used = self.clock()
            self._cv.notify_all()

    def _purge_dead_locked(self) -> None:
        for name, e in list(self._entries.items()):
            if e.ready.is_set() and e.client is not None and not e.client.alive():
                del self._entries[name]
                e.dropped = True
                self._event("died", name, pid=getattr(e.client, "pid", None))
                e.client.close()   # already exited: this only collects it

    def _drop(self, e: Entry, why: str) -> None:
        with self._cv:
            if self._entries.get(e.name) is e:
                del self._entries[e.name]
            e.dropped = True
            self._event("died", e.name, pid=getattr(e.client, "pid", None), why=why)
            self._cv.notify_all()
        e.client.close()

    # ----------------------------------------------------------------- public API
    def generate(self, name: str, prompt, max_tokens: int = 128, media=(),
                 on_token: Optional[Callable] = None, cancel: Optional[Callable[[], bool]] = None,
                 **request) -> dict:
        """Run one request on ``name``'s runner, loading it first if needed. Streams through
        ``on_token``; returns the runner's final line (tokens, text, stats). ``request`` (the
        runner's options, boundaries) goes to the runner client as it is."""
        for attempt in range(2):
            e = self._acquire(name)
            try:
                with e.req_lock:
                    if e.dropped:
                        continue        # died while we queued: load a fresh runner once
                    try:
                        result = e.client.generate(prompt, max_tokens, media=media,
                                                   on_token=on_token, cancel=cancel, **request)
                    except RunnerDied as exc:
                        self._drop(e, str(exc))
                        if attempt == 0 and not exc.answered:
                            continue    # it died before answering (idle, exit not yet seen): one fresh runner
                        raise
                    except ClientClosed as exc:
                        raise SchedulerBusy(f"runner for {name!r} was unloaded during the request") from exc
                    try:
                        e.memory = runner_bytes(e.client.memory())
                    except RunnerError:
                        pass
                    return result
            finally:
                self._release(e)
        raise SchedulerBusy(f"runner for {name!r} kept dying before the request could start")

    def loaded(self) -> list:
        """Loaded models with their memory (live from each runner when it answers)."""
        with self._cv:
            self._purge_dead_locked()
            entries = [e for e in self._entries.values() if e.ready.is_set() and e.error is None]
        out = []
        for e in entries:
            try:
                mem = e.client.memory()
            except RunnerError as exc:
                mem = {"error": str(exc)}
            out.append({"model": e.name, "pid": getattr(e.client, "pid", None), "idle": e.refs == 0,
                        "last_used": e.last_used, "bytes": e.memory, "memory": mem})
        return out

    def trie(self, name: str, fmt: str = "text"):
        with self._cv:
            e = self._entries.get(name)
            if e is None or not e.ready.is_set() or e.error is not None:
                raise NotLoaded(f"model {name!r} is not loaded")
        return e.client.trie(fmt)

    def unload(self, name: str) -> bool:
        """Close ``name``'s runner once it is idle (R1: returns after the reap). False if it was
        not loaded."""
        deadline = time.monotonic() + self.wait_timeout
        with self._cv:
            while True:
                e = self._entries.get(name)
                if e is None:
                    return False
                if e.refs == 0 and e.ready.is_set():
                    del self._entries[name]
                    e.dropped = True
                    break
                self._wait_locked(deadline, f"{name!r} is busy")
        e.client.close()
        self._event("closed", name, pid=getattr(e.client, "pid", None))
        with self._cv:
            self._cv.notify_all()
        return True

    def close(self) -> None:
        """Shut down: close every runner and wait for each reap."""
        with self._cv:
            self._closed = True
            entries = list(self._entries.values())
            self._entries.clear()
            self._cv.notify_all()
        for e in entries:
            e.dropped = True
            if e.client is not None:
                e.client.close()

    def snapshot(self) -> list:
        """[(name, idle, last_used, bytes)] of the table, for tests and listings."""
        with self._cv:
            return [(e.name, e.refs == 0, e.last_used, e.memory) for e in self._entries.values()]
