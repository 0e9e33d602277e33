"""A runner process: one model, one Engine, served over loopback HTTP (REFERENCE.md F1, R1, A3).

    python -m serve.runner --model NAME [--port 0] [--engine real|MODULE:FACTORY]
                             [--cache-budget SIZE]

Start-up protocol on stdout, one JSON object per line:
    {"event": "port", "port": N, "pid": P}    as soon as the socket is bound (before loading)
    {"event": "ready", "memory": {...}}       once the model is loaded and the pool released
    {"event": "error", "error": "..."}        if loading failed (the process then exits 3)
Diagnostics go to stderr.

Endpoints (JSON; errors are {"error": message} with a 4xx/5xx status):
    GET  /health     {"status": "loading"|"ok", "model", "pid"}
    GET  /memory     weights, live caches, paged-out, MLX active/cache/peak, process RSS, and the
                     full GC passes run at idle or past the backstop ("gc": serve/collector.py)
    GET  /trie       the engine's trie dump as text (?format=json: engine.dump_json())
    POST /generate   {"prompt": [ids] | [{"role", "content"}...] | "raw text", "max_tokens": N,
                      "stream": bool, "options": {"temperature", "seed", "stop"}, "boundaries": [int]}
                     streams NDJSON: {"token", "text"} per token (text held back while it may
                     start a stop string; a last {"text"} line with what was held), then
                     {"done": true, "tokens", "text", "stats", "done_reason": stop|length|cancel,
                     "prompt_tokens", "prompt_eval_s", "eval_s", "seconds"}; a client that goes
                     away cancels the generation. A string prompt is tokenised here, as is;
                     temperature > 0 samples with a seeded sampler (serve/decoding.py);
                     ``boundaries`` go to an engine whose generate() takes them, else 400.

The prefix-cache budget is resolved once the model is loaded (serve/budget.py): --cache-budget,
else $PREFIX_CACHE_BUDGET, else 25% of the memory then free; /memory reports it with its rule.

A3: after the weights are loaded and evaluated the allocator's free pool is released
(``mx.clear_cache()``), so an idle runner holds its weights and nothing more; /memory reports
the pool size that was released (``pool_released_bytes``).

The main thread makes every engine call (load, generate, memory, trie): HTTP handlers hand it the
call and wait (``RunnerState.on_engine``). With MLX >= 0.32 each thread has its own default stream:
lazy arrays made on one thread fail on another, and on the CUDA backend arrays made on a thread that
has since ended abort the process when they are freed (docs/platform.md, 2026-12-04). Cached state
outlives the request that made it, so it must be made on a thread that outlives every request.

``--engine`` picks the engine: the real one or a test double (serve/engines.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import queue
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import Future
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from impl.platform import apply_device_env
from serve import budget as budgets
from serve.collector import IdleCollector
from serve.decoding import StopMatcher, TextStream, make_sampler
from serve.engines import engine_arg, load_engine, mlx_figures
from serve.httpio import MAX_BODY_BYTES, BadRequest, JSONHandler, is_loopback, validate_generate

__all__ = ["TextStream", "load_engine", "main"]


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


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
        self.engine_lock = threading.Lock()      # one request at a time; /memory waits 0.2 s for it
        self.last_engine_memory: dict = {}
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self.collector = IdleCollector()          # full GC passes between calls, at idle (serve/collector.py)

    def on_engine(self, fn):
        """Run ``fn()`` on the main thread and return its result (its exception is raised here)."""
        if threading.current_thread() is threading.main_thread():
            return fn()
        done: Future = Future()
        self._calls.put((fn, done))
        return done.result()

    def serve_engine(self) -> None:
        """The main thread's loop once the engine is loaded: make each handed call in turn. Python's
        full collections run here only, never inside a call: when no call has come for the collector's
        quiet time, or between calls past its backstop (serve/collector.py)."""
        self.collector.install()
        while True:
            try:
                fn, done = self._calls.get(timeout=self.collector.quiet_s)
            except queue.Empty:
                self.collector.idle()
                fn, done = self._calls.get()
            try:
                done.set_result(fn())
            except Exception as e:
                done.set_exception(e)
            self.collector.after_call()

    def memory(self) -> dict:
        out: dict = {"model": self.args.model, "pid": os.getpid(), "status": self.status}
        eng: dict = {}
        if self.engine is not None:
            if self.engine_lock.acquire(timeout=0.2):
                try:
                    eng = self.on_engine(lambda: _jsonable(self.engine.memory()))
                    self.last_engine_memory = eng
                finally:
                    self.engine_lock.release()
            else:
                eng = dict(self.last_engine_memory, busy=True)
        out.update(eng)
        if "budget" in self.info:
            out.setdefault("budget", self.info["budget"])
            out["budget_rule"] = self.info["budget_rule"]
        if "weights" not in out and "weight_bytes" in self.info:
            out["weights"] = self.info["weight_bytes"]
        out.update(mlx_figures())
        out["gc"] = self.collector.stats()
        out["pool_released_bytes"] = self.info.get("pool_released_bytes", 0)
        try:
            import psutil
            out["rss"] = psutil.Process().memory_info().rss
        except Exception:
            pass
        return out


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
                        self._send_json(200, st.on_engine(lambda: _jsonable(st.engine.dump_json())))
                        return
                    text = st.on_engine(st.engine.dump)
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

    def _engine_kwargs(self, req: dict) -> dict:
        """Sampler and boundaries, for an engine whose generate() takes them (400 otherwise)."""
        params = inspect.signature(self.state.engine.generate).parameters
        kwargs = {}
        opts = req["options"]
        sampler = make_sampler(opts["temperature"], opts["seed"])
        if sampler is not None:
            if "sampler" not in params:
                raise BadRequest("this engine samples greedily only: 'temperature' must be 0")
            kwargs["sampler"] = sampler
        if req["boundaries"] is not None:
            if "boundaries" not in params:
                raise BadRequest("this engine does not take 'boundaries'")
            kwargs["boundaries"] = list(req["boundaries"])
        return kwargs

    def _prompt(self, prompt):
        """A string prompt is raw text: tokenised here, without any template."""
        if not isinstance(prompt, str):
            return prompt
        tok = self.state.tokenizer
        if tok is None or not hasattr(tok, "encode"):
            raise BadRequest("this model has no tokenizer: send token ids")
        ids = [int(t) for t in tok.encode(prompt)]
        if not ids:
            raise BadRequest("the prompt encodes to no tokens")
        if len(ids) > self.state.args.max_prompt_tokens:
            raise BadRequest(f"prompt has {len(ids)} tokens; the limit is {self.state.args.max_prompt_tokens}", 413)
        return ids

    def _fail(self, status: int, msg: str) -> None:
        if not self._headers_sent:
            self._send_json(status, {"error": msg})
        else:
            self._write_line({"error": msg})

    def _generate(self, req: dict) -> None:
        st = self.state
        self._start_stream()
        text = TextStream(st.tokenizer)
        stops = StopMatcher(req["options"]["stop"])
        stream = req["stream"]
        first: list = []

        def on_token(tok):
            if not first:
                first.append(time.monotonic())
            shown = stops.push(text.push(int(tok)))
            if stream:
                self._write_line({"token": int(tok), "text": shown})

        def cancel():
            return stops.stopped or self._client_gone()

        t0 = time.monotonic()
        with st.engine_lock:
            if self._client_gone():
                return
            t1 = time.monotonic()
            def run():               # on the main thread (on_engine); only plain data leaves it
                kwargs = self._engine_kwargs(req)
                prompt = self._prompt(req["prompt"])
                result = st.engine.generate(prompt, req["max_tokens"], media=tuple(req["media"]),
                                            cancel=cancel, on_token=on_token, **kwargs)
                return ([int(t) for t in getattr(result, "tokens", [])],
                        _jsonable(getattr(result, "stats", {})), getattr(result, "prompt_tokens", 0))
            try:
                tokens, stats, prompt_tokens = st.on_engine(run)
            except BadRequest as e:
                self._fail(e.status, str(e))
                return
            except (ValueError, TypeError, KeyError) as e:
                self._fail(400, f"bad request for this model: {e}")
                return
            except Exception as e:  # an engine fault: report it, keep serving
                traceback.print_exc()
                self._fail(500, f"engine error: {type(e).__name__}: {e}")
                return
            t2 = time.monotonic()
        tail = stops.push(text.flush()) + stops.flush()
        if stream and tail:
            self._write_line({"text": tail})
        eos = getattr(st.tokenizer, "eos_token_id", None)
        if stops.stopped or (tokens and tokens[-1] == eos):
            reason = "stop"
        elif len(tokens) >= req["max_tokens"]:
            reason = "length"
        else:
            reason = "cancel"
        t_first = first[0] if first else t2
        final = {"done": True, "tokens": tokens, "text": stops.text, "stats": stats,
                 "cancelled": reason == "cancel" or self._gone, "done_reason": reason,
                 "prompt_tokens": int(prompt_tokens or stats.get("total", 0)),
                 "prompt_eval_s": round(t_first - t1, 6), "eval_s": round(t2 - t_first, 6),
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
    p = argparse.ArgumentParser(prog="python -m serve.runner", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--engine", default="real", type=engine_arg,
                   help="real (impl.models + impl.engine), or MODULE:FACTORY (see above)")
    p.add_argument("--cache-budget", "--budget-bytes", dest="cache_budget", default=None,
                   help=f"prefix-cache budget (bytes or 512MiB, 2GB...); default: {budgets.DEFAULT_FRACTION * 100:.0f}%% "
                        f"of the memory free once the weights are loaded, or ${budgets.ENV}")
    p.add_argument("--max-prompt-tokens", type=int, default=32768)
    p.add_argument("--max-new-tokens", type=int, default=4096)
    p.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    p.add_argument("--watch-stdin", action="store_true", help="exit when stdin closes (parent died)")
    args, extra = p.parse_known_args(argv)
    if extra and args.engine == "real":
        p.error(f"unrecognized arguments: {' '.join(extra)}")

    if not is_loopback(args.host):
        print(f"runner: refusing to bind {args.host!r}: loopback addresses only", file=sys.stderr)
        return 2
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
        apply_device_env()
        engine, tokenizer, info = load_engine(args, extra)
        info["budget"], info["budget_rule"] = budgets.resolve(args.cache_budget)
        if hasattr(engine, "set_budget"):
            engine.set_budget(info["budget"])
    except Exception as e:
        traceback.print_exc()
        _emit({"event": "error", "error": f"{type(e).__name__}: {e}"})
        return 3
    state.engine, state.tokenizer, state.info = engine, tokenizer, info
    state.status = "ok"
    _emit({"event": "ready", "memory": state.memory()})
    try:
        state.serve_engine()
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
