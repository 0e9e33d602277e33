"""The prefix-cache budget (serve/budget.py): 25% of the memory free when the runner has loaded its
model, unless --cache-budget or PREFIX_CACHE_BUDGET say otherwise; more than the machine's total
memory is refused, by the runner and by `python -m serve`."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import psutil
import pytest

from serve import budget
from serve.client import RunnerClient, RunnerLoadError, runner_env
from tests.support.fake_engine import FAKE_ENGINE

MiB = 1 << 20

pytestmark = pytest.mark.usefixtures("bounded_and_clean")


@pytest.mark.parametrize("text,n", [("1073741824", 1 << 30), ("512MiB", 512 * MiB), ("512M", 512 * MiB),
                                    ("2GB", 2 * 10 ** 9), ("1.5g", 3 << 29), (" 64 KiB ", 64 << 10), (7, 7)])
def test_parse_size(text, n):
    assert budget.parse_size(text) == n


@pytest.mark.parametrize("bad", ["", "lots", "5 parsecs", "-1", -3, True, "1e9"])
def test_parse_size_refuses(bad):
    with pytest.raises(budget.BudgetError):
        budget.parse_size(bad)


def test_resolve_default_flag_env_and_too_large():
    n, rule = budget.resolve(env={}, total=16 << 30, available=8 << 30)
    assert n == 2 << 30 and "25%" in rule and str(8 << 30) in rule
    assert budget.resolve(env={budget.ENV: "1GiB"}, total=16 << 30, available=8 << 30)[0] == 1 << 30
    assert budget.resolve("2GiB", env={budget.ENV: "1GiB"}, total=16 << 30)[0] == 2 << 30
    with pytest.raises(budget.BudgetError, match="more than this machine's total memory"):
        budget.resolve(env={budget.ENV: "17GiB"}, total=16 << 30)


def _runner(*args, env=None, **kw):
    return RunnerClient("fake-a", engine=FAKE_ENGINE, runner_args=list(args), load_timeout=30,
                        env=env, **kw)


def test_runner_default_is_a_quarter_of_the_memory_free_at_load():
    env = {k: v for k, v in os.environ.items() if k != budget.ENV}
    c = _runner(env=env)
    try:
        c.load()
        m = c.memory()
        free = int(re.search(r"\((\d+) bytes\) free", m["budget_rule"]).group(1))
        assert m["budget"] == int(free * budget.DEFAULT_FRACTION)
        assert 0 < free <= psutil.virtual_memory().total
    finally:
        c.close()


def test_runner_takes_the_environment_then_the_flag():
    env = dict(os.environ, **{budget.ENV: "64MiB"})
    c = _runner(env=env)
    d = _runner("--cache-budget", "32MiB", env=env)
    try:
        c.load()
        d.load()
        assert c.memory()["budget"] == 64 * MiB and budget.ENV in c.memory()["budget_rule"]
        assert d.memory()["budget"] == 32 * MiB and "--cache-budget" in d.memory()["budget_rule"]
    finally:
        c.close()
        d.close()


def test_runner_refuses_a_budget_over_total_memory():
    c = _runner(env=dict(os.environ, **{budget.ENV: "100TiB"}))
    with pytest.raises(RunnerLoadError, match="more than this machine's total memory"):
        c.load()


def test_serve_refuses_a_budget_over_total_memory():
    r = subprocess.run([sys.executable, "-m", "serve", "--port", "0", "--cache-budget", "100TiB"],
                       capture_output=True, text=True, env=runner_env(), timeout=60)
    assert r.returncode == 2 and "more than this machine's total memory" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "serve", "--port", "0", "--cache-budget", "lots"],
                       capture_output=True, text=True, env=runner_env(), timeout=60)
    assert r.returncode == 2 and "is not a size" in r.stderr, r.stderr
