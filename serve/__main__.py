"""Command line: ``python -m serve [options]`` runs the server; ``python -m serve chat MODEL`` chats
with it; ``python -m serve runner ...`` runs one runner process (``python -m serve.runner``).

On Linux the process re-executes itself once with Debian's OpenBLAS preloaded when that
library exists (impl/platform.py; MLX's CPU wheel otherwise uses the reference BLAS); the
runners it starts inherit the setting.
"""
from __future__ import annotations

import argparse
import sys

from impl.platform import reexec_with_openblas


def main(argv=None) -> int:
    from serve.server import DEFAULT_PORT

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["runner"]:
        from serve.runner import main as runner_main
        return runner_main(argv[1:])
    if argv[:1] == ["chat"]:
        c = argparse.ArgumentParser(prog="python -m serve chat", description="chat with a model through the server")
        c.add_argument("model")
        c.add_argument("--host", default="127.0.0.1")
        c.add_argument("--port", type=int, default=DEFAULT_PORT)
        c.add_argument("--max-tokens", type=int, default=128)
        c.add_argument("--system", default=None)
        args = c.parse_args(argv[1:])
        from serve.chat import chat
        return chat(args.model, args.host, args.port, args.max_tokens, args.system)
    s = argparse.ArgumentParser(prog="python -m serve",
                                description="run the local server (loopback only); "
                                            "also: python -m serve chat MODEL, python -m serve runner ...")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=DEFAULT_PORT)
    s.add_argument("--engine", default="real",
                   help="the runners' engine: real, or MODULE:FACTORY (python -m serve.runner --help)")
    s.add_argument("--cache-budget", "--budget-bytes", dest="cache_budget", default=None,
                   help="prefix-cache budget per runner: bytes or a size (512MiB, 2GB); default: "
                        "$PREFIX_CACHE_BUDGET, else 25%% of the memory free when the model loads")
    s.add_argument("--keep-alive", default="5m",
                   help="how long a model stays loaded after its last request (Ollama's keep_alive; "
                        "-1: forever, 0: unload at once)")
    s.add_argument("--device-bytes", type=int, default=None, help="override the device memory figure")
    s.add_argument("--max-prompt-tokens", type=int, default=32768)
    s.add_argument("--verbose", action="store_true")
    args = s.parse_args(argv)
    from serve.server import serve
    return serve(args.host, args.port, engine=args.engine, cache_budget=args.cache_budget,
                 device_bytes=args.device_bytes, max_prompt_tokens=args.max_prompt_tokens,
                 verbose=args.verbose, keep_alive=args.keep_alive)


if __name__ == "__main__":
    reexec_with_openblas("serve", guard="SERVE_NO_REEXEC")
    sys.exit(main())
