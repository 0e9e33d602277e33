"""impl/platform.py: the environment entry points and runner processes start with (docs/platform.md)."""
import os
import subprocess
from pathlib import Path

import pytest

from impl import platform

ROOT = Path(__file__).resolve().parents[2]


def test_platform_env_bounds_the_openblas_spin_and_keeps_a_callers_choice():
    env = platform.platform_env({"PATH": "/bin"})
    assert env["OPENBLAS_THREAD_TIMEOUT"] == platform.OPENBLAS_THREAD_TIMEOUT
    assert "OPENBLAS_NUM_THREADS" not in env                  # the bench keeps OpenBLAS's threads
    assert platform.platform_env({"OPENBLAS_THREAD_TIMEOUT": "28"})["OPENBLAS_THREAD_TIMEOUT"] == "28"
    if platform.openblas_available():
        assert platform.preloaded(env)


def test_preload_env_is_one_thread_per_process_with_the_same_settings():
    env = platform.preload_env({"OPENBLAS_NUM_THREADS": "2"})
    assert env["OPENBLAS_NUM_THREADS"] == "2"
    env = platform.preload_env({})
    assert env["OPENBLAS_NUM_THREADS"] == "1"
    assert env["OPENBLAS_THREAD_TIMEOUT"] == platform.OPENBLAS_THREAD_TIMEOUT


@pytest.mark.skipif(not platform.openblas_available(), reason="no OpenBLAS here: ./dev preloads nothing")
@pytest.mark.skipif(not list(ROOT.glob(".venv/.installed-*")), reason="./dev has not set up .venv in this tree")
def test_dev_starts_python_with_the_values_written_in_platform_py():
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "OPENBLAS_THREAD_TIMEOUT")}
    out = subprocess.run([str(ROOT / "dev"), "python", "-c",
                          "import os; print(os.environ['LD_PRELOAD']); print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"],
                         env=env, capture_output=True, text=True, timeout=300, check=True).stdout.split()
    assert out == [platform.OPENBLAS, platform.OPENBLAS_THREAD_TIMEOUT]


def test_the_recorded_command_carries_the_same_settings():
    cmd = platform.command("bench")
    assert cmd.endswith(".venv/bin/python -m bench")
    assert f"LD_PRELOAD={platform.OPENBLAS}" in cmd
    assert f"OPENBLAS_THREAD_TIMEOUT={platform.OPENBLAS_THREAD_TIMEOUT}" in cmd
