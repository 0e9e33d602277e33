"""Server over loopback HTTP (fake-engine runners): endpoints, bad input -> 4xx with no state
change, cancellation when the HTTP client goes away, loopback-only binding, the CLI."""
from __future__ import annotations

import http.client
import io
import json
import signal
import subprocess
import sys

import psutil
import pytest

from serve.chat import chat
from serve.client import runner_env
from serve.scheduler import Scheduler
from serve.server import make_server
from tests.support.fake_engine import FAKE_ENGINE
from tests.support.processes import runner_processes
from tests.support.processes import status as process_status
from tests.support.servers import call, fake_server, lines, state

MiB = 1 << 20


pytestmark = pytest.mark.usefixtures("watchdog", "no_runner_left")


@pytest.fixture(scope="module")
def server():
    """One server for the module (its runner stays loaded between tests, as a server's would)."""
    with fake_server({"a": 2 * MiB, "b": 3 * MiB}, max_prompt_tokens=64, max_body_bytes=4096) as s:
        yield s


def chat_body(n=1, **kw):
    return dict({"model": "a", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": n}}, **kw)


def test_ps_trie_and_unload_of_our_own(server):
    port, sched = server
    status, data = call(port, "POST", "/api/chat", chat_body(4))
    assert status == 200 and lines(data)[-1]["done"]
    status, data = call(port, "GET", "/api/ps")
    (m,) = json.loads(data)["models"]
    assert m["model"] == "a" and m["x_memory"]["weights"] == 2 * MiB and m["x_pid"] > 0
    assert m["size"] >= 2 * MiB and m["size_vram"] == 0 and m["expires_at"].endswith("Z")
    status, data = call(port, "GET", "/x/trie?model=a")
    assert status == 200 and "stream 0" in json.loads(data)["dump"]
    status, data = call(port, "GET", "/x/trie?model=a&format=json")
    assert status == 200 and json.loads(data)["trie"]["streams"]
    status, data = call(port, "POST", "/x/unload", {"model": "a"})
    assert status == 200 and json.loads(data) == {"model": "a", "unloaded": True}
    assert json.loads(call(port, "GET", "/api/ps")[1])["models"] == []
    assert not [p for p in runner_processes() if "--model a" in " ".join(p.cmdline())]
    assert call(port, "GET", "/")[1] == b"Ollama is running" and call(port, "HEAD", "/")[0] == 200


@pytest.mark.parametrize("method,path,body,status,needle", [
    ("GET", "/x/trie", None, 400, "missing query parameter 'model'"),
    ("GET", "/x/trie?model=b", None, 404, "not loaded"),
    ("GET", "/x/trie?model=a&format=xml", None, 400, "'format'"),
    ("POST", "/x/unload", {"nomodel": 1}, 400, "missing field 'model'"),
    ("GET", "/api/nothing", None, 404, "no such endpoint"),
    ("POST", "/api/nothing", {}, 404, "no such endpoint"),
    ("POST", "/api/pull", {"model": "a"}, 404, "no such endpoint"),
])
def test_other_bad_requests(server, method, path, body, status, needle):
    port, sched = server
    call(port, "POST", "/api/chat", chat_body())
    before = state(port, sched)
    got, data = call(port, method, path, body)
    assert got == status and needle in json.loads(data)["error"]
    assert state(port, sched) == before


def test_unload_of_a_model_not_loaded_is_a_noop(server):
    port, sched = server
    got, data = call(port, "POST", "/x/unload", {"model": "b"})
    assert got == 200 and json.loads(data)["unloaded"] is False


def test_http_client_hanging_up_cancels_in_the_runner(server):
    port, sched = server
    call(port, "POST", "/api/chat", chat_body())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/api/generate", body=json.dumps({"model": "a", "prompt": [7, 8],
                                                           "options": {"num_predict": 2000}}),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    for _ in range(3):
        assert "response" in json.loads(resp.readline())
    resp.close()
    conn.close()
    status, data = call(port, "POST", "/api/chat", chat_body())   # waits for the engine: the stream ended
    assert status == 200
    streams = json.loads(call(port, "GET", "/x/trie?model=a&format=json")[1])["trie"]["streams"]
    assert 5 <= streams[-2] < 1000, streams                       # [7, 8] + some tokens, not 2000


def test_server_refuses_non_loopback_hosts():
    sched = Scheduler(lambda n: None, device_total=lambda: 1, system_free=lambda: 1)
    for host in ("0.0.0.0", "192.168.1.5", "::", "example.com"):
        with pytest.raises(ValueError, match="loopback"):
            make_server(sched, host, 0)


def test_chat_prints_each_turn_with_reuse_and_memory_at_exit(server):
    port, _sched = server
    out = io.StringIO()
    rc = chat("a", "127.0.0.1", port, max_tokens=3, inp=io.StringIO("hello\nsecond turn\n/bye\n"), out=out)
    text = out.getvalue()
    assert rc == 0
    cache = [ln for ln in text.splitlines() if ln.startswith("[cache]")]
    assert len(cache) == 2 and all("reused" in ln and "evaluated" in ln for ln in cache), text
    total1 = int(cache[0].split("prompt ")[1].split()[0])
    reused2 = int(cache[1].split("tokens: ")[1].split()[0])
    assert reused2 >= total1, cache                                 # turn 2 resumes after turn 1's prompt
    assert ">>> second turn" in text and "\r" not in text          # no spinner off a terminal
    (mem,) = [ln for ln in text.splitlines() if ln.startswith("[memory]")]
    assert mem.startswith("[memory] a: weights 2.0 MiB") and "budget" in mem


def test_spinner_runs_until_the_first_text():
    from serve.chat import Spinner
    out = io.StringIO()
    s = Spinner(out, enabled=True)
    s.stop()
    assert out.getvalue().startswith("\r") and "evaluating the prompt" in out.getvalue()


def test_cli_serve_refuses_other_hosts_and_shuts_down_cleanly():
    env = runner_env()
    r = subprocess.run([sys.executable, "-m", "serve", "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 2 and "loopback" in r.stderr
    p = subprocess.Popen([sys.executable, "-m", "serve", "--engine", FAKE_ENGINE, "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:")
        port = int(line.split(":")[2].split()[0])
        status, data = call(port, "POST", "/api/generate", {"model": "m", "prompt": [1, 2],
                                                            "options": {"num_predict": 2}})
        assert status == 200 and lines(data)[-1]["done"]
        runner_pids = [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
        assert runner_pids
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0
        for pid in runner_pids:
            assert process_status(pid) in (None, psutil.STATUS_ZOMBIE)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
