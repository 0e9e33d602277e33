"""A runner process: one model, one Engine, served over loopback HTTP (REFERENCE.md F1, R1, A3).

    python -m impl.runner --model NAME [--port 0] [--engine real|fake] [--budget-bytes N]

Start-up protocol on stdout, one JSON object per line:
    {"event": "port", "port": N, "pid": P}    as soon as the socket is bound (before loading)
    {"event": "ready", "memory": {...}}       once the model is loaded and the pool released
    {"event": "error", "error": "..."}        if loading failed (the process then exits 3)
Diagnostics go to stderr.

Endpoints (JSON; errors are {"error": message} with a 4xx/5xx status):
    GET  /health     {"status": "loading"|"ok", "model", "pid"}
    GET  /memory     weights, live caches, paged-out, MLX active/cache/peak, process RSS
    GET  /trie       the engine's trie dump as text (?format=json: engine.dump_json())
    POST /generate   {"prompt": [ids] | [{"role", "content"}...], "max_tokens": N, "stream": bool}
                     streams NDJSON: {"token", "text"} per token, then {"done": true, "tokens",
                     "text", "stats"}; a client that goes away cancels the generation.

A3: after the weights are loaded and evaluated the allocator's free pool is released
(``mx.clear_cache()``), so an idle runner holds its weights and nothing more; /memory reports
the pool size that was released (``pool_released_bytes``).

``--engine fake`` swaps in a tiny deterministic engine with no MLX, for process and scheduler
tests only (start-up delay, per-token delay, ignoring signals, failing loads). The real path
always uses ``impl.models.load`` and ``impl.engine.Engine``.
"""
from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

MAX_BODY_BYTES = 8 << 20


class BadRequest(Exception):
    """A client error: reported as a 4xx with a clear message; nothing in the runner changes."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


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


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- request checking

def validate_generate(body: bytes, max_prompt_tokens: int, max_new_tokens: int) -> dict:
    """Parse and check a /generate body; raises BadRequest before anything is touched."""
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"malformed JSON: {e}")
    if not isinstance(req, dict):
        raise BadRequest("request body must be a JSON object")
    if "prompt" not in req:
        raise BadRequest("missing field 'prompt'")
    prompt = req["prompt"]
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest("'prompt' must be a non-empty list of token ids or of chat messages")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
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
    return {"prompt": prompt, "max_tokens": max_tokens, "stream": stream, "media": media}


# --------------------------------------------------------------------------- fake engine

@dataclasses.dataclass
class FakeStats:
    total: int = 0
    matched: int = 0
    resumed: int = 0
    prefilled: int = 0
    captures: int = 0
    evictions: int = 0


@dataclasses.dataclass
class FakeResult:
    tokens: list
    stats: FakeStats
    cancelled: bool = False


class FakeTokenizer:
    def decode(self, tokens, skip_special_tokens=False):
        return "".join(f" t{t}" for t in tokens)


class FakeEngine:
    """Deterministic stand-in for impl.engine.Engine (process/scheduler tests only).

    Its "prefix cache" remembers whole token streams and reports the longest common prefix as
    matched (leaving one prompt token to evaluate), so chat clients see plausible stats.
    """

    def __init__(self, weight_bytes: int, token_delay: float):
        self.weight_bytes = weight_bytes
        self.token_delay = token_delay
        self.stored: list[list[int]] = []
        self.tokenizer = FakeTokenizer()

    @staticmethod
    def _ids(prompt) -> list[int]:
        if prompt and isinstance(prompt[0], dict):
            out = []
            for m in prompt:
                out += [1] + [ord(c) % 997 + 3 for c in m["role"] + ":" + m["content"]] + [2]
            return out
        return list(prompt)

    def generate(self, prompt, max_tokens, media=(), cancel=None, on_token=None):
        ids = self._ids(prompt)
        matched = 0
        for s in self.stored:
            n = 0
            while n < min(len(s), len(ids)) and s[n] == ids[n]:
                n += 1
            matched = max(matched, n)
        matched = min(matched, len(ids) - 1)
        out, cancelled = [], False
        seed = sum(ids) % 1000
        for i in range(max_tokens):
            if cancel is not None and cancel():
                cancelled = True
                break
            if self.token_delay:
                time.sleep(self.token_delay)
            tok = (seed + 7 * i) % 1000
            out.append(tok)
            if on_token is not None:
                on_token(tok)
        self.stored.append(ids + out)
        del self.stored[:-8]
        stats = FakeStats(total=len(ids), matched=matched, resumed=matched,
                          prefilled=len(ids) - matched, captures=1)
        return FakeResult(tokens=out, stats=stats, cancelled=cancelled)

    def memory(self) -> dict:
        return {"weights": self.weight_bytes, "live_caches": 0, "paged_out": 0}

    def dump(self) -> str:
        return "\n".join(f"stream {i}: {len(s)} tokens" for i, s in enumerate(self.stored)) or "(empty)"

    def dump_json(self) -> dict:
        return {"streams": [len(s) for s in self.stored]}


# --------------------------------------------------------------------------- loading

def _mlx_figures() -> dict:
    mx = sys.modules.get("mlx.core")  # only if this runner uses MLX at all
    if mx is None:
        return {}
    return {"mlx_active": int(mx.get_active_memory()), "mlx_cache": int(mx.get_cache_memory()),
            "mlx_peak": int(mx.get_peak_memory())}


def _release_pool() -> int:
    """A3: release MLX's allocator pool; returns the bytes it held just before."""
    import mlx.core as mx
    held = int(mx.get_cache_memory())
    mx.clear_cache()
    return held


