"""The local server: Ollama's REST API over loopback HTTP, in front of a Scheduler (docs/server.md).

    python -m serve [--host 127.0.0.1] [--port 11435] [--engine real|MODULE:FACTORY]
                         [--cache-budget SIZE] [--keep-alive 5m]

Binds only to loopback addresses (anything else is refused). Ollama's endpoints:
    POST /api/chat, /api/generate   NDJSON streams (or one object with "stream": false); the last
                                    object carries Ollama's counts and durations, and our
                                    per-request reuse in "x_prefix_cache". A client that hangs
                                    up cancels the generation in the runner.
    GET  /api/tags, /api/ps, /api/version, POST /api/show, GET|HEAD /
Ours, under /x/ (no clash with Ollama's names):
    GET  /x/trie?model=NAME[&format=json]   the model's trie dump
    POST /x/unload {"model"}                unload now (also: keep_alive 0)
    GET  /x/health
OpenAI's POST /v1/chat/completions and GET /v1/models: serve/openai_api.py.
Bad input is answered with Ollama's {"error": message} and a 4xx status before the scheduler
is touched (serve/ollama_api.py).
"""
from __future__ import annotations

import json
import math
import signal
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Optional, Sequence
from urllib.parse import parse_qs, urlparse

from serve import ollama_api as api, openai_api
from serve.client import RunnerError, RunnerRequestError
from serve.httpio import MAX_BODY_BYTES, BadRequest, JSONHandler, is_loopback
from serve.scheduler import Scheduler, SchedulerError

DEFAULT_PORT = 11435          # Ollama's 11434 + 1: runs beside a real Ollama; clients: OLLAMA_HOST=127.0.0.1:11435
VERSION = "0.1.0"


class ServerState:
    """What the handlers share: the scheduler, the limits, the model list and keep-alive."""

    def __init__(self, scheduler: Scheduler, limits: dict, models: Optional[Sequence[str]], keep_alive: float):
        self.scheduler, self.limits, self.models, self.keep_alive = scheduler, limits, models, keep_alive
        self._lock = threading.Lock()
        self._active: dict[str, int] = {}
        self._expires: dict[str, float] = {}       # model -> monotonic deadline (inf: never)
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, daemon=True, name="keep-alive")
        self._reaper.start()

    def begin(self, name: str) -> None:
        with self._lock:
            self._active[name] = self._active.get(name, 0) + 1
            self._expires.pop(name, None)

    def end(self, name: str, keep_alive: Optional[float]) -> None:
        ka = self.keep_alive if keep_alive is None else keep_alive
        with self._lock:
            self._active[name] -= 1
            if not self._active[name]:
                self._expires[name] = time.monotonic() + ka

    def expires_at(self, name: str) -> str:
        with self._lock:
            if self._active.get(name) or name not in self._expires:
                return api.stamp_in(self.keep_alive)
            return api.stamp_in(self._expires[name] - time.monotonic())

    def _reap(self) -> None:
        """Unload a model whose keep-alive ran out while no request used it."""
        while not self._stop.wait(0.25):
            now = time.monotonic()
            with self._lock:
                due = [n for n, t in self._expires.items() if t <= now and not self._active.get(n)]
                for n in due:
                    del self._expires[n]
            for n in due:
                try:
                    self.scheduler.unload(n)
                except Exception as e:  # keep reaping the others
                    print(f"keep-alive: unloading {n!r} failed: {e}", file=sys.stderr)

    def load_seconds(self, name: str, since: float) -> float:
        """Time this request waited for ``name`` to load (from the scheduler's events)."""
        start = None
        for t, kind, n, _extra in list(self.scheduler.events):
            if n != name or t < since:
                continue
            if kind == "load_start":
                start = t
            elif kind == "load_done" and start is not None:
                return t - start
        return 0.0

    def close(self) -> None:
        self._stop.set()


