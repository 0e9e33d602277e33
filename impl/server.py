"""The local server: JSON over loopback HTTP in front of a Scheduler.

    python -m impl serve [--host 127.0.0.1] [--port 11435] [--engine real|MODULE:FACTORY]

Binds only to loopback addresses (anything else is refused). Endpoints:
    GET  /api/health
    POST /api/generate  {"model", "prompt": [ids] | [{"role","content"}...], "max_tokens", "stream"}
                        streams NDJSON ({"token","text"} lines, then {"done": true, "tokens",
                        "text", "stats", "model"}); "stream": false answers one JSON object.
                        A client that hangs up cancels the generation in the runner.
    GET  /api/ps        loaded models with their memory
    GET  /api/trie?model=NAME[&format=json]   the model's trie dump
    POST /api/unload    {"model"}
Bad input is answered 4xx with {"error": message} before the scheduler is touched.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
from http.server import ThreadingHTTPServer
from typing import Optional
from urllib.parse import parse_qs, urlparse

from impl.client import RunnerDied, RunnerError, RunnerRequestError
from impl.httpio import MAX_BODY_BYTES, BadRequest, JSONHandler, is_loopback, validate_generate
from impl.scheduler import Scheduler, SchedulerError

DEFAULT_PORT = 11435


class ServerHandler(JSONHandler):
    server_version = "impl-server/0.1"
    scheduler: Scheduler
    limits: dict

    def log_message(self, fmt, *a):
        if self.limits.get("verbose"):
            super().log_message(fmt, *a)

    # ------------------------------------------------------------ plumbing
    def _body_limit(self) -> int:
        return self.limits["max_body_bytes"]

    @staticmethod
    def _model_field(obj) -> str:
        if not isinstance(obj, dict):
            raise BadRequest("request body must be a JSON object")
        if "model" not in obj:
            raise BadRequest("missing field 'model'")
        model = obj["model"]
        if not isinstance(model, str) or not model.strip():
            raise BadRequest("'model' must be a non-empty string")
        return model

    def _error(self, exc: BaseException) -> None:
        if isinstance(exc, BadRequest):
            status, msg = exc.status, str(exc)
        elif isinstance(exc, SchedulerError):
            status, msg = exc.status, str(exc)
        elif isinstance(exc, RunnerRequestError):
            status, msg = exc.status, exc.message
        elif isinstance(exc, RunnerDied):
            status, msg = 502, str(exc)
        elif isinstance(exc, RunnerError):
            status, msg = 502, str(exc)
        else:
            status, msg = 500, f"{type(exc).__name__}: {exc}"
        self.close_connection = True
        self._send_json(status, {"error": msg})

    # ------------------------------------------------------------ routes
    def do_GET(self):
        url = urlparse(self.path)
        q = parse_qs(url.query)
        try:
            if url.path == "/api/health":
                self._send_json(200, {"status": "ok"})
            elif url.path == "/api/ps":
                self._send_json(200, {"models": self.scheduler.loaded()})
            elif url.path == "/api/trie":
                model = q.get("model", [""])[0]
                if not model:
                    raise BadRequest("missing query parameter 'model'")
                fmt = q.get("format", ["text"])[0]
                if fmt not in ("text", "json"):
                    raise BadRequest("'format' must be 'text' or 'json'")
                dump = self.scheduler.trie(model, fmt)
                if fmt == "json":
                    self._send_json(200, {"model": model, "trie": dump})
                else:
                    self._send_json(200, {"model": model, "dump": dump})
            else:
                raise BadRequest(f"no such endpoint: GET {url.path}", 404)
        except Exception as e:
            self._error(e)

    def do_POST(self):
        url = urlparse(self.path)
        try:
            if url.path == "/api/generate":
                body = self._read_body()
                try:
                    obj = json.loads(body)
                except (ValueError, UnicodeDecodeError) as e:
                    raise BadRequest(f"malformed JSON: {e}")
                model = self._model_field(obj)
                req = validate_generate(body, self.limits["max_prompt_tokens"], self.limits["max_new_tokens"])
                if not self.scheduler.known_model(model):
                    raise BadRequest(f"unknown model {model!r}", 404)
                self._generate(model, req)
            elif url.path == "/api/unload":
                try:
                    obj = json.loads(self._read_body())
                except (ValueError, UnicodeDecodeError) as e:
                    raise BadRequest(f"malformed JSON: {e}")
                model = self._model_field(obj)
                self._send_json(200, {"model": model, "unloaded": self.scheduler.unload(model)})
            else:
                raise BadRequest(f"no such endpoint: POST {url.path}", 404)
        except Exception as e:
            if getattr(self, "_headers_sent", False):
                self._write_line({"error": str(e)})
            else:
                self._error(e)

    def _generate(self, model: str, req: dict) -> None:
        self._start_stream()
        stream = req["stream"]

        def on_token(msg):
            if stream:
                self._write_line(msg)

        result = self.scheduler.generate(model, req["prompt"], req["max_tokens"], media=req["media"],
                                         on_token=on_token, cancel=self._client_gone)
        result = dict(result, model=model)
        if stream:
            self._write_line(result)
        else:
            self._send_json(200, result)


def make_server(scheduler: Scheduler, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
                max_prompt_tokens: int = 32768, max_new_tokens: int = 4096,
                max_body_bytes: int = MAX_BODY_BYTES, verbose: bool = False) -> ThreadingHTTPServer:
    if not is_loopback(host):
        raise ValueError(f"refusing to bind {host!r}: the server listens on loopback addresses only")
    handler = type("BoundServerHandler", (ServerHandler,), {
        "scheduler": scheduler,
        "limits": {"max_prompt_tokens": max_prompt_tokens, "max_new_tokens": max_new_tokens,
                   "max_body_bytes": max_body_bytes, "verbose": verbose}})
    cls = type("LoopbackServer", (ThreadingHTTPServer,), {"daemon_threads": True})
    if ":" in host:
        import socket
        cls.address_family = socket.AF_INET6
    return cls((host, port), handler)


def serve(host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, engine: str = "real",
          budget_bytes: Optional[int] = None, device_bytes: Optional[int] = None,
          max_prompt_tokens: int = 32768, verbose: bool = False) -> int:
    kwargs = {}
    if device_bytes is not None:
        kwargs["device_total"] = lambda: device_bytes
    try:
        scheduler = Scheduler(engine=engine, budget_bytes=budget_bytes, **kwargs)
        httpd = make_server(scheduler, host, port, max_prompt_tokens=max_prompt_tokens, verbose=verbose)
    except ValueError as e:
        print(f"serve: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    t = threading.Thread(target=httpd.serve_forever, daemon=True, name="serve")
    t.start()
    print(f"listening on http://{host}:{httpd.server_address[1]} (engine {engine})", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        httpd.shutdown()
        httpd.server_close()
        scheduler.close()   # R1: every runner killed and reaped before we exit
        print("server stopped; runners closed", flush=True)
    return 0
