"""Ollama's REST API, the parts clients use: request checks and response shapes (docs/server.md).

``check_chat`` / ``check_generate`` turn an Ollama request body into a runner request (the
runner's dialect, serve/runner.py) or raise ``BadRequest`` (400; 413 for oversize) before anything
is touched. ``chunk`` / ``final`` build the NDJSON objects Ollama streams: ``message`` (chat) or
``response`` (generate), ``done``, ``done_reason``, ``prompt_eval_count``, ``eval_count`` and the
four durations in nanoseconds. Our per-request reuse goes in ``x_prefix_cache`` of the last object.

Differences from Ollama, all stated in docs/server.md:
- temperature absent means greedy (Ollama's default is 0.8); ``seed`` makes sampling repeatable.
- ``prompt_eval_count`` counts the prompt tokens the model evaluated for this request: the
  prompt minus what the prefix cache resumed (so it falls when a conversation is reused).
- ``/api/generate``'s ``prompt`` may be a list of token ids (our extension; no template), with an
  optional ``boundaries`` list of token offsets for the engine's captures.
- An empty ``messages`` / ``prompt`` is an error unless ``keep_alive`` is 0 (then: unload).
"""
from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone
from typing import Optional

from serve.httpio import BadRequest, check_boundaries

SUPPORTED_OPTIONS = ("num_predict", "temperature", "seed", "stop")
# Load-time and threading options that change no output: accepted and ignored.
IGNORED_OPTIONS = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "numa", "low_vram", "f16_kv",
                   "use_mmap", "use_mlock", "vocab_only", "logits_all", "embedding_only", "num_keep")
# Sampling options Ollama knows and we do not implement: refused rather than silently ignored.
UNSUPPORTED_OPTIONS = ("top_k", "top_p", "min_p", "tfs_z", "typical_p", "repeat_last_n", "repeat_penalty",
                       "presence_penalty", "frequency_penalty", "mirostat", "mirostat_tau", "mirostat_eta",
                       "penalize_newline")
ROLES = ("system", "user", "assistant")
FOREVER = math.inf
_DURATION = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def now_stamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def stamp_in(seconds: float) -> str:
    if seconds == FOREVER or seconds > 1e10:
        return "2318-01-01T00:00:00Z"
    at = datetime.now(timezone.utc) + timedelta(seconds=max(0.0, seconds))
    return at.isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_keep_alive(value) -> Optional[float]:
    """Seconds to keep a model loaded after a request (FOREVER for a negative value), or None
    when absent. Numbers are seconds; strings are Go durations ("5m", "1h30m", "0", "-1")."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise BadRequest(f"'keep_alive' must be a duration such as \"5m\" or a number of seconds, got {value!r}")
    if isinstance(value, (int, float)):
        secs = float(value)
    elif isinstance(value, str):
        s = value.strip()
        sign = -1.0 if s.startswith("-") else 1.0
        body = s.lstrip("+-")
        try:
            secs = sign * float(body)
        except ValueError:
            parts = _DURATION.findall(body)
            if not parts or "".join(n + u for n, u in parts) != body:
                raise BadRequest(f"'keep_alive' {value!r} is not a duration (examples: \"5m\", \"30s\", 0, -1)")
            secs = sign * sum(float(n) * _UNIT_S[u] for n, u in parts)
    else:
        raise BadRequest(f"'keep_alive' must be a duration such as \"5m\" or a number of seconds, got {value!r}")
    return FOREVER if secs < 0 else secs


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_options(options, max_new_tokens: int) -> tuple[int, dict]:
    """(max_tokens, the runner's options) from Ollama's ``options``."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise BadRequest("'options' must be an object")
    for k in options:
        if k in UNSUPPORTED_OPTIONS:
            raise BadRequest(f"option {k!r} is not supported by this server (supported: "
                             f"{', '.join(SUPPORTED_OPTIONS)})")
        if k not in SUPPORTED_OPTIONS and k not in IGNORED_OPTIONS:
            raise BadRequest(f"unknown option {k!r}")
    n = options.get("num_predict")
    if n is None or (_int(n) and n < 0):        # Ollama: -1 (and -2) mean "until the end"
        n = max_new_tokens
    if not _int(n):
        raise BadRequest(f"option 'num_predict' must be an integer, got {n!r}")
    if n > max_new_tokens:
        raise BadRequest(f"option 'num_predict' {n} exceeds this server's limit of {max_new_tokens}")
    t = options.get("temperature")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 100):
        raise BadRequest(f"option 'temperature' must be a number in [0, 100], got {t!r}")
    seed = options.get("seed")
    if seed is not None and not _int(seed):
        raise BadRequest(f"option 'seed' must be an integer, got {seed!r}")
    stop = options.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise BadRequest("option 'stop' must be a list of non-empty strings")
    return n, {"temperature": t, "seed": seed, "stop": stop or []}


def _common(obj: dict, limits: dict) -> dict:
    stream = obj.get("stream", True)
    if stream is None:
        stream = True
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean")
    fmt = obj.get("format")
    if fmt not in (None, ""):
        raise BadRequest("'format' (structured output) is not supported by this server")
    if obj.get("think") not in (None, False):
        raise BadRequest("'think' is not supported by this model")
    if obj.get("tools"):
        raise BadRequest("'tools' are not supported by this model")
    max_tokens, options = check_options(obj.get("options"), limits["max_new_tokens"])
    return {"stream": stream, "keep_alive": parse_keep_alive(obj.get("keep_alive")),
            "max_tokens": max_tokens, "options": options}


