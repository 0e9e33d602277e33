"""OpenAI's /v1/chat/completions, spoken by the official ``openai`` client (unchanged), against
fake-engine runners: a reply, a stream, reuse as usage.prompt_tokens_details.cached_tokens, and
errors with OpenAI's shape and Ollama's statuses."""
from __future__ import annotations

import faulthandler

import openai
import pytest

from tests.support.processes import runner_processes
from tests.support.servers import MiB, fake_server, state


@pytest.fixture(scope="module")
def server():
    faulthandler.dump_traceback_later(120, exit=True)
    with fake_server({"a": 2 * MiB}, token_delay=0.0) as s:
        yield s
    faulthandler.cancel_dump_traceback_later()
    assert not runner_processes()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server[0]}/v1", api_key="unused", max_retries=0)


def test_chat_completion_then_stream_with_reuse(client):
    msgs = [{"role": "user", "content": "hello openai"}]
    r = client.chat.completions.create(model="a", messages=msgs, max_tokens=4)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
    assert r.choices[0].message.content.count(" t") == 4
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    chunks = list(client.chat.completions.create(model="a", messages=msgs, max_tokens=4, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0       # the same prompt again
    assert [m.id for m in client.models.list().data] == ["a"]


@pytest.mark.parametrize("kwargs,status,needle", [
    (dict(model="zzz"), 404, 'model "zzz" not found'),
    (dict(messages=[]), 400, "'messages' must not be empty"),
    (dict(top_p=0.5), 400, "'top_p' other than 1"),
    (dict(max_tokens=10 ** 9), 400, "exceeds"),
])
def test_errors_have_openais_shape(client, server, kwargs, status, needle):
    port, sched = server
    client.chat.completions.create(model="a", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    before = state(port, sched)
    args = dict(dict(model="a", messages=[{"role": "user", "content": "x"}], max_tokens=1), **kwargs)
    with pytest.raises(openai.APIStatusError) as ei:
        client.chat.completions.create(**args)
    assert ei.value.status_code == status and needle in ei.value.body["message"], ei.value.body
    assert state(port, sched) == before
