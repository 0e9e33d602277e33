"""One bug, one fix: for every saved finding, a copy of the installed mlx-lm with ONLY that bug fixed, and
every finding's exported script run against every copy.

`python -m targets.mlx_lm onefix [--dir /tmp/mlx-lm-onefix]` copies the installed `mlx_lm` package once
per fix into DIR/<cause>/mlx_lm, applies that fix's edits (each an exact, unique substitution in the
installed source: it refuses to build a copy whose text it does not find), writes every finding's
script (export.py) to DIR/scripts, runs each script with PYTHONPATH=DIR/<cause> (the copy shadows the
installed package) and with the installed package, and prints the table docs/peers.md keeps:
one row per finding, one column per fixed copy; "fails" = the script's AssertionError (its bug is
there), "passes" = "no violation".

The fixes are a maintainer's smallest change for each bug, not proposals for mlx-lm's design: they
exist to show that each script tests its own bug and nothing else (issue 50).
Invariant: the expected outcome is the identity matrix (each script passes on its own fix only);
`table()` returns the matrix and `check_identity` says where it is not.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

CACHE, SERVER = "models/cache.py", "server.py"

# cause -> [(file under mlx_lm/, old text, new text)]
FIXES: dict = {
    "exact-hit-no-seed": [(CACHE, """            cache_entry = self._trie.get(result.model, result.exact)
            return copy.deepcopy(cache_entry.prompt_cache), []
""", """            cache_entry = self._trie.get(result.model, result.exact)
            if can_trim_prompt_cache(cache_entry.prompt_cache):
                cache = copy.deepcopy(cache_entry.prompt_cache)
                trim_prompt_cache(cache, 1)
                return cache, tokens[-1:]
            cache, rest = self.fetch_nearest_cache(model, tokens[:-1])
            return cache, rest + tokens[-1:]
""")],
    "one-token-prefix": [(CACHE, """        if last_index > 0:
            shorter = tokens[: last_index + 1]""", """        if last_index >= 0:
            shorter = tokens[: last_index + 1]""")],
    "shallower-restore": [(CACHE, """        if short_length > 0:
            cache_entry = self._trie.get(result.model, result.shorter)
            return copy.deepcopy(cache_entry.prompt_cache), tokens[short_length:]
""", """        best, best_key = short_length, None
        stack = [(self._trie._trie.get(model, {}), [])]
        while stack:
            node, key = stack.pop()
            for tok, child in node.items():
                if tok == "__value__":
                    n = 0
                    while n < min(len(key), len(tokens)) and key[n] == tokens[n]:
                        n += 1
                    n = min(n, len(tokens) - 1)
                    if n > best and can_trim_prompt_cache(child.prompt_cache):
                        best, best_key = n, key
                else:
                    stack.append((child, key + [tok]))
        if best_key is not None:
            cache = copy.deepcopy(self._trie.get(model, best_key).prompt_cache)
            trim_prompt_cache(cache, len(best_key) - best)
            return cache, tokens[best:]

        if short_length > 0:
            cache_entry = self._trie.get(result.model, result.shorter)
            return copy.deepcopy(cache_entry.prompt_cache), tokens[short_length:]
""")],
    "bytes-limit-not-passed": [(SERVER, """    prompt_cache = LRUPromptCache(model_provider.cli_args.prompt_cache_size)""",
                                """    prompt_cache = LRUPromptCache(
        model_provider.cli_args.prompt_cache_size,
        model_provider.cli_args.prompt_cache_bytes or 1 << 63,
    )""")],
    "fetch-not-a-use": [(CACHE, """            cache_entry = self._trie.get(result.model, result.exact)
            return copy.deepcopy(cache_entry.prompt_cache), []
""", """            cache_entry = self._trie.get(result.model, result.exact)
            self._lru.remove(model, result.exact)
            self._lru.push(model, result.exact, cache_entry.cache_type)
            return copy.deepcopy(cache_entry.prompt_cache), []
"""), (CACHE, """                trim_prompt_cache(cache, num_to_trim)
                return cache, tokens[prefix:]
""", """                trim_prompt_cache(cache, num_to_trim)
                self._lru.remove(model, result.longer)
                self._lru.push(model, result.longer, cache_entry.cache_type)
                return cache, tokens[prefix:]
"""), (CACHE, """            cache_entry = self._trie.get(result.model, result.shorter)
            return copy.deepcopy(cache_entry.prompt_cache), tokens[short_length:]
