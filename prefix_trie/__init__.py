"""The installed commands of prefix-trie-mlx (``prefix-trie``, ``check-mlx-lm``, ``check-ollama``:
prefix_trie/cli.py). The project's own packages keep their short names (spec, impl, serve, fuzz,
bench, targets, stateful_tests); the commands refuse to run when another distribution's package of
one of those names shadows ours (docs/architecture.md, "Installed names")."""