def _fake_mlx_weights(nbytes: int):
    """Fake engine with --fake-mlx: build weights through a transform, as real loaders do
    (dequantise, fuse), so the consumed buffers land in MLX's pool before it is released."""
    import mlx.core as mx
    chunk = 1 << 16                 # 256 KiB tensors: sizes MLX's allocator pools
    raw = [mx.ones((chunk,), dtype=mx.float32) + i for i in range(max(1, nbytes // (4 * chunk)))]
    mx.eval(raw)
    w = [r * 2.0 + 1.0 for r in raw]
    mx.eval(w)
    del raw                         # their buffers go back to the pool, not to the system
    return w


def load_engine(args) -> tuple[Any, Any, dict]:
    """Load the model and build its engine. Returns (engine, tokenizer, info)."""
    info: dict = {}
    if args.engine == "fake":
        if args.fake_load_delay:
            time.sleep(args.fake_load_delay)
        if args.fake_fail_load:
            raise RuntimeError(f"fake load of {args.model!r} failed as asked")
        engine = FakeEngine(args.fake_weight_bytes, args.fake_token_delay)
        if args.fake_mlx:
            engine._weights = _fake_mlx_weights(args.fake_weight_bytes)
            info["pool_released_bytes"] = _release_pool()
        return engine, engine.tokenizer, info

    import mlx.core as mx
    from impl import models
    from impl.engine import Engine

    loaded = models.load(args.model)
    mx.eval(loaded.model.parameters())
    info["weight_bytes"] = int(getattr(loaded, "weight_bytes", 0))
    kwargs = {}
    if args.budget_bytes is not None:
        kwargs["budget_bytes"] = args.budget_bytes
    engine = Engine(loaded, **kwargs)
    info["pool_released_bytes"] = _release_pool()
    return engine, loaded.tokenizer, info


class TextStream:
    """Incremental detokenisation: emits only text that is final (no trailing partial UTF-8)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.sent = ""

    def _decode(self) -> str:
        if self.tokenizer is None or not hasattr(self.tokenizer, "decode"):
            return ""
        try:   # control tokens (end of turn) are not text: a chat must not echo them back
            return self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        except TypeError:
            try:
                return self.tokenizer.decode(self.tokens)
            except Exception:
                return ""
        except Exception:
            return ""

    def push(self, tok: int) -> str:
        self.tokens.append(tok)
        text = self._decode()
        if text.endswith("\ufffd") or not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece

    def flush(self) -> str:
        text = self._decode()
        piece = text[len(self.sent):] if text.startswith(self.sent) else ""
        self.sent = text
        return piece


def _jsonable(obj):
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    try:
        return int(obj)
    except Exception:
        return str(obj)


# --------------------------------------------------------------------------- HTTP

class RunnerState:
    def __init__(self, args):
        self.args = args
        self.status = "loading"
        self.engine = None
        self.tokenizer = None
        self.info: dict = {}
        self.engine_lock = threading.Lock()
        self.last_engine_memory: dict = {}

    def memory(self) -> dict:
        out: dict = {"model": self.args.model, "pid": os.getpid(), "status": self.status}
        eng: dict = {}
        if self.engine is not None:
            if self.engine_lock.acquire(timeout=0.2):
                try:
                    eng = _jsonable(self.engine.memory())
                    self.last_engine_memory = eng
                finally:
                    self.engine_lock.release()
            else:
                eng = dict(self.last_engine_memory, busy=True)
        out.update(eng)
        if "weights" not in out and "weight_bytes" in self.info:
            out["weights"] = self.info["weight_bytes"]
        out.update(_mlx_figures())
        out["pool_released_bytes"] = self.info.get("pool_released_bytes", 0)
        try:
            import psutil
            out["rss"] = psutil.Process().memory_info().rss
        except Exception:
            pass
        return out


class JSONHandler(BaseHTTPRequestHandler):
    """The JSON plumbing of the runner's and the server's handlers: replies, and request bodies
    bounded by `_body_limit()` (a BadRequest with 411/413 otherwise)."""

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


class RunnerHandler(JSONHandler):
    server_version = "impl-runner/0.1"
    state: RunnerState  # set on the subclass

    def log_message(self, fmt, *a):  # keep stderr for real diagnostics
        if os.environ.get("IMPL_RUNNER_VERBOSE"):
            super().log_message(fmt, *a)

    def _body_limit(self) -> int:
        return self.state.args.max_body_bytes

    def do_GET(self):
        st = self.state
        url = urlparse(self.path)
        try:
            if url.path == "/health":
                self._send_json(200, {"status": st.status, "model": st.args.model, "pid": os.getpid()})
            elif url.path == "/memory":
                self._send_json(200, st.memory())
            elif url.path == "/trie":
                if st.engine is None:
                    raise BadRequest("model is still loading", 503)
                fmt = parse_qs(url.query).get("format", ["text"])[0]
                with st.engine_lock:
                    if fmt == "json":
                        self._send_json(200, _jsonable(st.engine.dump_json()))
                        return
                    text = st.engine.dump()
                data = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._send_json(404, {"error": f"no such endpoint: GET {url.path}"})
        except BadRequest as e:
            self._send_json(e.status, {"error": str(e)})

    def do_POST(self):
        url = urlparse(self.path)
        if url.path != "/generate":
            self._send_json(404, {"error": f"no such endpoint: POST {url.path}"})
            return
        try:
            body = self._read_body()
            req = validate_generate(body, self.state.args.max_prompt_tokens, self.state.args.max_new_tokens)
            if self.state.engine is None:
                raise BadRequest("model is still loading", 503)
        except BadRequest as e:
            self.close_connection = True
            self._send_json(e.status, {"error": str(e)})
            return
        self._generate(req)

    def _client_gone(self) -> bool:
        """True once the peer closed its end (EOF readable without blocking)."""
        if not self._gone and peer_gone(self.connection):
            self._gone = True
        return self._gone

    def _write_line(self, obj) -> None:
        if self._gone:
            return
        if not self._headers_sent:
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.end_headers()
            self._headers_sent = True
        try:
            self.wfile.write((json.dumps(obj) + "\n").encode())
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._gone = True

    def _generate(self, req: dict) -> None:
        st = self.state
        self._gone = False
        self._headers_sent = False
        self.close_connection = True
        text = TextStream(st.tokenizer)
        stream = req["stream"]

        def on_token(tok):
            piece = text.push(int(tok))
            if stream:
                self._write_line({"token": int(tok), "text": piece})

        t0 = time.monotonic()
        with st.engine_lock:
            if self._client_gone():
                return
            try:
                result = st.engine.generate(req["prompt"], req["max_tokens"], media=tuple(req["media"]),
                                            cancel=self._client_gone, on_token=on_token)
            except (ValueError, TypeError, KeyError) as e:
                if not self._headers_sent:
                    self._send_json(400, {"error": f"bad request for this model: {e}"})
                else:
                    self._write_line({"error": f"bad request for this model: {e}"})
                return
            except Exception as e:  # an engine fault: report it, keep serving
                traceback.print_exc()
                if not self._headers_sent:
                    self._send_json(500, {"error": f"engine error: {type(e).__name__}: {e}"})
                else:
                    self._write_line({"error": f"engine error: {type(e).__name__}: {e}"})
                return
        tokens = [int(t) for t in getattr(result, "tokens", [])]
        final = {"done": True, "tokens": tokens, "text": text.sent + text.flush(),
                 "stats": _jsonable(getattr(result, "stats", {})),
                 "cancelled": bool(getattr(result, "cancelled", False)) or self._gone,
                 "seconds": round(time.monotonic() - t0, 6)}
        self._write_line(final)


def _watch_stdin() -> None:
    """Exit when the parent goes away (its end of our stdin pipe closes)."""
    try:
        while sys.stdin.buffer.read(1 << 12):
            pass
    except Exception:
        pass
    os._exit(0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m impl.runner", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--engine", choices=("real", "fake"), default="real")
    p.add_argument("--budget-bytes", type=int, default=None)
    p.add_argument("--max-prompt-tokens", type=int, default=32768)
    p.add_argument("--max-new-tokens", type=int, default=4096)
    p.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    p.add_argument("--watch-stdin", action="store_true", help="exit when stdin closes (parent died)")
    p.add_argument("--ignore-signals", action="store_true", help="(tests) ignore SIGINT and SIGTERM")
    p.add_argument("--fake-weight-bytes", type=int, default=1 << 20)
    p.add_argument("--fake-token-delay", type=float, default=0.0)
    p.add_argument("--fake-load-delay", type=float, default=0.0)
    p.add_argument("--fake-fail-load", action="store_true")
    p.add_argument("--fake-mlx", action="store_true", help="fake weights as MLX arrays built by a transform")
    args = p.parse_args(argv)

    if not is_loopback(args.host):
        print(f"runner: refusing to bind {args.host!r}: loopback addresses only", file=sys.stderr)
        return 2
    if args.ignore_signals:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    if args.watch_stdin:
        threading.Thread(target=_watch_stdin, daemon=True, name="stdin-watch").start()

    state = RunnerState(args)
    handler = type("BoundRunnerHandler", (RunnerHandler,), {"state": state})
    ThreadingHTTPServer.daemon_threads = True
    httpd = ThreadingHTTPServer((args.host, args.port), handler)
    _emit({"event": "port", "port": httpd.server_address[1], "pid": os.getpid()})
    threading.Thread(target=httpd.serve_forever, daemon=True, name="http").start()

    try:
        engine, tokenizer, info = load_engine(args)
    except Exception as e:
        traceback.print_exc()
        _emit({"event": "error", "error": f"{type(e).__name__}: {e}"})
        return 3
    state.engine, state.tokenizer, state.info = engine, tokenizer, info
    state.status = "ok"
    _emit({"event": "ready", "memory": state.memory()})
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
