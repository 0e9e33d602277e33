"""prefix_trie/cli.py, the console entry points: dispatch, check-mlx-lm's default subcommand, and the
refusal when another package shadows one of ours (docs/architecture.md, "Installed names")."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prefix_trie import cli

ROOT = Path(__file__).resolve().parents[1]


def test_our_packages_resolve_beside_the_commands():
    assert cli.shadowed() == []


def test_dispatch_hands_each_command_its_arguments(monkeypatch):
    seen = []
    for name in cli.COMMANDS:
        monkeypatch.setitem(cli.COMMANDS, name, lambda name=name: lambda argv: seen.append((name, argv)))
    cli.main(["fuzz", "--minutes", "1"])
    cli.main(["serve", "chat", "smollm2"])
    cli.main(["check-mlx-lm", "--minutes", "2"])
    cli.check_mlx_lm(["replay"])
    cli.check_ollama(["--src", "x"])
    assert seen == [("fuzz", ["--minutes", "1"]), ("serve", ["chat", "smollm2"]),
                    ("check-mlx-lm", ["check", "--minutes", "2"]), ("check-mlx-lm", ["replay"]),
                    ("check-ollama", ["--src", "x"])]


def test_no_command_prints_the_list(capsys):
    assert cli.main([]) == 2
    assert "prefix-trie check-ollama" in capsys.readouterr().err
    assert cli.main(["--help"]) == 0


def test_a_shadowing_package_stops_the_command(tmp_path):
    """An `impl` package first on sys.path (here: the working directory) is not ours: refused, exit 2."""
    (tmp_path / "impl").mkdir()
    (tmp_path / "impl" / "__init__.py").write_text("")
    r = subprocess.run([sys.executable, "-c", "import sys; from prefix_trie.cli import check_mlx_lm; "
                        "sys.exit(check_mlx_lm(['--help']))"], capture_output=True, text=True,
                       cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "'impl' resolves to" in r.stderr and str(tmp_path / "impl") in r.stderr
