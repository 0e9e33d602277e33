"""RunnerClient: owns one runner process (serve/runner.py) and talks to it over loopback HTTP.

R1 (REFERENCE.md; spec.scheduler.client_transition):
- ``load`` starts the process and records it under the client's lock, and refuses once
  ``close`` has run, so a close racing a load either finds the process or makes the load refuse.
- ``close`` kills the process (SIGTERM, then SIGKILL after a short grace) and waits until it is
  reaped before returning: the next load never overlaps a dying runner still holding memory.
- A runner that died on its own is detected (``alive()``, and every request checks) and is
  reported as ``RunnerDied`` with its exit status and the tail of its stderr.
"""
from __future__ import annotations

import collections
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Optional
from urllib.parse import urlencode

from impl.platform import preload_env
from spec.scheduler import LOADING, NEW, client_transition

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


class RunnerError(Exception):
    """Any failure talking to a runner."""


class ClientClosed(RunnerError):
    """R1: the client was closed; it starts no process any more."""


class RunnerDied(RunnerError):
    """The runner process exited on its own (crash, OOM kill, SIGKILL from outside). ``answered``: whether
    the request had received any line from the runner (False: nothing of it reached the caller)."""

    def __init__(self, msg: str, answered: bool = True):
        super().__init__(msg)
        self.answered = answered


class RunnerLoadError(RunnerError):
    """The runner could not load its model (or did not become ready in time)."""


class RunnerRequestError(RunnerError):
    """The runner answered a request with an error status."""

    def __init__(self, status: int, message: str):
        super().__init__(f"runner answered {status}: {message}")
        self.status = status
        self.message = message


def runner_env(base: Optional[dict] = None) -> dict:
    """The environment a runner starts with: the platform preload (impl/platform.py) and the
    project root on PYTHONPATH."""
    env = preload_env(os.environ if base is None else base)
    pp = env.get("PYTHONPATH", "")
    if PROJECT_ROOT not in pp.split(os.pathsep):
        env["PYTHONPATH"] = PROJECT_ROOT + (os.pathsep + pp if pp else "")
    return env


def describe_exit(returncode: Optional[int]) -> str:
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


