"""Console entry points (pyproject.toml, [project.scripts]): a dispatcher, nothing more.

    prefix-trie fuzz [...]           python -m fuzz: a fuzz campaign (prefix-trie fuzz replay CASE.json)
    prefix-trie serve [...]          python -m serve: the local Ollama/OpenAI server (serve chat MODEL)
    prefix-trie check-mlx-lm [...]   python -m targets.mlx_lm: mlx-lm's server prompt cache under our rules
    prefix-trie check-ollama [...]   python -m targets.ollama: an Ollama checkout's prefix cache
    check-mlx-lm [...], check-ollama [...]   the same two, directly
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGES = ("spec", "impl", "serve", "fuzz", "bench", "targets", "stateful_tests")


def _fuzz():
    from fuzz.__main__ import main
    return main


def _serve():
    from impl.platform import reexec_with_openblas
    from serve.__main__ import main
    reexec_with_openblas("serve", guard="SERVE_NO_REEXEC")     # as python -m serve does (fuzz's main does it)
    return main


def _check_mlx_lm():
    from targets.mlx_lm.__main__ import main
    return main


def _check_ollama():
    from targets.ollama.__main__ import main
    return main


COMMANDS = {"fuzz": _fuzz, "serve": _serve, "check-mlx-lm": _check_mlx_lm, "check-ollama": _check_ollama}


def shadowed(packages=PACKAGES) -> list[str]:
    """Our top-level packages that resolve somewhere other than beside this one (another
    distribution installed a package of the same name first on sys.path)."""
    home = Path(__file__).resolve().parent.parent
    out = []
    for name in packages:
        found = importlib.util.find_spec(name)
        where = Path(found.origin).resolve().parent if found and found.origin else None
        if where != home / name:
            out.append(f"{name!r} resolves to {where or 'nothing'}, not {home / name}")
    return out


def _run(command: str, argv: list[str]) -> int:
    bad = shadowed()
    if bad:
        print(f"{command}: refusing to run: another package shadows prefix-trie-mlx's own:\n  "
              + "\n  ".join(bad) + "\ninstall prefix-trie-mlx in a virtualenv of its own (python -m venv, "
              "or pipx run)", file=sys.stderr)
        return 2
    sys.argv = [command, *argv]          # an entry point that re-executes itself (OpenBLAS) sees these
    return COMMANDS[command]()(argv) or 0


def check_mlx_lm(argv=None) -> int:
    """``check-mlx-lm [check] [--minutes N] [--report DIR]`` (also replay, render DIR)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("check", "replay", "render", "-h", "--help"):
        argv = ["check", *argv]
    return _run("check-mlx-lm", argv)


def check_ollama(argv=None) -> int:
    """``check-ollama --src PATH [--minutes N] [--report DIR] [--replay P.json ...]``."""
    return _run("check-ollama", list(sys.argv[1:] if argv is None else argv))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.split("\n\n")[1].rstrip(), file=sys.stderr if argv[:1] not in (["-h"], ["--help"]) else sys.stdout)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    if argv[0] == "check-mlx-lm":
        return check_mlx_lm(argv[1:])
    return _run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
