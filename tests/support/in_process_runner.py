"""A runner without a process, for scheduler tests and the scheduler state machine."""
from __future__ import annotations

import threading
from typing import Optional

from serve.client import ClientClosed, RunnerDied
from spec.scheduler import NEW, client_transition


class InProcessRunner:
    """A runner without a process, for scheduler tests and the state machine: same surface as
    RunnerClient (load/close/alive/generate/memory/trie/pid/state) and the same R1 life cycle
    (spec.scheduler.client_transition), with ``kill()`` standing in for a runner that dies."""

    _next_pid = 10_000
    _pid_lock = threading.Lock()

    def __init__(self, model: str, weight_bytes: int = 1 << 20):
        self.model = model
        self.weight_bytes = weight_bytes
        self._lock = threading.Lock()
        self._closed = False
        self._state = NEW
        self._running = False
        self.pid: Optional[int] = None
        self.requests = 0

    @property
    def state(self) -> str:
        return self._state

    def load(self) -> dict:
        with self._lock:
            if self._closed:
                raise ClientClosed(f"R1: client for {self.model!r} is closed; refusing to start a runner")
            self._state = client_transition(self._state, "load")
            with InProcessRunner._pid_lock:
                InProcessRunner._next_pid += 1
                self.pid = InProcessRunner._next_pid
            self._running = True
            self._state = client_transition(self._state, "ready")
        return {"event": "ready", "memory": self.memory()}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._running = False          # "killed and reaped" at once
            self._state = client_transition(self._state, "close", process_reaped=True)

    def kill(self) -> None:
        self._running = False

    def alive(self) -> bool:
        return self._running

    def memory(self) -> dict:
        if not self._running:
            raise RunnerDied(f"runner for model {self.model!r} (pid {self.pid}) was killed")
        return {"weights": self.weight_bytes, "live_caches": 0, "paged_out": 0}

    def generate(self, prompt, max_tokens=1, media=(), on_token=None, cancel=None) -> dict:
        if self._closed:
            raise ClientClosed(f"client for {self.model!r} is closed")
        if not self._running:
            raise RunnerDied(f"runner for model {self.model!r} (pid {self.pid}) was killed")
        self.requests += 1
        toks = list(range(max_tokens))
        for t in toks:
            if on_token is not None:
                on_token({"token": t, "text": ""})
        return {"done": True, "tokens": toks, "text": "", "stats": {"total": len(prompt)}}

    def trie(self, fmt: str = "text"):
        return "(in-process runner)" if fmt == "text" else {}
