"""Server over loopback HTTP (fake-engine runners): endpoints, bad input -> 4xx with no state
change, cancellation when the HTTP client goes away, loopback-only binding, the CLI."""
from __future__ import annotations

import faulthandler
import http.client
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from impl.chat import chat
from impl.client import RunnerClient, runner_env, runner_processes
from impl.scheduler import Scheduler
from impl.server import make_server
from tests.support.fake_engine import FAKE_ENGINE

GiB = 1 << 30
MiB = 1 << 20




@pytest.fixture(autouse=True)
def bounded():
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module", autouse=True)
def clean_at_the_end():
    yield
    left = runner_processes()
    for p in left:
        p.kill()
    assert not left, f"runner processes survived the module: {left}"


@pytest.fixture(scope="module")
def server():
    """One server for the module (its runner stays loaded between tests, as a server's would)."""
    sizes = {"a": 2 * MiB, "b": 3 * MiB}

    def factory(name):
        return RunnerClient(name, engine=FAKE_ENGINE, load_timeout=30,
                            runner_args=["--fake-weight-bytes", str(sizes[name]), "--fake-token-delay", "0.02"])
    sched = Scheduler(factory, device_total=lambda: 10 * GiB, system_free=lambda: 10 * GiB,
                      required_bytes=lambda n: sizes[n], known_model=lambda n: n in sizes)
    httpd = make_server(sched, "127.0.0.1", 0, max_prompt_tokens=64, max_body_bytes=4096)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield httpd.server_address[1], sched
    httpd.shutdown()
    httpd.server_close()
    sched.close()


def call(port, method, path, body=None, raw=None, timeout=20):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def lines(data: bytes):
    return [json.loads(x) for x in data.splitlines() if x.strip()]


def state(sched):
    return sorted((n, m) for n, _i, _t, m in sched.snapshot()), len(sched.decisions)


def test_generate_streams_then_lists_trie_and_unloads(server):
    port, sched = server
    status, data = call(port, "POST", "/api/generate", {"model": "a", "prompt": [1, 2, 3], "max_tokens": 4})
    assert status == 200
    out = lines(data)
    assert [("token" in m) for m in out[:-1]] == [True] * 4
    assert out[-1]["done"] and out[-1]["model"] == "a" and out[-1]["tokens"] == [m["token"] for m in out[:-1]]
    assert set(out[-1]["stats"]) >= {"total", "matched", "resumed", "prefilled"}
    status, data = call(port, "POST", "/api/generate",
                        {"model": "a", "prompt": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                         "stream": False})
    assert status == 200 and json.loads(data)["done"]
    status, data = call(port, "GET", "/api/ps")
    (m,) = json.loads(data)["models"]
    assert m["model"] == "a" and m["memory"]["weights"] == 2 * MiB and m["pid"] > 0
    status, data = call(port, "GET", "/api/trie?model=a")
    assert status == 200 and "stream 0" in json.loads(data)["dump"]
    status, data = call(port, "GET", "/api/trie?model=a&format=json")
    assert status == 200 and json.loads(data)["trie"]["streams"]
    status, data = call(port, "POST", "/api/unload", {"model": "a"})
    assert status == 200 and json.loads(data) == {"model": "a", "unloaded": True}
    assert json.loads(call(port, "GET", "/api/ps")[1])["models"] == []
    assert not [p for p in runner_processes() if "--model a" in " ".join(p.cmdline())]


BAD = [
    (b"{oops", 400, "malformed JSON"),
    (b'"just a string"', 400, "JSON object"),
    (json.dumps({"prompt": [1], "max_tokens": 1}).encode(), 400, "missing field 'model'"),
    (json.dumps({"model": "", "prompt": [1]}).encode(), 400, "non-empty string"),
    (json.dumps({"model": "a"}).encode(), 400, "missing field 'prompt'"),
    (json.dumps({"model": "a", "prompt": [1], "max_tokens": -5}).encode(), 400, "'max_tokens' must be >= 0"),
    (json.dumps({"model": "a", "prompt": [1], "max_tokens": 10 ** 9}).encode(), 400, "exceeds the limit"),
    (json.dumps({"model": "a", "prompt": [1.5]}).encode(), 400, "token ids"),
    (json.dumps({"model": "a", "prompt": list(range(65))}).encode(), 413, "limit is 64"),
    (json.dumps({"model": "a", "prompt": [1] * 2000}).encode(), 413, "exceeds the limit of 4096"),
    (json.dumps({"model": "zzz", "prompt": [1]}).encode(), 404, "unknown model 'zzz'"),
]