def check_messages(messages, max_chars: int) -> list:
    if not isinstance(messages, list):
        raise BadRequest("'messages' must be a list of {role, content} objects")
    out, chars = [], 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"message {i} must be an object with 'role' and 'content'")
        role, content = m.get("role"), m.get("content", "")
        if role not in ROLES:
            raise BadRequest(f"message {i} has role {role!r}; this server takes {', '.join(ROLES)}")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise BadRequest(f"message {i}: 'content' must be a string")
        if m.get("images"):
            raise BadRequest(f"message {i} has images; this model takes text only")
        if m.get("tool_calls"):
            raise BadRequest(f"message {i} has tool calls; this model takes text only")
        chars += len(content)
        out.append({"role": role, "content": content})
    if chars > max_chars:
        raise BadRequest(f"the messages have {chars} characters; the limit is {max_chars}", 413)
    return out


def check_chat(obj: dict, limits: dict) -> dict:
    """An Ollama /api/chat body -> {"prompt": messages | None (unload), "stream", ...}."""
    req = _common(obj, limits)
    messages = check_messages(obj.get("messages", []) or [], 8 * limits["max_prompt_tokens"])
    if not messages and req["keep_alive"] != 0:
        raise BadRequest("'messages' must not be empty (an empty list with keep_alive 0 unloads the model)")
    req.update(prompt=messages or None, boundaries=None)
    return req


def check_generate(obj: dict, limits: dict) -> dict:
    """An Ollama /api/generate body -> the runner's request. A string prompt goes through the
    chat template as one user message (with ``system`` before it) unless ``raw`` is true; a
    list of token ids (our extension) is used as it is."""
    req = _common(obj, limits)
    for field in ("suffix", "template", "context", "images"):
        if obj.get(field):
            raise BadRequest(f"'{field}' is not supported by this server")
    prompt, system, raw = obj.get("prompt", ""), obj.get("system"), obj.get("raw", False)
    if not isinstance(raw, bool):
        raise BadRequest("'raw' must be a boolean")
    if system is not None and not isinstance(system, str):
        raise BadRequest("'system' must be a string")
    boundaries = obj.get("boundaries")
    if prompt in ("", None, []):
        if req["keep_alive"] != 0:
            raise BadRequest("'prompt' must not be empty (an empty prompt with keep_alive 0 unloads the model)")
        prompt = None
    elif isinstance(prompt, list):
        if not all(_int(t) and t >= 0 for t in prompt):
            raise BadRequest("'prompt' must be a string or a list of token ids (ints >= 0)")
        if len(prompt) > limits["max_prompt_tokens"]:
            raise BadRequest(f"prompt has {len(prompt)} tokens; the limit is {limits['max_prompt_tokens']}", 413)
        if system:
            raise BadRequest("'system' needs a string prompt (token ids are used as they are)")
    elif isinstance(prompt, str):
        if len(prompt) > 8 * limits["max_prompt_tokens"]:
            raise BadRequest(f"prompt has {len(prompt)} characters; the limit is "
                             f"{8 * limits['max_prompt_tokens']}", 413)
        if not raw:
            prompt = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}]
        elif system:
            raise BadRequest("'system' cannot be used with raw: true")
    else:
        raise BadRequest("'prompt' must be a string or a list of token ids")
    if boundaries is not None:
        check_boundaries(boundaries, prompt)
    req.update(prompt=prompt, boundaries=boundaries)
    return req


# ---------------------------------------------------------------------------------- responses

def chunk(kind: str, model: str, text: str) -> dict:
    out = {"model": model, "created_at": now_stamp()}
    if kind == "chat":
        out["message"] = {"role": "assistant", "content": text}
    else:
        out["response"] = text
    out["done"] = False
    return out


def final(kind: str, model: str, result: dict, *, total_s: float, load_s: float, text: str = "") -> dict:
    """The last object of an answer (with the whole text when not streamed)."""
    stats = result.get("stats") or {}
    prompt_tokens = int(result.get("prompt_tokens") or stats.get("total", 0))
    out = chunk(kind, model, text)
    out.update(done=True, done_reason=result.get("done_reason", "stop"),
               total_duration=int(total_s * 1e9), load_duration=int(load_s * 1e9),
               prompt_eval_count=max(0, prompt_tokens - int(stats.get("resumed", 0))),
               prompt_eval_duration=int(float(result.get("prompt_eval_s", 0.0)) * 1e9),
               eval_count=len(result.get("tokens", [])),
               eval_duration=int(float(result.get("eval_s", 0.0)) * 1e9),
               x_prefix_cache=dict(stats, prompt_tokens=prompt_tokens))
    return out


def unloaded(kind: str, model: str) -> dict:
    out = chunk(kind, model, "")
    out.update(done=True, done_reason="unload")
    return out


# The real models (impl/models); a name served by a test engine has no details.
_DETAILS = {
    "smollm2": {"format": "gguf", "family": "llama", "families": ["llama"], "parameter_size": "135M"},
    "gemma3": {"format": "mlx", "family": "gemma3", "families": ["gemma3"], "parameter_size": "tiny"},
    "qwen3next": {"format": "mlx", "family": "qwen3_next", "families": ["qwen3_next"], "parameter_size": "tiny"},
    "mamba2": {"format": "mlx", "family": "mamba2", "families": ["mamba2"], "parameter_size": "tiny"},
}


def details(name: str) -> dict:
    d = dict(_DETAILS.get(name, {"format": "", "family": "", "families": []}))
    d.setdefault("parameter_size", "")
    d["parent_model"] = ""
    d["quantization_level"] = "F32"
    return d


def show(name: str) -> dict:
    d = details(name)
    return {"modelfile": f"# served by prefix-trie-mlx\nFROM {name}\n", "parameters": "", "template": "",
            "details": d, "model_info": {"general.architecture": d["family"], "general.basename": name},
            "capabilities": ["completion"], "modified_at": now_stamp()}
