"""Runner process tests: start-up protocol, endpoints, A3 pool release, bad input, cancellation,
and (once impl.engine exists) one request through the real Engine.

Every test is bounded (a faulthandler watchdog ends a hung test) and leaves no runner behind.
"""
from __future__ import annotations

import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from serve.client import RunnerClient, RunnerDied, RunnerRequestError, runner_env
from tests.support.fake_engine import FAKE_ENGINE
from tests.support.processes import runner_processes

MiB = 1 << 20

pytestmark = pytest.mark.usefixtures("bounded_and_clean")


@pytest.fixture
def fake():
    clients = []

    def make(model="fake-a", *args, **kw):
        c = RunnerClient(model, engine=FAKE_ENGINE, runner_args=list(args), load_timeout=30, **kw)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


def _post(port, path, body: bytes, headers=None, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers=headers or {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_prints_port_then_ready_and_serves_health_memory_trie(fake):
    c = fake("fake-a", "--fake-weight-bytes", str(3 * MiB))
    info = c.load()
    assert info["event"] == "ready"
    assert isinstance(c.port, int) and c.port > 0
    assert c.state == "loaded"
    h = c.health()
    assert h == {"status": "ok", "model": "fake-a", "pid": c.pid}
    m = c.memory()
    assert m["weights"] == 3 * MiB and m["live_caches"] == 0 and m["paged_out"] == 0 and m["rss"] > 0
    r = c.generate([5, 6, 7], 4)
    assert r["done"] and len(r["tokens"]) == 4 and r["stats"]["total"] == 3
    assert "stream 0" in c.trie()
    assert c.trie("json")["streams"] == [7]


def test_one_thread_makes_every_engine_call(fake):
    """The load, each request (each on its own HTTP handler thread), /memory and /trie all reach
    the engine on the runner's main thread: on MLX's CUDA backend, arrays that outlive the thread that
    made them abort the process when they are freed (docs/platform.md)."""
    c = fake("fake-a")
    c.load()
    for n in range(3):
        c.generate([5, 6, n], 2)
        c.memory()
        c.trie()
    threads = c.trie("json")["threads"]
    assert threads == ["MainThread"], threads


def test_full_collections_wait_for_idle_moments(fake):
    """Python starts no full collection by itself in a runner (serve/collector.py): /memory reports
    generation 2's threshold out of reach once the engine is loaded."""
    from serve.collector import OUT_OF_REACH

    c = fake("fake-a")
    c.load()
    c.generate([5, 6, 7], 2)
    g = c.memory()["gc"]
    assert g["installed"] and g["thresholds"][2] == OUT_OF_REACH, g


def test_streaming_delivers_tokens_before_the_end(fake):
    c = fake("fake-a", "--fake-token-delay", "0.05")
    c.load()
    seen = []
    t0 = time.monotonic()
    r = c.generate([1, 2], 6, on_token=lambda m: seen.append((time.monotonic() - t0, m["token"])))
    assert [t for _, t in seen] == r["tokens"]
    assert seen[0][0] < seen[-1][0] - 0.15, "tokens must arrive as they are produced"


def test_runner_prints_port_on_stdout_when_run_directly():
    proc = subprocess.Popen([sys.executable, "-m", "serve.runner", "--model", "fake-x", "--engine", FAKE_ENGINE,
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=runner_env())
    try:
        first = json.loads(proc.stdout.readline())
        assert first["event"] == "port" and first["port"] > 0
        ready = json.loads(proc.stdout.readline())
        assert ready["event"] == "ready"
    finally:
        proc.kill()
        proc.wait(10)


def test_runner_refuses_non_loopback_host():
    r = subprocess.run([sys.executable, "-m", "serve.runner", "--model", "fake-x", "--engine", FAKE_ENGINE,
                        "--host", "0.0.0.0"], capture_output=True, text=True, env=runner_env(), timeout=30)
    assert r.returncode == 2 and "loopback" in r.stderr


def test_failed_load_is_reported_and_reaped(fake):
    c = fake("fake-bad", "--fake-fail-load")
    with pytest.raises(Exception) as ei:
        c.load()
    assert "failed as asked" in str(ei.value)
    assert c.state == "closed" and c._proc.returncode is not None


def test_a3_pool_is_released_after_load(fake):
    """A3: weights built through a transform leave buffers in MLX's pool; the runner releases
    the pool after load, so an idle runner's MLX cache memory is 0."""
    c = fake("fake-mlx", "--fake-mlx", "--fake-weight-bytes", str(64 * MiB))
    c.load()
    m = c.memory()
    assert m["mlx_cache"] == 0, m
    assert m["pool_released_bytes"] >= 16 * MiB, m      # what the pool held just before
    assert m["mlx_active"] >= 64 * MiB, m                # the weights themselves stay


@pytest.mark.parametrize("body,status,needle", [
    (b"{not json", 400, "malformed JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"max_tokens": 3}', 400, "missing field 'prompt'"),
    (b'{"prompt": [], "max_tokens": 3}', 400, "non-empty"),
    (b'{"prompt": [1, -2], "max_tokens": 3}', 400, ">= 0"),
    (b'{"prompt": [1, 2], "max_tokens": -1}', 400, "'max_tokens' must be >= 0"),
    (b'{"prompt": [1, 2], "max_tokens": "x"}', 400, "integer"),
    (b'{"prompt": [{"role": "user"}]}', 400, "'role' and 'content'"),
    (b'{"prompt": [1, 2], "stream": 3}', 400, "boolean"),
    (json.dumps({"prompt": list(range(50)), "max_tokens": 1}).encode(), 413, "limit is 40"),
])
def test_bad_input_is_4xx_with_a_clear_message_and_no_state_change(fake, body, status, needle):
    c = fake("fake-a", "--max-prompt-tokens", "40")
    c.load()
    c.generate([1, 2, 3], 2)
    before = c.trie("json")
    got, data = _post(c.port, "/generate", body)
    assert got == status, data
    assert needle in json.loads(data)["error"]
    assert c.trie("json") == before
    assert c.generate([1, 2, 3], 2)["done"]


def test_oversized_body_and_unknown_endpoint(fake):
    c = fake("fake-a", "--max-body-bytes", "1000")
    c.load()
    got, data = _post(c.port, "/generate", b"x" * 2000)
    assert got == 413 and "exceeds" in json.loads(data)["error"]
    got, data = _post(c.port, "/nope", b"{}")
    assert got == 404
    with pytest.raises(RunnerRequestError) as ei:
        c._get_json("/nothing")
    assert ei.value.status == 404


def test_client_going_away_cancels_the_generation(fake):
    """The engine's cancel callable turns True when the HTTP client hangs up, so the runner
    stops generating and serves the next request promptly."""
    c = fake("fake-a", "--fake-token-delay", "0.05")
    c.load()
    seen = []
    t0 = time.monotonic()
    r = c.generate([1, 2, 3], 1000, on_token=seen.append, cancel=lambda: len(seen) >= 3)
    assert r["cancelled"] and 3 <= len(r["tokens"]) < 1000
    r2 = c.generate([9, 9], 2)         # waits for the engine lock: only if the first stopped
    assert r2["done"] and time.monotonic() - t0 < 5
    # the fake engine stores what the cancelled request produced: far fewer than 1000 tokens
    streams = c.trie("json")["streams"]
    assert streams[0] < 3 + 40, streams


def test_raw_socket_hangup_cancels(fake):
    c = fake("fake-a", "--fake-token-delay", "0.05")
    c.load()
    s = socket.create_connection(("127.0.0.1", c.port), timeout=5)
    body = json.dumps({"prompt": [1, 2], "max_tokens": 1000}).encode()
    s.sendall(b"POST /generate HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(0.3)
    s.close()
    t0 = time.monotonic()
    assert c.generate([3], 1)["done"]
    assert time.monotonic() - t0 < 3


def test_runner_killed_mid_request_is_a_clear_error(fake):
    c = fake("fake-a", "--fake-token-delay", "0.05")
    c.load()
    pid = c.pid

    def kill_after_two(m, n=[0]):
        n[0] += 1
        if n[0] == 2:
            os.kill(pid, 9)

    with pytest.raises(RunnerDied) as ei:
        c.generate([1, 2], 100, on_token=kill_after_two)
    assert "SIGKILL" in str(ei.value) and "fake-a" in str(ei.value)
    assert not c.alive()
    with pytest.raises(RunnerDied):
        c.memory()


def test_parent_death_takes_the_runner_down():
    """--watch-stdin: a runner whose parent vanished (stdin closed) exits by itself."""
    proc = subprocess.Popen([sys.executable, "-m", "serve.runner", "--model", "fake-x", "--engine", FAKE_ENGINE,
                             "--watch-stdin"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=runner_env())
    try:
        json.loads(proc.stdout.readline())
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


REAL_ENGINE = importlib.util.find_spec("impl.engine") is not None


@pytest.mark.skipif(not REAL_ENGINE, reason="impl.engine not written yet")
def test_real_engine_runner_serves_smollm2():
    """The real path: impl.models.load + impl.engine.Engine in a runner process; A3 after load;
    a second request sharing the prompt reuses the cache."""
    c = RunnerClient("smollm2", engine="real", load_timeout=240)
    try:
        c.load()
        m = c.memory()
        assert m["mlx_cache"] == 0, m
        assert m["weights"] > 0
        prompt = [{"role": "user", "content": "Name a colour."}]
        r1 = c.generate(prompt, 3)
        assert r1["done"] and 1 <= len(r1["tokens"]) <= 3
        assert r1["stats"]["total"] > 0
        r2 = c.generate(prompt + [{"role": "assistant", "content": r1["text"]},
                                  {"role": "user", "content": "Another."}], 2)
        assert r2["stats"]["matched"] > 0, r2["stats"]
        assert isinstance(c.trie(), str)
    finally:
        c.close()


@pytest.mark.skipif(not REAL_ENGINE, reason="impl.engine not written yet")
def test_real_engine_runner_resumes_conversations_across_handler_threads():
    """Each request arrives on its own HTTP handler thread; the cached state one request made must
    serve the next turn however the threads come and go. On mlx >= 0.32 every thread has its own
    default stream: before the runner made every engine call on its main thread, a hybrid's second
    turn failed with "There is no Stream(cpu, N) in current thread" (docs/platform.md)."""
    c = RunnerClient("qwen3next", engine="real", load_timeout=240)
    try:
        c.load()
        convs = [[1] + [7 + i % 50 for i in range(40)] + [60 + k] * 8 for k in range(3)]
        for turn in range(2):
            for k, conv in enumerate(convs):
                r = c.generate(conv, 3)
                assert r["done"] and len(r["tokens"]) == 3, r
                assert turn == 0 or r["stats"]["matched"] >= len(conv) - 12, r["stats"]
                conv += r["tokens"] + [90 + k] * 4
        assert c.alive()
    finally:
        c.close()