""", """            cache_entry = self._trie.get(result.model, result.shorter)
            self._lru.remove(model, result.shorter)
            self._lru.push(model, result.shorter, cache_entry.cache_type)
            return copy.deepcopy(cache_entry.prompt_cache), tokens[short_length:]
""")],
    "trim-partial": [(CACHE, """    def is_trimmable(self):
        return True

    def trim(self, n):
        n = min(self.offset - self.start_position, n)""", """    def is_trimmable(self):
        return self.start_position == 0

    def trim(self, n):
        n = min(self.offset - self.start_position, n)""")],
    "speculative-key-ahead": [(SERVER, """            # Save the KV cache again
            self.prompt_cache.insert_cache(
                self.model_provider.model_key, cache_key, cache
            )""", """            # Save the KV cache again
            if draft_model is not None:
                cache_key = cache_key[: min(c.offset for c in cache[: len(model.layers)])]
            self.prompt_cache.insert_cache(
                self.model_provider.model_key, cache_key, cache
            )""")],
    "draft-behind": [(SERVER, """            # Save the KV cache again
            self.prompt_cache.insert_cache(""", """            # Save the KV cache again
            if draft_model is not None:
                draft_cache = cache[len(model.layers) :]
                if draft_cache[0].offset < len(cache_key):
                    draft_model(
                        mx.array([cache_key[draft_cache[0].offset :]]), cache=draft_cache
                    )
                    mx.eval([c.state for c in draft_cache])
            self.prompt_cache.insert_cache(""")],
}


def installed() -> Path:
    import mlx_lm
    return Path(mlx_lm.__file__).resolve().parent


def build(cause: str, root: Path) -> Path:
    """root/<cause>/mlx_lm: the installed package with FIXES[cause] applied; returns root/<cause>."""
    dst = root / cause
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(installed(), dst / "mlx_lm", ignore=shutil.ignore_patterns("__pycache__"))
    for rel, old, new in FIXES[cause]:
        f = dst / "mlx_lm" / rel
        text = f.read_text()
        if text.count(old) != 1:
            raise ValueError(f"fix {cause}: the text to replace occurs {text.count(old)} times in {rel}")
        f.write_text(text.replace(old, new))
    return dst


def run_script(script: Path, pythonpath: Path | None, timeout: int = 300) -> str:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(pythonpath)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode == 0 and "no violation" in r.stdout:
        return "passes"
    if "AssertionError" in r.stderr:
        return "fails"
    return "error: " + (r.stderr.strip().splitlines() or ["?"])[-1][:120]


def table(root: Path, findings_dir: Path | None = None, log=print) -> dict:
    """{finding stem: {"stock": outcome, cause: outcome for every fixed copy}}."""
    from targets.mlx_lm.export import export
    from targets.mlx_lm.report import FINDINGS_DIR
    findings_dir = findings_dir or FINDINGS_DIR
    recs = {p.stem: json.loads(p.read_text()) for p in sorted(findings_dir.glob("*.json"))}
    scripts = root / "scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    for stem, rec in recs.items():
        (scripts / f"{stem}.py").write_text(export(rec, rec["mlx_lm_version"]))
    copies = {rec["cause"]: build(rec["cause"], root) for rec in recs.values() if rec["cause"] in FIXES}
    out = {}
    for stem in recs:
        row = {"stock": run_script(scripts / f"{stem}.py", None)}
        for cause, path in copies.items():
            row[cause] = run_script(scripts / f"{stem}.py", path)
        out[stem] = row
        log(f"{stem}: {row}")
    return out


def check_identity(tab: dict, recs: dict) -> list:
    """Cells off the identity: a script passing on stock or on another bug's fix, or failing on its own."""
    bad = []
    for stem, row in tab.items():
        own = recs[stem]["cause"]
        for col, outcome in row.items():
            want = "passes" if col == own else "fails"
            if outcome != want:
                bad.append((stem, col, outcome))
    return bad


def markdown(tab: dict, recs: dict) -> str:
    cols = [c for c in next(iter(tab.values()))]
    lines = ["| finding (script) | " + " | ".join(f"`{c}`" for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for stem, row in tab.items():
        cells = [("**passes**" if row[c] == "passes" else row[c]) for c in cols]
        lines.append(f"| {stem} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(root: str) -> int:
    from targets.mlx_lm.report import FINDINGS_DIR
    recs = {p.stem: json.loads(p.read_text()) for p in sorted(FINDINGS_DIR.glob("*.json"))}
    tab = table(Path(root))
    print(markdown(tab, recs))
    bad = check_identity(tab, recs)
    print("identity: yes" if not bad else f"not the identity at {bad}")
    return int(bool(bad))