def status_of(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and message an exception is answered with."""
    if isinstance(exc, (BadRequest, SchedulerError)):
        return exc.status, str(exc)
    if isinstance(exc, RunnerRequestError):
        return exc.status, exc.message
    if isinstance(exc, RunnerError):        # RunnerDied included
        return 502, str(exc)
    return 500, f"{type(exc).__name__}: {exc}"


class ServerHandler(JSONHandler):
    status_of = staticmethod(status_of)     # the one mapping of exceptions to answers (serve/openai_api.py too)
    server_version = "impl-server/0.1"
    protocol_version = "HTTP/1.0"
    app: ServerState

    def log_message(self, fmt, *a):
        if self.app.limits.get("verbose"):
            super().log_message(fmt, *a)

    def _body_limit(self) -> int:
        return self.app.limits["max_body_bytes"]

    def _json_body(self) -> dict:
        body = self._read_body()          # 411/413 raised here, not as malformed JSON
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"malformed JSON: {e}")
        if not isinstance(obj, dict):
            raise BadRequest("request body must be a JSON object")
        return obj

    def _model_field(self, obj: dict, known: bool = True) -> str:
        model = obj.get("model", obj.get("name"))
        if model is None:
            raise BadRequest("missing field 'model'")
        if not isinstance(model, str) or not model.strip():
            raise BadRequest("'model' must be a non-empty string")
        if known and not self.app.scheduler.known_model(model):
            raise BadRequest(f'model "{model}" not found, try pulling it first', 404)
        return model

    def _error(self, exc: BaseException) -> None:
        status, msg = status_of(exc)
        if getattr(self, "_headers_sent", False):
            self._write_line({"error": msg})
            return
        self.close_connection = True
        self._send_json(status, {"error": msg})

    # ------------------------------------------------------------ routes
    def do_HEAD(self):
        self.send_response(200 if urlparse(self.path).path == "/" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        url = urlparse(self.path)
        q = parse_qs(url.query)
        try:
            if url.path == "/":
                data = b"Ollama is running"      # what clients probe for (our server, its API)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif url.path == "/api/version":
                self._send_json(200, {"version": VERSION})
            elif url.path == "/api/tags":
                self._send_json(200, {"models": self._tags()})
            elif url.path == "/api/ps":
                self._send_json(200, {"models": self._ps()})
            elif url.path == "/x/health":
                self._send_json(200, {"status": "ok"})
            elif url.path == "/x/trie":
                self._trie(q)
            elif url.path == "/v1/models":
                self._send_json(200, openai_api.models(self._tags()))
            else:
                raise BadRequest(f"no such endpoint: GET {url.path}", 404)
        except Exception as e:
            self._error(e)

    def do_POST(self):
        path = urlparse(self.path).path
        try:
            if path in ("/api/chat", "/api/generate"):
                kind = "chat" if path == "/api/chat" else "generate"
                obj = self._json_body()
                model = self._model_field(obj, known=False)
                check = api.check_chat if kind == "chat" else api.check_generate
                req = check(obj, self.app.limits)
                self._model_field(obj)
                if req["prompt"] is None:
                    self.app.scheduler.unload(model)
                    self._send_json(200, api.unloaded(kind, model))
                else:
                    self._generate(kind, model, req)
            elif path == "/api/show":
                model = self._model_field(self._json_body())
                self._send_json(200, api.show(model))
            elif path == "/x/unload":
                model = self._model_field(self._json_body(), known=False)
                self._send_json(200, {"model": model, "unloaded": self.app.scheduler.unload(model)})
            elif path == "/v1/chat/completions":
                openai_api.handle(self)
            else:
                raise BadRequest(f"no such endpoint: POST {path}", 404)
        except Exception as e:
            self._error(e)

    # ------------------------------------------------------------ pieces
    def run(self, model: str, req: dict, on_text) -> tuple[dict, float, float]:
        """One generation with keep-alive bookkeeping: (runner's final line, total s, load s)."""
        app = self.app
        t0 = time.monotonic()
        self._start_stream()
        extra = {"options": req["options"]}
        if req.get("boundaries") is not None:
            extra["boundaries"] = req["boundaries"]

        def on_token(msg):
            if msg.get("text"):
                on_text(msg["text"])

        app.begin(model)
        try:
            result = app.scheduler.generate(model, req["prompt"], req["max_tokens"], on_token=on_token,
                                            cancel=self._client_gone, **extra)
        finally:
            app.end(model, req.get("keep_alive"))
        total, load = time.monotonic() - t0, app.load_seconds(model, t0)
        if req.get("keep_alive") == 0:
            app.scheduler.unload(model)
        return result, total, load

    def _generate(self, kind: str, model: str, req: dict) -> None:
        stream = req["stream"]

        def on_text(piece):
            if stream:
                self._write_line(api.chunk(kind, model, piece))

        result, total, load = self.run(model, req, on_text)
        out = api.final(kind, model, result, total_s=total, load_s=load, text="" if stream else result.get("text", ""))
        if stream:
            self._write_line(out)
        else:
            self._send_json(200, out)

    def _tags(self) -> list:
        sched = self.app.scheduler
        names = list(self.app.models) if self.app.models is not None else [m[0] for m in sched.snapshot()]
        out = []
        for n in names:
            try:
                size = int(sched.required(n))
            except Exception:
                size = 0
            out.append({"name": n, "model": n, "modified_at": api.now_stamp(), "size": size, "digest": "",
                        "details": api.details(n)})
        return out

    def _ps(self) -> list:
        out = []
        for m in self.app.scheduler.loaded():
            mem, name = m.get("memory", {}), m["model"]
            out.append({"name": name, "model": name, "size": m.get("bytes", 0), "size_vram": 0, "digest": "",
                        "details": api.details(name), "expires_at": self.app.expires_at(name),
                        "x_pid": m.get("pid"), "x_idle": m.get("idle"),
                        "x_prefix_cache": {k: mem.get(k) for k in ("budget", "budget_rule", "paged_out",
                                                                     "live_caches", "weights")},
                        "x_memory": mem})
        return out

    def _trie(self, q: dict) -> None:
        model = q.get("model", [""])[0]
        if not model:
            raise BadRequest("missing query parameter 'model'")
        fmt = q.get("format", ["text"])[0]
        if fmt not in ("text", "json"):
            raise BadRequest("'format' must be 'text' or 'json'")
        dump = self.app.scheduler.trie(model, fmt)
        self._send_json(200, {"model": model, ("trie" if fmt == "json" else "dump"): dump})


def make_server(scheduler: Scheduler, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
                max_prompt_tokens: int = 32768, max_new_tokens: int = 4096,
                max_body_bytes: int = MAX_BODY_BYTES, verbose: bool = False,
                models: Optional[Sequence[str]] = None, keep_alive: float = 300.0) -> ThreadingHTTPServer:
    """``models``: what /api/tags lists (None: the loaded ones); ``keep_alive``: seconds a model
    stays loaded after its last request when the request does not say (Ollama's 5 minutes)."""
    if not is_loopback(host):
        raise ValueError(f"refusing to bind {host!r}: the server listens on loopback addresses only")
    app = ServerState(scheduler, {"max_prompt_tokens": max_prompt_tokens, "max_new_tokens": max_new_tokens,
                                  "max_body_bytes": max_body_bytes, "verbose": verbose}, models, keep_alive)
    handler = type("BoundServerHandler", (ServerHandler,), {"app": app})

    def server_close(self):
        app.close()
        ThreadingHTTPServer.server_close(self)

    cls = type("LoopbackServer", (ThreadingHTTPServer,), {"daemon_threads": True, "server_close": server_close})
    if ":" in host:
        import socket
        cls.address_family = socket.AF_INET6
    return cls((host, port), handler)


def serve(host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, engine: str = "real",
          cache_budget: Optional[str] = None, device_bytes: Optional[int] = None,
          max_prompt_tokens: int = 32768, verbose: bool = False, keep_alive: str = "5m") -> int:
    from serve import budget as budgets
    kwargs = {}
    if device_bytes is not None:
        kwargs["device_total"] = lambda: device_bytes
    try:
        ka = api.parse_keep_alive(keep_alive)
        got = budgets.explicit_budget(cache_budget)
        if got is not None:
            budgets.check_fits(*got)
        scheduler = Scheduler(engine=engine, budget_bytes=got[0] if got else None, **kwargs)
        models = None
        if engine == "real":
            from impl.models import MODEL_NAMES
            models = MODEL_NAMES
        httpd = make_server(scheduler, host, port, max_prompt_tokens=max_prompt_tokens, verbose=verbose,
                            models=models, keep_alive=ka if ka is not None else 300.0)
    except (ValueError, BadRequest) as e:
        print(f"serve: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    t = threading.Thread(target=httpd.serve_forever, daemon=True, name="serve")
    t.start()
    rule = (f"{got[0]} bytes from {got[1]}" if got else
            f"{budgets.DEFAULT_FRACTION:.0%} of the memory free when each model loads")
    ka_text = "forever" if ka == math.inf else keep_alive
    print(f"listening on http://{host}:{httpd.server_address[1]} (engine {engine}; cache budget: {rule}; "
          f"keep-alive {ka_text})", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        httpd.shutdown()
        httpd.server_close()
        scheduler.close()   # R1: every runner killed and reaped before we exit
        print("server stopped; runners closed", flush=True)
    return 0
