"""A terminal chat against the local server: ``python -m impl chat MODEL``.

Each turn sends the whole conversation (a list of {role, content} messages) to /api/generate,
prints the reply as it streams, then the turn's cache statistics: how much of the prompt the
prefix cache matched, where the request resumed, and how many tokens it had to prefill.
Type /bye (or end input) to leave, /reset to start over.
"""
from __future__ import annotations

import http.client
import json
import sys
from typing import Optional, TextIO

from impl.server import DEFAULT_PORT


class ChatError(Exception):
    pass


def stream_generate(host: str, port: int, body: dict, out: Optional[TextIO] = None,
                    timeout: float = 600.0) -> dict:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        try:
            conn.request("POST", "/api/generate", body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
        except OSError as e:
            raise ChatError(f"cannot reach the server at {host}:{port} ({e}); "
                            f"start one with: python -m impl serve --port {port}")
        if resp.status != 200:
            data = resp.read()
            try:
                msg = json.loads(data).get("error", data.decode())
            except ValueError:
                msg = data.decode("utf-8", "replace")
            raise ChatError(f"server answered {resp.status}: {msg}")
        while True:
            line = resp.readline()
            if not line:
                raise ChatError("the server closed the stream before the reply finished")
            msg = json.loads(line)
            if "error" in msg:
                raise ChatError(msg["error"])
            if msg.get("done"):
                return msg
            if out is not None:
                out.write(msg.get("text", ""))
                out.flush()
    finally:
        conn.close()


def format_stats(stats: dict, seconds: Optional[float] = None) -> str:
    keys = ("total", "matched", "resumed", "prefilled", "captures", "evictions")
    parts = [f"{k}={stats[k]}" for k in keys if k in stats]
    if seconds is not None:
        parts.append(f"{seconds:.2f}s")
    return "[cache] " + " ".join(parts)


def chat(model: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT, max_tokens: int = 128,
         system: Optional[str] = None, inp: TextIO = sys.stdin, out: TextIO = sys.stdout) -> int:
    messages = [{"role": "system", "content": system}] if system else []
    interactive = inp.isatty()
    out.write(f"chatting with {model} at {host}:{port} (/bye to quit, /reset to start over)\n")
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
            final = stream_generate(host, port, {"model": model, "prompt": messages,
                                                 "max_tokens": max_tokens}, out)
        except ChatError as e:
            messages.pop()
            out.write(f"\nerror: {e}\n")
            if "cannot reach" in str(e):
                return 1
            continue
        reply = final.get("text", "")
        messages.append({"role": "assistant", "content": reply})
        out.write("\n" + format_stats(final.get("stats", {}), final.get("seconds")) + "\n")
        out.flush()
    return 0
