"""The official ``ollama`` client, unchanged, against the real server and SmolLM2-135M in a real
runner process: a three-turn chat whose second and third turns are served from the prefix cache.

Ollama's ``prompt_eval_count`` counts the prompt tokens the model evaluated: turn 1 evaluates its
whole prompt; on turns 2 and 3 the previous prompt and answer are resumed from the cache, so at
most the new part (the end of the last answer, the new question, the template's turn markers) is
evaluated: prompt_eval_count <= len(prompt_k) - len(prompt_{k-1}) + 1.
"""
from __future__ import annotations

import faulthandler
import inspect
import json
import threading

import ollama
import pytest

from impl.engine import Engine
from impl.models import MODEL_NAMES, shared_tokenizer
from serve.scheduler import Scheduler
from serve.server import make_server
from tests.support.processes import runner_processes
from tests.support.servers import call, lines

QUESTIONS = ["What is the capital of France?", "And of Germany?", "Which of the two is larger?"]


@pytest.fixture
def real_server(monkeypatch):
    # The answers below are float32 SmolLM2's; in bfloat16 (PREFIX_TRIE_DTYPE) stock mlx-lm's own forward of
    # the same weights answers "L'Étoile, la Marseillaise, ..." too. The runners inherit this environment.
    monkeypatch.setenv("PREFIX_TRIE_DTYPE", "float32")
    faulthandler.dump_traceback_later(300, exit=True)
    sched = Scheduler(engine="real", load_timeout=240)
    httpd = make_server(sched, "127.0.0.1", 0, models=MODEL_NAMES)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
        sched.close()
        faulthandler.cancel_dump_traceback_later()
    assert not runner_processes()


def test_three_turn_chat_reuses_the_conversation(real_server):
    client = ollama.Client(host=f"http://127.0.0.1:{real_server}")
    tok = shared_tokenizer()
    messages, counts, lengths = [], [], []
    for turn, q in enumerate(QUESTIONS, 1):
        messages.append({"role": "user", "content": q})
        parts = list(client.chat("smollm2", messages=messages, stream=True, options={"num_predict": 12}))
        last = parts[-1]
        answer = "".join(p.message.content for p in parts)
        print(f"turn {turn}: {q!r} -> {answer!r} prompt_eval_count={last.prompt_eval_count} "
              f"eval_count={last.eval_count} done_reason={last.done_reason}")
        assert last.done and answer.strip() and 1 <= last.eval_count <= 12
        assert last.done_reason in ("stop", "length")
        counts.append(last.prompt_eval_count)
        lengths.append(len(tok.apply_chat_template(messages, add_generation_prompt=True)))
        messages.append({"role": "assistant", "content": answer})
    assert "Paris" in messages[1]["content"]
    assert counts[0] == lengths[0]                       # nothing cached on turn 1
    for k in (1, 2):                                     # turns 2 and 3: only the new part
        assert counts[k] <= lengths[k] - lengths[k - 1] + 1, (counts, lengths)
        assert counts[k] < lengths[k] // 2, (counts, lengths)

    # Seeded sampling through the real engine's sampler hook: one seed, one answer.
    opts = {"num_predict": 6, "temperature": 0.9, "seed": 11}
    a, b = (client.chat("smollm2", messages=messages[:1], options=opts).message.content for _ in range(2))
    assert a == b and a.strip()
    # Token ids with boundaries (our extension) reach an engine whose generate() takes them.
    ids = tok.apply_chat_template(messages[:1], add_generation_prompt=True)
    status, data = call(real_server, "POST", "/api/generate", {"model": "smollm2", "prompt": ids,
                                                               "boundaries": [3], "options": {"num_predict": 1}})
    if "boundaries" in inspect.signature(Engine.generate).parameters:
        assert status == 200 and lines(data)[-1]["done"], data
    else:
        assert status == 400 and "does not take 'boundaries'" in json.loads(data)["error"]
