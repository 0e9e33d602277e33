"""HTTP plumbing shared by the server (serve/server.py) and the runner process (serve/runner.py).

- Both bind loopback addresses only (``is_loopback``).
- A request body is read only with a Content-Length no larger than the handler's limit (411/413
  otherwise), and a /generate body is checked by ``validate_generate`` before anything is touched:
  bad input raises ``BadRequest`` (impl/media.py, the one class for bad input) and changes nothing.
- Errors are answered as ``{"error": message}`` with the BadRequest's status.
- A streamed answer is NDJSON, one object per line; once the peer closed its end (``peer_gone``)
  nothing more is written and ``_client_gone()`` is True, which the caller passes on as the
  generation's cancel check.
"""
from __future__ import annotations

import ipaddress
import json
import select
import socket
from http.server import BaseHTTPRequestHandler

from impl.media import BadRequest

__all__ = ["MAX_BODY_BYTES", "BadRequest", "JSONHandler", "check_boundaries", "check_options", "is_loopback",
           "peer_gone", "validate_generate"]

MAX_BODY_BYTES = 8 << 20


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost' - the only addresses our servers bind to."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def peer_gone(sock) -> bool:
    """True once the peer of ``sock`` closed its end: EOF is readable without blocking."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
        return bool(r) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def validate_generate(body: bytes, max_prompt_tokens: int, max_new_tokens: int) -> dict:
    """Parse and check a runner /generate body; raises BadRequest before anything is touched.

    ``prompt``: token ids, {role, content} messages, or a string (raw text, tokenised as is);
    ``options``: {"temperature": >= 0, "seed": int, "stop": [str]}; ``boundaries``: increasing
    token offsets inside a token-id prompt (passed to an engine that takes them)."""
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"malformed JSON: {e}")
    if not isinstance(req, dict):
        raise BadRequest("request body must be a JSON object")
    if "prompt" not in req:
        raise BadRequest("missing field 'prompt'")
    prompt = req["prompt"]
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("'prompt' must not be empty")
        if len(prompt) > 8 * max_prompt_tokens:
            raise BadRequest(f"prompt has {len(prompt)} characters; the limit is {8 * max_prompt_tokens}", 413)
    elif not isinstance(prompt, list) or not prompt:
        raise BadRequest("'prompt' must be a non-empty list of token ids or of chat messages, or a string")
    elif all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if any(t < 0 for t in prompt):
            raise BadRequest("'prompt' token ids must be >= 0")
        if len(prompt) > max_prompt_tokens:
            raise BadRequest(f"prompt has {len(prompt)} tokens; the limit is {max_prompt_tokens}", 413)
    elif all(isinstance(m, dict) for m in prompt):
        chars = 0
        for i, m in enumerate(prompt):
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise BadRequest(f"message {i} needs string fields 'role' and 'content'")
            chars += len(m["content"])
        # A token is at least one character for any tokenizer we serve, so a prompt whose text
        # is this long is certainly over the token limit... only bound it generously here; the
        # token count is checked again by the engine's tokenizer.
        if chars > 8 * max_prompt_tokens:
            raise BadRequest(f"prompt has {chars} characters; the limit is {8 * max_prompt_tokens}", 413)
    else:
        raise BadRequest("'prompt' must be a list of token ids (ints) or of {role, content} messages")
    max_tokens = req.get("max_tokens", 128)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise BadRequest("'max_tokens' must be an integer")
    if max_tokens < 0:
        raise BadRequest(f"'max_tokens' must be >= 0, got {max_tokens}")
    if max_tokens > max_new_tokens:
        raise BadRequest(f"'max_tokens' {max_tokens} exceeds the limit {max_new_tokens}")
    stream = req.get("stream", True)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean")
    media = req.get("media", [])
    if not isinstance(media, list):
        raise BadRequest("'media' must be a list")
    options = check_options(req.get("options", {}))
    boundaries = req.get("boundaries")
    if boundaries is not None:
        check_boundaries(boundaries, prompt)
    return {"prompt": prompt, "max_tokens": max_tokens, "stream": stream, "media": media,
            "options": options, "boundaries": boundaries}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_options(options) -> dict:
    """The sampling options a runner applies: temperature, seed, stop (all optional)."""
    if not isinstance(options, dict):
        raise BadRequest("'options' must be an object")
    unknown = sorted(set(options) - {"temperature", "seed", "stop"})
    if unknown:
        raise BadRequest(f"unknown option {unknown[0]!r}")
    t = options.get("temperature")
    if t is not None and (not _number(t) or not 0 <= t <= 100):
        raise BadRequest(f"option 'temperature' must be a number in [0, 100], got {t!r}")
    seed = options.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise BadRequest(f"option 'seed' must be an integer, got {seed!r}")
    stop = options.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise BadRequest("option 'stop' must be a list of non-empty strings")
    return {"temperature": t, "seed": seed, "stop": stop or []}


def check_boundaries(boundaries, prompt) -> None:
    if not isinstance(prompt, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise BadRequest("'boundaries' is only valid with a prompt of token ids")
    if not isinstance(boundaries, list) or not all(isinstance(b, int) and not isinstance(b, bool)
                                                   for b in boundaries):
        raise BadRequest("'boundaries' must be a list of integers")
    if any(not 0 < b <= len(prompt) for b in boundaries):
        raise BadRequest(f"'boundaries' must lie in [1, {len(prompt)}] (the prompt's length)")
    if any(a >= b for a, b in zip(boundaries, boundaries[1:])):
        raise BadRequest("'boundaries' must be strictly increasing")


class JSONHandler(BaseHTTPRequestHandler):
    """The JSON plumbing of the runner's and the server's handlers: replies, request bodies
    bounded by `_body_limit()` (a BadRequest with 411/413 otherwise), and NDJSON streams."""

    def _body_limit(self) -> int:
        return MAX_BODY_BYTES

    def _send_json(self, status: int, obj) -> None:
        data = (json.dumps(obj) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            raise BadRequest("Content-Length required", 411)
        try:
            n = int(length)
        except ValueError:
            raise BadRequest("bad Content-Length")
        if n < 0:
            raise BadRequest("bad Content-Length")
        if n > self._body_limit():
            raise BadRequest(f"body of {n} bytes exceeds the limit of {self._body_limit()}", 413)
        return self.rfile.read(n)

    # ------------------------------------------------------------ NDJSON streams
    def _start_stream(self) -> None:
        """Before a streamed answer: nothing sent yet, peer present, connection closed after."""
        self._gone = False
        self._headers_sent = False
        self.close_connection = True

    def _client_gone(self) -> bool:
        """True once the peer closed its end (EOF readable without blocking)."""
        if not self._gone and peer_gone(self.connection):
            self._gone = True
        return self._gone

    def _write_line(self, obj) -> None:
        """One NDJSON line (the 200 headers first, once); nothing once the peer is gone."""
        self._write_stream((json.dumps(obj) + "\n").encode(), "application/x-ndjson")

    def _write_event(self, obj) -> None:
        """One server-sent event ``data: JSON`` (OpenAI's streams); a str is sent as it is."""
        data = obj if isinstance(obj, str) else json.dumps(obj)
        self._write_stream(f"data: {data}\n\n".encode(), "text/event-stream")

    def _write_stream(self, data: bytes, content_type: str) -> None:
        if self._gone:
            return
        if not self._headers_sent:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.end_headers()
            self._headers_sent = True
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self._gone = True
