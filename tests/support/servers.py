"""A server over fake-engine runner processes, for the HTTP API tests (tests/serve/test_ollama_api.py,
tests/serve/test_api_errors.py, tests/serve/test_server.py)."""
from __future__ import annotations

import contextlib
import http.client
import json
import threading

from serve.client import RunnerClient
from serve.scheduler import Scheduler
from serve.server import make_server
from tests.support.fake_engine import FAKE_ENGINE

GiB = 1 << 30
MiB = 1 << 20


@contextlib.contextmanager
def fake_server(sizes: dict, *, token_delay: float = 0.02, runner_args=(), env=None, **server_kw):
    """Yields (port, scheduler): a loopback server whose models are ``sizes`` (name -> weight
    bytes), each served by a fake-engine runner process."""

    def factory(name):
        return RunnerClient(name, engine=FAKE_ENGINE, load_timeout=30, env=env,
                            runner_args=["--fake-weight-bytes", str(sizes[name]),
                                         "--fake-token-delay", str(token_delay), *runner_args])

    sched = Scheduler(factory, device_total=lambda: 10 * GiB, system_free=lambda: 10 * GiB,
                      required_bytes=lambda n: sizes[n], known_model=lambda n: n in sizes)
    server_kw.setdefault("models", sorted(sizes))
    httpd = make_server(sched, "127.0.0.1", 0, **server_kw)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield httpd.server_address[1], sched
    finally:
        httpd.shutdown()
        httpd.server_close()
        sched.close()


def call(port, method, path, body=None, raw=None, timeout=30):
    """(status, body bytes) of one request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def lines(data: bytes) -> list:
    return [json.loads(x) for x in data.splitlines() if x.strip()]


def state(port, sched, model: str = "a"):
    """What a bad request must not change: the scheduler's table and decisions, and the model's
    runner state (its trie) when loaded."""
    table = sorted((n, m) for n, _i, _t, m in sched.snapshot())
    trie = json.loads(call(port, "GET", f"/x/trie?model={model}&format=json")[1])
    return table, len(sched.decisions), trie