@pytest.mark.parametrize("raw,status,needle", BAD)
def test_bad_generate_input_is_4xx_with_no_state_change(server, raw, status, needle):
    port, sched = server
    call(port, "POST", "/api/generate", {"model": "a", "prompt": [1], "max_tokens": 1})
    before = state(sched)
    got, data = call(port, "POST", "/api/generate", raw=raw)
    assert got == status, data
    assert needle in json.loads(data)["error"]
    assert state(sched) == before


@pytest.mark.parametrize("method,path,body,status,needle", [
    ("GET", "/api/trie", None, 400, "missing query parameter 'model'"),
    ("GET", "/api/trie?model=b", None, 404, "not loaded"),
    ("GET", "/api/trie?model=a&format=xml", None, 400, "'format'"),
    ("POST", "/api/unload", {"nomodel": 1}, 400, "missing field 'model'"),
    ("GET", "/api/nothing", None, 404, "no such endpoint"),
    ("POST", "/api/nothing", {}, 404, "no such endpoint"),
])
def test_other_bad_requests(server, method, path, body, status, needle):
    port, sched = server
    call(port, "POST", "/api/generate", {"model": "a", "prompt": [1], "max_tokens": 1})
    before = state(sched)
    got, data = call(port, method, path, body)
    assert got == status and needle in json.loads(data)["error"]
    assert state(sched) == before


def test_unload_of_a_model_not_loaded_is_a_noop(server):
    port, sched = server
    got, data = call(port, "POST", "/api/unload", {"model": "b"})
    assert got == 200 and json.loads(data)["unloaded"] is False


def test_http_client_hanging_up_cancels_in_the_runner(server):
    port, sched = server
    call(port, "POST", "/api/generate", {"model": "a", "prompt": [1], "max_tokens": 1})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/api/generate", body=json.dumps({"model": "a", "prompt": [7, 8], "max_tokens": 2000}),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    for _ in range(3):
        assert "token" in json.loads(resp.readline())
    resp.close()
    conn.close()
    t0 = time.monotonic()
    status, data = call(port, "POST", "/api/generate", {"model": "a", "prompt": [1], "max_tokens": 1})
    assert status == 200 and time.monotonic() - t0 < 5   # 2000 tokens would take 40 s


def test_server_refuses_non_loopback_hosts():
    sched = Scheduler(lambda n: None, device_total=lambda: 1, system_free=lambda: 1)
    for host in ("0.0.0.0", "192.168.1.5", "::", "example.com"):
        with pytest.raises(ValueError, match="loopback"):
            make_server(sched, host, 0)


def test_chat_prints_each_turn_with_cache_stats(server):
    port, _sched = server
    out = io.StringIO()
    rc = chat("a", "127.0.0.1", port, max_tokens=3, inp=io.StringIO("hello\nsecond turn\n/bye\n"), out=out)
    text = out.getvalue()
    assert rc == 0
    assert text.count("[cache]") == 2 and "matched=" in text and "prefilled=" in text and "resumed=" in text
    assert ">>> second turn" in text


def test_cli_serve_refuses_other_hosts_and_shuts_down_cleanly():
    env = runner_env()
    r = subprocess.run([sys.executable, "-m", "impl", "serve", "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 2 and "loopback" in r.stderr
    p = subprocess.Popen([sys.executable, "-m", "impl", "serve", "--engine", FAKE_ENGINE, "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:")
        port = int(line.split(":")[2].split()[0])
        status, data = call(port, "POST", "/api/generate", {"model": "m", "prompt": [1, 2], "max_tokens": 2})
        assert status == 200 and lines(data)[-1]["done"]
        runner_pids = [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
        assert runner_pids
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0
        for pid in runner_pids:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