class RunnerClient:
    """One runner process serving one model."""

    def __init__(self, model: str, *, engine: str = "real", runner_args: Iterable[str] = (),
                 budget_bytes: Optional[int] = None, load_timeout: float = 300.0,
                 grace: float = 1.0, python: str = sys.executable, env: Optional[dict] = None):
        self.model = model
        self.engine = engine
        self.runner_args = list(runner_args)
        self.budget_bytes = budget_bytes
        self.load_timeout = load_timeout
        self.grace = grace
        self.python = python
        self.env = env
        self._lock = threading.Lock()          # R1: guards _closed, _proc, _state
        self._cv = threading.Condition()       # start-up events from the reader threads
        self._closed = False
        self._state = NEW
        self._proc: Optional[subprocess.Popen] = None
        self._port: Optional[int] = None
        self._ready: Optional[dict] = None
        self._load_error: Optional[str] = None
        self._exited = False
        self._stderr: collections.deque = collections.deque(maxlen=40)
        self.load_started_at: Optional[float] = None
        self.closed_at: Optional[float] = None

    # ----------------------------------------------------------------- introspection
    @property
    def state(self) -> str:
        return self._state

    @property
    def pid(self) -> Optional[int]:
        p = self._proc
        return p.pid if p is not None else None

    @property
    def port(self) -> Optional[int]:
        return self._port

    @property
    def ready_info(self) -> dict:
        return dict(self._ready or {})

    def alive(self) -> bool:
        p = self._proc
        return p is not None and p.poll() is None

    def stderr_tail(self, n: int = 10) -> str:
        return "\n".join(list(self._stderr)[-n:])

    def _death_error(self, answered: bool = True) -> RunnerDied:
        p = self._proc
        rc = p.poll() if p is not None else None
        tail = self.stderr_tail(6)
        msg = f"runner for model {self.model!r} (pid {self.pid}) {describe_exit(rc)}"
        if tail:
            msg += f"; last stderr:\n{tail}"
        return RunnerDied(msg, answered)

    # ----------------------------------------------------------------- life cycle
    def command(self) -> list:
        cmd = [self.python, "-m", "serve.runner", "--model", self.model, "--port", "0",
               "--engine", self.engine, "--watch-stdin"]
        if self.budget_bytes is not None:
            cmd += ["--budget-bytes", str(self.budget_bytes)]
        return cmd + self.runner_args

    def _start_locked(self) -> None:
        """Start the process and record it. Caller holds self._lock (R1)."""
        if self._closed:
            raise ClientClosed(f"R1: client for {self.model!r} is closed; refusing to start a runner")
        self._state = client_transition(self._state, "load")
        self.load_started_at = time.monotonic()
        self._proc = subprocess.Popen(
            self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=runner_env(self.env), cwd=PROJECT_ROOT, start_new_session=True)
        proc = self._proc
        threading.Thread(target=self._read_stdout, args=(proc,), daemon=True,
                         name=f"runner-stdout-{proc.pid}").start()
        threading.Thread(target=self._read_stderr, args=(proc,), daemon=True,
                         name=f"runner-stderr-{proc.pid}").start()

    def load(self) -> dict:
        """Start the runner and wait until its model is loaded. Returns the ready info."""
        with self._lock:
            self._start_locked()
        deadline = time.monotonic() + self.load_timeout
        err: Optional[str] = None
        with self._cv:
            while True:
                if self._ready is not None:
                    break
                if self._closed:
                    raise ClientClosed(f"R1: client for {self.model!r} was closed while loading")
                if self._load_error is not None or self._exited:
                    err = self._load_error
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    err = f"runner did not become ready within {self.load_timeout:.0f}s"
                    break
                self._cv.wait(min(left, 0.5))
        if self._ready is None:
            died = self._death_error() if not self.alive() else None
            self.close()
            detail = err or (str(died) if died else "runner exited during load")
            raise RunnerLoadError(f"loading {self.model!r} failed: {detail}")
        with self._lock:
            if self._state == LOADING:
                self._state = client_transition(self._state, "ready")
        return self.ready_info

    def close(self) -> None:
        """Kill the runner and wait until it is reaped (R1). Idempotent; safe from any thread."""
        with self._lock:
            self._closed = True
            proc = self._proc
            if proc is not None and proc.returncode is None:
                self._kill_and_reap(proc)
            if proc is not None:
                for f in (proc.stdin, proc.stdout, proc.stderr):
                    try:
                        if f is not None:
                            f.close()
                    except OSError:
                        pass
            reaped = proc is None or proc.returncode is not None
            self._state = client_transition(self._state, "close", process_reaped=reaped)
            if self.closed_at is None:
                self.closed_at = time.monotonic()
        with self._cv:
            self._cv.notify_all()

    def _kill_and_reap(self, proc: subprocess.Popen) -> None:
        def signal_group(sig):
            try:
                os.killpg(proc.pid, sig)   # the runner leads its own session/group
            except (ProcessLookupError, PermissionError):
                try:
                    proc.send_signal(sig)
                except ProcessLookupError:
                    pass

        if proc.poll() is None:
            signal_group(signal.SIGTERM)
            try:
                proc.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                signal_group(signal.SIGKILL)
        proc.wait()  # reap: returns only once the kernel has released the process

    # ----------------------------------------------------------------- reader threads
    def _read_stdout(self, proc: subprocess.Popen) -> None:
        try:
            for raw in proc.stdout:
                try:
                    ev = json.loads(raw)
                except ValueError:
                    continue
                with self._cv:
                    if ev.get("event") == "port":
                        self._port = int(ev["port"])
                    elif ev.get("event") == "ready":
                        self._ready = ev
                    elif ev.get("event") == "error":
                        self._load_error = str(ev.get("error"))
                    self._cv.notify_all()
        except (ValueError, OSError):
            pass
        try:
            proc.wait()
        except Exception:
            pass
        with self._cv:
            self._exited = True
            self._cv.notify_all()

    def _read_stderr(self, proc: subprocess.Popen) -> None:
        verbose = bool(os.environ.get("IMPL_RUNNER_VERBOSE"))
        try:
            for raw in proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self._stderr.append(line)
                if verbose:
                    print(f"[runner {proc.pid}] {line}", file=sys.stderr)
        except (ValueError, OSError):
            pass

    # ----------------------------------------------------------------- requests
    def _conn(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._closed:
            raise ClientClosed(f"client for {self.model!r} is closed")
        if self._port is None or self._ready is None:
            raise RunnerError(f"runner for {self.model!r} is not loaded")
        if not self.alive():
            raise self._death_error(answered=False)         # no request was sent
        return http.client.HTTPConnection("127.0.0.1", self._port, timeout=timeout)

    def _failed(self, exc: BaseException, answered: bool = True) -> RunnerError:
        """Turn a transport failure into RunnerDied if the process is gone."""
        p = self._proc
        if p is not None:
            try:
                p.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
        if not self.alive():
            return self._death_error(answered)
        return RunnerError(f"request to runner for {self.model!r} failed: {type(exc).__name__}: {exc}")

    def _get_json(self, path: str, timeout: float = 10.0):
        conn = self._conn(timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise self._failed(e) from e
        finally:
            conn.close()
        if resp.status != 200:
            raise RunnerRequestError(resp.status, _error_text(data))
        if resp.getheader("Content-Type", "").startswith("text/plain"):
            return data.decode("utf-8", "replace")
        return json.loads(data)

    def health(self) -> dict:
        return self._get_json("/health")

    def memory(self) -> dict:
        return self._get_json("/memory")

    def trie(self, fmt: str = "text"):
        return self._get_json("/trie" + ("?" + urlencode({"format": fmt}) if fmt != "text" else ""))

    def generate(self, prompt, max_tokens: int = 128, media=(), on_token: Optional[Callable] = None,
                 cancel: Optional[Callable[[], bool]] = None, timeout: Optional[float] = None,
                 options: Optional[dict] = None, boundaries: Optional[list] = None) -> dict:
        """Stream one generation. ``on_token(line)`` gets each {"token", "text"} line (and a last
        {"text"} line with text held back for stop strings); returns the final {"done", "tokens",
        "text", "stats", "done_reason", ...}. ``cancel()`` returning True hangs up, which the
        runner sees as the client going away and stops the engine. ``options`` (temperature,
        seed, stop) and ``boundaries`` go to the runner as they are (serve/runner.py)."""
        req = {"prompt": prompt, "max_tokens": max_tokens, "media": list(media), "stream": True}
        if options:
            req["options"] = options
        if boundaries is not None:
            req["boundaries"] = boundaries
        body = json.dumps(req).encode()
        conn = self._conn(timeout)
        done = threading.Event()
        cancelled = threading.Event()
        tokens: list = []
        answered = False
        try:
            conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
            sock = conn.sock          # http.client forgets it once a close-delimited response starts
            resp = conn.getresponse()
            if resp.status != 200:
                raise RunnerRequestError(resp.status, _error_text(resp.read()))
            if cancel is not None:
                def watch():
                    while not done.wait(0.02):
                        if cancel():
                            cancelled.set()
                            try:
                                sock.shutdown(socket.SHUT_RDWR)
                            except OSError:
                                pass
                            return
                threading.Thread(target=watch, daemon=True, name="generate-cancel").start()
            while True:
                line = resp.readline()
                if not line:
                    break
                answered = True
                msg = json.loads(line)
                if "error" in msg:
                    raise RunnerRequestError(500, str(msg["error"]))
                if msg.get("done"):
                    return msg
                if "token" in msg:
                    tokens.append(msg["token"])
                if on_token is not None:
                    on_token(msg)
        except RunnerError:
            raise
        except (OSError, http.client.HTTPException, ValueError) as e:
            if cancelled.is_set():
                return {"done": True, "tokens": tokens, "cancelled": True, "stats": {}}
            raise self._failed(e, answered) from e
        finally:
            done.set()
            conn.close()
        if cancelled.is_set():
            return {"done": True, "tokens": tokens, "cancelled": True, "stats": {}}
        raise self._failed(EOFError("stream ended before the final line"))


def _error_text(data: bytes) -> str:
    try:
        obj = json.loads(data)
        if isinstance(obj, dict) and "error" in obj:
            return str(obj["error"])
    except ValueError:
        pass
    return data.decode("utf-8", "replace").strip()
