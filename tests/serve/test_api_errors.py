"""Bad input to the Ollama API: Ollama's error shape ({"error": message}), its status codes, and
nothing changes (the scheduler's table and decisions, the runner's trie). docs/server.md has the
same table."""
from __future__ import annotations

import json

import ollama
import pytest

from tests.support.processes import runner_processes
from tests.support.servers import MiB, call, fake_server, state

USER = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return json.dumps(dict({"model": "a", "messages": USER, "options": {"num_predict": 1}}, **kw)).encode()


def gen(**kw):
    return json.dumps(dict({"model": "a", "prompt": "hi", "options": {"num_predict": 1}}, **kw)).encode()


# (endpoint, body, status, what the message says). The server: max_prompt_tokens 64, a 4096-byte
# body limit, and a fake engine whose context is 40 tokens.
BAD = [
    ("/api/chat", b"{oops", 400, "malformed JSON"),
    ("/api/chat", b'"just a string"', 400, "JSON object"),
    ("/api/chat", json.dumps({"messages": USER}).encode(), 400, "missing field 'model'"),
    ("/api/chat", chat(model=""), 400, "'model' must be a non-empty string"),
    ("/api/chat", chat(model=5), 400, "'model' must be a non-empty string"),
    ("/api/chat", chat(model="zzz"), 404, 'model "zzz" not found'),
    ("/api/chat", chat(messages=[]), 400, "'messages' must not be empty"),
    ("/api/chat", chat(messages="hi"), 400, "'messages' must be a list"),
    ("/api/chat", chat(messages=[{"role": "user", "content": 5}]), 400, "'content' must be a string"),
    ("/api/chat", chat(messages=[{"role": "tool", "content": "x"}]), 400, "has role 'tool'"),
    ("/api/chat", chat(messages=[{"role": "user", "content": "x", "images": ["aGk="]}]), 400, "text only"),
    ("/api/chat", chat(stream="yes"), 400, "'stream' must be a boolean"),
    ("/api/chat", chat(options={"num_predict": "x"}), 400, "'num_predict' must be an integer"),
    ("/api/chat", chat(options={"num_predict": 10 ** 9}), 400, "exceeds this server's limit"),
    ("/api/chat", chat(options={"temperature": -1}), 400, "'temperature' must be a number"),
    ("/api/chat", chat(options={"stop": [""]}), 400, "'stop' must be a list of non-empty strings"),
    ("/api/chat", chat(options={"bogus": 1}), 400, "unknown option 'bogus'"),
    ("/api/chat", chat(options={"top_k": 5}), 400, "option 'top_k' is not supported"),
    ("/api/chat", chat(options=[1]), 400, "'options' must be an object"),
    ("/api/chat", chat(keep_alive="soon"), 400, "'keep_alive' 'soon' is not a duration"),
    ("/api/chat", chat(format="json"), 400, "'format' (structured output) is not supported"),
    ("/api/chat", chat(messages=[{"role": "user", "content": "x" * 40}]), 400, "over the context length 40"),
    ("/api/chat", chat(messages=[{"role": "user", "content": "x" * 600}]), 413, "the limit is 512"),
    ("/api/chat", b'{"model": "a", "pad": "' + b"x" * 5000 + b'"}', 413, "exceeds the limit of 4096"),
    ("/api/generate", gen(prompt=3.5), 400, "'prompt' must be a string or a list of token ids"),
    ("/api/generate", gen(prompt=[1, -2]), 400, "list of token ids (ints >= 0)"),
    ("/api/generate", gen(prompt=""), 400, "'prompt' must not be empty"),
    ("/api/generate", gen(prompt=list(range(65))), 413, "prompt has 65 tokens; the limit is 64"),
    ("/api/generate", gen(prompt=list(range(3, 50))), 400, "over the context length 40"),
    ("/api/generate", gen(boundaries=[1]), 400, "'boundaries' is only valid with a prompt of token ids"),
    ("/api/generate", gen(prompt=[5, 6, 7], boundaries=[3, 2]), 400, "strictly increasing"),
    ("/api/generate", gen(prompt=[5, 6, 7], boundaries=[9]), 400, "'boundaries' must lie in [1, 3]"),
    ("/api/generate", gen(raw="yes"), 400, "'raw' must be a boolean"),
    ("/api/generate", gen(context=[1, 2]), 400, "'context' is not supported"),
    ("/api/show", json.dumps({"model": "zzz"}).encode(), 404, 'model "zzz" not found'),
]


pytestmark = pytest.mark.usefixtures("watchdog")


@pytest.fixture(scope="module")
def server():
    with fake_server({"a": 2 * MiB}, token_delay=0.0, runner_args=["--fake-context", "40"],
                     max_prompt_tokens=64, max_body_bytes=4096) as s:
        call(s[0], "POST", "/api/chat", json.loads(chat()))       # model loaded, one stream cached
        yield s
    left = runner_processes()
    for p in left:
        p.kill()
    assert not left, f"runner processes survived the module: {left}"


@pytest.mark.parametrize("path,raw,status,needle", BAD, ids=[f"{i:02d}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_input_is_ollamas_error_and_changes_nothing(server, path, raw, status, needle):
    port, sched = server
    before = state(port, sched)
    got, data = call(port, "POST", path, raw=raw)
    assert got == status, data
    body = json.loads(data)
    assert list(body) == ["error"] and needle in body["error"], body
    assert state(port, sched) == before


@pytest.mark.parametrize("kwargs,status,needle", [
    (dict(model="zzz", messages=USER), 404, 'model "zzz" not found'),
    (dict(model="a", messages=[]), 400, "'messages' must not be empty"),
    (dict(model="a", messages=USER, options={"bogus": 1}), 400, "unknown option 'bogus'"),
    (dict(model="a", messages=USER, stream=True, options={"top_p": 0.5}), 400, "'top_p' is not supported"),
])
def test_the_official_client_raises_response_error(server, kwargs, status, needle):
    port, sched = server
    before = state(port, sched)
    with pytest.raises(ollama.ResponseError) as ei:
        r = ollama.Client(host=f"http://127.0.0.1:{port}").chat(**kwargs)
        if kwargs.get("stream"):
            list(r)
    assert ei.value.status_code == status and needle in ei.value.error
    assert state(port, sched) == before
