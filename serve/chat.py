"""A terminal chat against the local server: ``python -m serve chat MODEL``.

Each turn sends the whole conversation to Ollama's ``POST /api/chat`` (streamed), shows a spinner
while the prompt is evaluated (on a terminal), prints the reply as it streams, then the turn's
reuse: prompt tokens, how many the prefix cache resumed and how many were evaluated
(``x_prefix_cache`` of the last object). At exit, one line of memory: the model's weights, live
caches and paged-out cache against its budget (``GET /api/ps``).
Type /bye (or end input) to leave, /reset to start over.
"""
from __future__ import annotations

import http.client
import itertools
import json
import sys
import threading
from typing import Optional, TextIO

from serve.budget import human
from serve.server import DEFAULT_PORT


class ChatError(Exception):
    pass


class Spinner:
    """A spinner on ``out`` until ``stop()`` (the first reply text); nothing when not a terminal."""

    def __init__(self, out: TextIO, label: str = "evaluating the prompt", enabled: Optional[bool] = None):
        self.out, self.label = out, label
        self.enabled = out.isatty() if enabled is None else enabled
        self._done = threading.Event()
        self._thread = None
        if self.enabled:
            self._thread = threading.Thread(target=self._spin, daemon=True, name="spinner")
            self._thread.start()

    def _spin(self) -> None:
        for frame in itertools.cycle("|/-\\"):
            self.out.write(f"\r{frame} {self.label}…")
            self.out.flush()
            if self._done.wait(0.1):
                break
        self.out.write("\r" + " " * (len(self.label) + 4) + "\r")
        self.out.flush()

    def stop(self) -> None:
        if not self._done.is_set():
            self._done.set()
            if self._thread is not None:
                self._thread.join()


def _request(host: str, port: int, method: str, path: str, body=None, timeout: float = 600.0):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
    except OSError as e:
        conn.close()
        raise ChatError(f"cannot reach the server at {host}:{port} ({e}); "
                        f"start one with: python -m serve --port {port}")
    if resp.status != 200:
        data = resp.read()
        conn.close()
        try:
            msg = json.loads(data).get("error", data.decode())
        except ValueError:
            msg = data.decode("utf-8", "replace")
        raise ChatError(f"server answered {resp.status}: {msg}")
    return conn, resp


def stream_chat(host: str, port: int, body: dict, out: Optional[TextIO] = None, spinner: Optional[bool] = None,
                timeout: float = 600.0) -> tuple[str, dict]:
    """(reply text, last object) of one streamed /api/chat request."""
    spin = Spinner(out, enabled=spinner) if out is not None else None
    try:
        conn, resp = _request(host, port, "POST", "/api/chat", dict(body, stream=True), timeout)
        try:
            parts = []
            while True:
                line = resp.readline()
                if not line:
                    raise ChatError("the server closed the stream before the reply finished")
                msg = json.loads(line)
                if "error" in msg:
                    raise ChatError(msg["error"])
                piece = msg.get("message", {}).get("content", "")
                if piece and spin is not None:
                    spin.stop()
                    out.write(piece)
                    out.flush()
                parts.append(piece)
                if msg.get("done"):
                    return "".join(parts), msg
        finally:
            conn.close()
    finally:
        if spin is not None:
            spin.stop()


def format_reuse(final: dict) -> str:
    x = final.get("x_prefix_cache", {})
    n = final.get("prompt_eval_count", 0)
    secs = final.get("total_duration", 0) / 1e9
    tps = final.get("eval_count", 0) / max(final.get("eval_duration", 0) / 1e9, 1e-9)
    return (f"[cache] prompt {x.get('total', '?')} tokens: {x.get('resumed', 0)} reused "
            f"(matched {x.get('matched', 0)}), {n} evaluated; captures={x.get('captures', 0)} "
            f"evictions={x.get('evictions', 0)}; {final.get('eval_count', 0)} new tokens at {tps:.1f} tok/s, "
            f"{secs:.2f}s")


def memory_summary(host: str, port: int, model: str) -> str:
    try:
        conn, resp = _request(host, port, "GET", "/api/ps", timeout=10)
        try:
            models = json.loads(resp.read()).get("models", [])
        finally:
            conn.close()
    except (ChatError, ValueError) as e:
        return f"[memory] unavailable: {e}"
    for m in models:
        if m.get("model") == model:
            mem, x = m.get("x_memory", {}), m.get("x_prefix_cache", {})
            parts = [f"weights {human(mem.get('weights', 0) or 0)}", f"live caches {human(mem.get('live_caches', 0) or 0)}",
                     f"prefix cache {human(mem.get('paged_out', 0) or 0)} of {human(x.get('budget') or 0)} budget"]
            if "rss" in mem:
                parts.append(f"runner RSS {human(mem['rss'])}")
            return f"[memory] {model}: " + ", ".join(parts)
    return f"[memory] {model}: not loaded"


def chat(model: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT, max_tokens: int = 128,
         system: Optional[str] = None, inp: TextIO = sys.stdin, out: TextIO = sys.stdout,
         spinner: Optional[bool] = None) -> int:
    messages = [{"role": "system", "content": system}] if system else []
    interactive = inp.isatty()
    out.write(f"chatting with {model} at {host}:{port} (/bye to quit, /reset to start over)\n")
    rc = 0
    while True:
        if interactive:
            out.write(">>> ")
            out.flush()
        line = inp.readline()
        if not line:
            break
        text = line.rstrip("\n")
        if not text.strip():
            continue
        if text.strip() == "/bye":
            break
        if text.strip() == "/reset":
            messages = messages[:1] if system else []
            out.write("(conversation reset)\n")
            continue
        if not interactive:
            out.write(f">>> {text}\n")
        messages.append({"role": "user", "content": text})
        try:
            reply, final = stream_chat(host, port, {"model": model, "messages": messages,
                                                    "options": {"num_predict": max_tokens}}, out, spinner)
        except ChatError as e:
            messages.pop()
            out.write(f"\nerror: {e}\n")
            if "cannot reach" in str(e):
                return 1
            continue
        messages.append({"role": "assistant", "content": reply})
        out.write("\n" + format_reuse(final) + "\n")
        out.flush()
    out.write(memory_summary(host, port, model) + "\n")
    out.flush()
    return rc
