"""Ollama's REST API, spoken by the official ``ollama`` Python client (unchanged), against fake-engine
runner processes: streaming and non-streaming chat and generate with Ollama's fields, options
(num_predict, temperature + seed, stop), keep_alive (0 unloads), list/ps/show/version, cancel by
disconnect, two clients on two models at once, token-id prompts with boundaries (our extension)."""
from __future__ import annotations

import json
import threading
import time

import ollama
import pytest

from tests.support.servers import MiB, call, fake_server, lines

SIZES = {"a": 2 * MiB, "b": 3 * MiB}
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")
REUSE = {"total", "matched", "resumed", "prefilled", "evictions"}


pytestmark = pytest.mark.usefixtures("watchdog", "no_runner_left")


@pytest.fixture(scope="module")
def server():
    with fake_server(SIZES) as (port, sched):
        yield port, sched


@pytest.fixture
def client(server):
    return ollama.Client(host=f"http://127.0.0.1:{server[0]}")


def check_final(r, n_tokens):
    """Ollama's last object, as the official client parses it (it drops our x_ fields)."""
    r = r if isinstance(r, dict) else r.model_dump()
    assert r["done"] and r["done_reason"] == "length" and r["eval_count"] == n_tokens
    for k in DURATIONS:
        assert isinstance(r[k], int) and r[k] >= 0, (k, r[k])
    assert r["total_duration"] >= r["prompt_eval_duration"] + r["eval_duration"] > 0
    assert r["prompt_eval_count"] > 0
    if "x_prefix_cache" in r:
        x = r["x_prefix_cache"]
        assert REUSE <= set(x) and r["prompt_eval_count"] == x["total"] - x["resumed"]


def test_chat_streams_then_reuses_on_the_next_turn(client):
    msgs = [{"role": "user", "content": "hello there"}]
    parts = list(client.chat("a", messages=msgs, stream=True, options={"num_predict": 5}))
    assert all(not p.done and p.message.role == "assistant" for p in parts[:-1])
    assert len(parts) == 6
    text = "".join(p.message.content for p in parts)
    assert text == "".join(f" t{t}" for t in _fake_tokens(msgs, 5))
    check_final(parts[-1], 5)
    assert parts[-1].prompt_eval_count == _fake_len(msgs)        # nothing cached yet
    msgs2 = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
    again = client.chat("a", messages=msgs2, stream=False, options={"num_predict": 3})
    check_final(again, 3)
    # The fake caches whole token streams: the first message is reused, the rest is evaluated.
    assert again.message.content and again.prompt_eval_count == _fake_len(msgs2) - _fake_len(msgs)


def _fake_len(messages):
    return sum(len(m["role"]) + 1 + len(m["content"]) + 2 for m in messages)


def test_the_last_object_carries_reuse_in_x_prefix_cache(server):
    port, _ = server
    body = {"model": "a", "messages": [{"role": "user", "content": "raw http"}], "options": {"num_predict": 2}}
    status, data = call(port, "POST", "/api/chat", body)
    out = lines(data)
    assert status == 200 and [o["done"] for o in out] == [False, False, True]
    check_final(out[-1], 2)
    status, data = call(port, "POST", "/api/chat", dict(body, stream=False))
    (one,) = lines(data)
    check_final(one, 2)
    assert one["message"]["content"] == "".join(o["message"]["content"] for o in out)
    assert one["x_prefix_cache"]["matched"] > 0 and one["prompt_eval_count"] < out[-1]["prompt_eval_count"]


def _fake_tokens(messages, n):
    """What tests/support/fake_engine.py answers (its greedy stream), to check text end to end."""
    ids = []
    for m in messages:
        ids += [1] + [ord(c) % 997 + 3 for c in m["role"] + ":" + m["content"]] + [2]
    seed = sum(ids) % 1000
    return [(seed + 7 * i) % 1000 for i in range(n)]


def test_generate_string_prompt_is_a_templated_user_turn_unless_raw(client):
    r = client.generate("a", prompt="why?", options={"num_predict": 2})
    assert r.response == "".join(f" t{t}" for t in _fake_tokens([{"role": "user", "content": "why?"}], 2))
    check_final(r, 2)
    raw = client.generate("a", prompt="why?", raw=True, options={"num_predict": 2}, stream=True)
    parts = list(raw)
    seed = sum(ord(c) % 997 + 3 for c in "why?") % 1000
    assert "".join(p.response for p in parts) == f" t{seed} t{(seed + 7) % 1000}"
    assert parts[-1].prompt_eval_count <= 4


