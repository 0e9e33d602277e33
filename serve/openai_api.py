"""OpenAI's ``POST /v1/chat/completions`` and ``GET /v1/models`` on the same runners (docs/server.md).

Request: ``model``, ``messages``, ``stream``, ``max_tokens`` / ``max_completion_tokens``,
``temperature``, ``seed``, ``stop`` (a string or a list). Sampling knobs we do not implement
(``top_p`` other than 1, penalties other than 0, ``n`` other than 1, tools, logprobs) are refused.
Reuse is reported where OpenAI puts it, ``usage.prompt_tokens_details.cached_tokens`` (the tokens
resumed from the prefix cache), and in full in ``x_prefix_cache``. Errors are OpenAI's shape,
``{"error": {"message", "type", "code"}}``, with the same statuses as the Ollama endpoints.
Streams are server-sent events ending with ``data: [DONE]``.
"""
from __future__ import annotations

import time
import uuid

from serve import ollama_api as api
from serve.httpio import BadRequest

NEUTRAL = {"top_p": 1, "frequency_penalty": 0, "presence_penalty": 0, "n": 1}
REFUSED = ("tools", "functions", "logprobs", "top_logprobs", "logit_bias", "response_format")


def models(tags: list) -> dict:
    return {"object": "list", "data": [{"id": t["name"], "object": "model", "created": 0, "owned_by": "local"}
                                       for t in tags]}


def check(obj: dict, limits: dict) -> dict:
    for k, neutral in NEUTRAL.items():
        if obj.get(k) not in (None, neutral):
            raise BadRequest(f"'{k}' other than {neutral} is not supported by this server")
    for k in REFUSED:
        if obj.get(k):
            raise BadRequest(f"'{k}' is not supported by this server")
    stream = obj.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean")
    n = obj.get("max_completion_tokens", obj.get("max_tokens"))
    options = {"num_predict": n, "temperature": obj.get("temperature"), "seed": obj.get("seed"),
               "stop": obj.get("stop")}
    max_tokens, opts = api.check_options({k: v for k, v in options.items() if v is not None},
                                         limits["max_new_tokens"])
    messages = api.check_messages(obj.get("messages"), 8 * limits["max_prompt_tokens"])
    if not messages:
        raise BadRequest("'messages' must not be empty")
    return {"prompt": messages, "stream": stream, "max_tokens": max_tokens, "options": opts,
            "boundaries": None, "keep_alive": None}


def _usage(result: dict) -> dict:
    stats = result.get("stats") or {}
    prompt = int(result.get("prompt_tokens") or stats.get("total", 0))
    done = len(result.get("tokens", []))
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
            "prompt_tokens_details": {"cached_tokens": int(stats.get("resumed", 0))}}


def handle(h) -> None:
    """Serve one request on the server's handler ``h`` (serve/server.py)."""
    try:
        obj = h._json_body()
        model = h._model_field(obj, known=False)
        req = check(obj, h.app.limits)
        h._model_field(obj)
    except BadRequest as e:
        return error(h, e.status, str(e))
    rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    base = {"id": rid, "created": created, "model": model}

    def on_text(piece):
        if req["stream"]:
            h._write_event(dict(base, object="chat.completion.chunk", choices=[
                {"index": 0, "delta": {"role": "assistant", "content": piece}, "finish_reason": None}]))

    try:
        result, _total, _load = h.run(model, req, on_text)
    except Exception as e:
        if getattr(h, "_headers_sent", False):
            h._write_event({"error": {"message": str(e), "type": "server_error", "code": None}})
            return
        return error(h, *h.status_of(e))
    reason = "length" if result.get("done_reason") == "length" else "stop"
    x = dict(result.get("stats") or {})
    if req["stream"]:
        h._write_event(dict(base, object="chat.completion.chunk", usage=_usage(result), x_prefix_cache=x,
                            choices=[{"index": 0, "delta": {}, "finish_reason": reason}]))
        h._write_event("[DONE]")
    else:
        h._send_json(200, dict(base, object="chat.completion", usage=_usage(result), x_prefix_cache=x, choices=[
            {"index": 0, "message": {"role": "assistant", "content": result.get("text", "")},
             "finish_reason": reason}]))


def error(h, status: int, message: str) -> None:
    kind = "invalid_request_error" if status < 500 else "server_error"
    code = "model_not_found" if status == 404 and "not found" in message else None
    h.close_connection = True
    h._send_json(status, {"error": {"message": message, "type": kind, "code": code}})