def test_generate_token_ids_with_boundaries_reach_the_engine(server):
    port, _ = server
    status, data = call(port, "POST", "/api/generate", {"model": "a", "prompt": [5, 6, 7, 8, 9],
                                                        "boundaries": [2, 4], "options": {"num_predict": 2}})
    out = lines(data)
    assert status == 200 and out[-1]["done"] and out[-1]["eval_count"] == 2
    assert out[-1]["x_prefix_cache"]["total"] == 5
    trie = json.loads(call(port, "GET", "/x/trie?model=a&format=json")[1])["trie"]
    assert trie["boundaries"] == [2, 4]


def test_stop_string_ends_with_done_reason_stop(client):
    msgs = [{"role": "user", "content": "count"}]
    toks = _fake_tokens(msgs, 6)
    stop = f"t{toks[3]}"
    parts = list(client.chat("a", messages=msgs, stream=True, options={"num_predict": 6, "stop": [stop]}))
    text = "".join(p.message.content for p in parts)
    assert text == "".join(f" t{t}" for t in toks[:3]) + " "
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count == 4


def test_seeded_sampling_repeats_and_temperature_zero_is_greedy(client):
    msgs = [{"role": "user", "content": "roll"}]

    def run(**opts):
        return client.chat("a", messages=msgs, options={"num_predict": 8, **opts}).message.content

    greedy = run()
    assert run(temperature=0) == greedy
    s1, s1b, s2 = run(temperature=1.0, seed=1), run(temperature=1.0, seed=1), run(temperature=1.0, seed=2)
    assert s1 == s1b and s1 != s2 and s1 != greedy


def test_list_show_version_ps(client, server):
    port, _ = server
    client.chat("a", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 1})
    assert sorted(m.model for m in client.list().models) == ["a", "b"]
    assert client.show("a").capabilities == ["completion"]
    with pytest.raises(ollama.ResponseError) as ei:
        client.show("zzz")
    assert ei.value.status_code == 404
    status, data = call(port, "GET", "/api/version")
    assert status == 200 and json.loads(data)["version"]
    (m,) = [m for m in client.ps().models if m.model == "a"]
    assert m.size >= 2 * MiB and m.expires_at is not None
    raw = json.loads(call(port, "GET", "/api/ps")[1])["models"]
    x = [r for r in raw if r["model"] == "a"][0]["x_prefix_cache"]
    assert 0 < x["budget"] < 1 << 50 and "25%" in x["budget_rule"]


def test_keep_alive_zero_unloads(client):
    r = client.chat("b", messages=[{"role": "user", "content": "x"}], options={"num_predict": 1}, keep_alive=0)
    assert r.done
    assert "b" not in [m.model for m in client.ps().models]
    client.chat("b", messages=[{"role": "user", "content": "x"}], options={"num_predict": 1})
    assert "b" in [m.model for m in client.ps().models]
    r = client.chat("b", messages=[], keep_alive=0)
    assert r.done_reason == "unload" and "b" not in [m.model for m in client.ps().models]


def test_keep_alive_duration_expires(client):
    client.chat("b", messages=[{"role": "user", "content": "x"}], options={"num_predict": 1}, keep_alive="0.5s")
    deadline = time.monotonic() + 20
    while "b" in [m.model for m in client.ps().models]:
        assert time.monotonic() < deadline, "keep_alive 0.5s did not unload the model"
        time.sleep(0.1)


def test_disconnect_cancels_the_generation(client, server):
    port, _ = server
    msgs = [{"role": "user", "content": "a very long answer please"}]
    stream = client.chat("a", messages=msgs, stream=True, options={"num_predict": 2000})
    for _ in range(3):
        assert not next(stream).done
    stream.close()                                # the client hangs up mid-stream
    # The next request on the model waits for the engine, so the cancelled one has ended by then.
    client.chat("a", messages=[{"role": "user", "content": "next"}], options={"num_predict": 1})
    streams = json.loads(call(port, "GET", "/x/trie?model=a&format=json")[1])["trie"]["streams"]
    prompt = len(msgs[0]["content"]) + len("user:") + 2
    assert prompt + 3 <= streams[-2] < prompt + 1000, streams     # the cancelled one, before "next"


def test_two_clients_on_two_models_at_once(server):
    port, _ = server
    host = f"http://127.0.0.1:{port}"
    a_chunks, b_done = [], threading.Event()
    long_a = ollama.Client(host=host).chat("a", messages=[{"role": "user", "content": "long"}], stream=True,
                                           options={"num_predict": 2000})
    a_chunks.append(next(long_a))                 # a is generating (2000 tokens take 40 s)

    def other():
        r = ollama.Client(host=host).chat("b", messages=[{"role": "user", "content": "short"}],
                                          options={"num_predict": 3})
        if r.done and r.eval_count == 3:
            b_done.set()

    t = threading.Thread(target=other)
    t.start()
    t.join(60)
    assert b_done.is_set(), "the request on model b did not finish while a was streaming"
    a_chunks.append(next(long_a))                 # a is still streaming after b finished
    assert not any(c.done for c in a_chunks)
    long_a.close()
