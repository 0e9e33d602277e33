"""impl/platform.py: the environment entry points and runner processes start with (docs/platform.md)."""
import os
import subprocess
import sys
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
    for before, after in ((platform.OPENBLAS, platform.OPENBLAS),                     # preloaded once, as
                          ("/x/a.so:" + platform.OPENBLAS, "/x/a.so:" + platform.OPENBLAS),   # platform_env does
                          ("/x/a.so", platform.OPENBLAS + ":/x/a.so")):
        got = subprocess.run([str(ROOT / "dev"), "python", "-c", "import os; print(os.environ['LD_PRELOAD'])"],
                             env={**env, "LD_PRELOAD": before}, capture_output=True, text=True, timeout=300,
                             check=True).stdout.split()
        assert got == [after] == [platform.platform_env({"LD_PRELOAD": before})["LD_PRELOAD"]], before


def test_the_recorded_command_carries_the_same_settings():
    cmd = platform.command("bench")
    assert cmd.endswith(".venv/bin/python -m bench")
    assert f"LD_PRELOAD={platform.OPENBLAS}" in cmd
    assert f"OPENBLAS_THREAD_TIMEOUT={platform.OPENBLAS_THREAD_TIMEOUT}" in cmd


_SETTLE_PROBE = """
import ctypes
from impl import platform
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = platform._LIBC
libc.mallinfo2.restype = Mallinfo2
fast = lambda: libc.mallinfo2().fsmblks          # bytes in freed fastbin blocks: the frees glibc deferred
blocks = [libc.malloc(48) for _ in range(4000)]
for b in blocks:
    libc.free(b)
deferred = fast()
platform.settle_allocator()
print(deferred, fast())
"""


@pytest.mark.skipif(platform._LIBC is None or not hasattr(platform._LIBC, "mallinfo2"), reason="glibc >= 2.33 only")
def test_settle_allocator_coalesces_the_small_blocks_glibc_deferred():
    """A forward frees thousands of small blocks; glibc keeps them in fastbins and coalesces them at the
    next allocation of 1 KiB or more, whoever makes it. settle_allocator pays that where it is called.
    (In a fresh process: one thread, one arena, nothing else freeing meanwhile.)"""
    out = subprocess.run([sys.executable, "-c", _SETTLE_PROBE], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    deferred, after = int(out[0]), int(out[1])
    assert deferred > 100_000                # 4000 x 48 B, beyond the per-thread cache's few blocks a size
    assert after == 0


def test_every_engine_forward_settles_the_allocator_inside_its_timing(monkeypatch):
    """The coalescing of a forward's frees is the forward's cost (forward_s), not the next bookkeeping
    call's: Engine._forward settles once per forward, after its evaluation."""
    import impl.engine as engine_module
    from impl.engine import Engine
    from impl.models import load

    e = Engine(load("qwen3next"), near_end=0)
    calls, forwards, real = [], [0], e._forward

    def counted(*a, **k):
        forwards[0] += 1
        n = len(calls)
        out = real(*a, **k)
        assert len(calls) == n + 1, "a forward returned without settling the allocator"
        return out

    monkeypatch.setattr(engine_module, "settle_allocator", lambda: calls.append(1))
    monkeypatch.setattr(e, "_forward", counted)
    e.generate(list(range(1, 40)), max_tokens=5, stop_at_eos=False)
    assert forwards[0] >= 2 and len(calls) == forwards[0]


def test_device_env_picks_the_default_device_and_refuses_other_names(monkeypatch):
    """PREFIX_TRIE_DEVICE=cpu makes the CPU MLX's default device (a GPU machine's CPU cell); a name
    other than cpu or gpu stops with a message that names it; unset changes nothing."""
    import mlx.core as mx

    old = mx.default_device()
    try:
        monkeypatch.delenv("PREFIX_TRIE_DEVICE", raising=False)
        platform.apply_device_env()
        assert mx.default_device() == old
        monkeypatch.setenv("PREFIX_TRIE_DEVICE", "CPU")
        platform.apply_device_env()
        assert mx.default_device() == mx.cpu
        monkeypatch.setenv("PREFIX_TRIE_DEVICE", "tpu")
        with pytest.raises(SystemExit, match="'tpu'"):
            platform.apply_device_env()
    finally:
        mx.set_default_device(old)


def _kernels(env_extra: dict) -> list:
    """openblas_core() and coretype_mismatch() in a fresh process started with `env_extra`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    code = ("import os; from impl.platform import coretype_mismatch, openblas_core; "
            "print(openblas_core()); print(coretype_mismatch(os.environ))")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=True).stdout.splitlines()


@pytest.mark.skipif(not platform.openblas_available() or os.uname().machine != "x86_64",
                    reason="Debian's OpenBLAS on x86-64 only (its kernel sets are x86 names)")
def test_openblas_core_is_the_kernel_set_in_force_not_the_one_asked_for():
    pre = {"LD_PRELOAD": platform.OPENBLAS}
    assert _kernels({**pre, "OPENBLAS_CORETYPE": "Prescott"}) == ["Prescott", "None"]   # any x86-64 runs it
    core, why = _kernels({**pre, "OPENBLAS_CORETYPE": "NoSuchCore"})   # unknown: the instructions' fallback
    assert core not in ("None", "NoSuchCore")
    assert why.startswith("OPENBLAS_CORETYPE=NoSuchCore is not in force") and core in why
    fallback, _ = _kernels({**pre, "OPENBLAS_CORETYPE": ""})   # empty is a name too: the same fallback
    assert fallback == core
    assert _kernels({"LD_PRELOAD": "", "OPENBLAS_CORETYPE": "Prescott"}) == ["None", "None"]   # reference BLAS


def test_platform_line_names_the_kernels_and_a_request_not_in_force():
    import mlx.core as mx
    core = platform.openblas_core()
    line = platform.platform_line({})
    assert line.startswith(f"mlx {mx.__version__}, device {mx.default_device()}, ")
    assert line.endswith(platform.describe_blas(core))
    if core is None:
        pytest.skip("no OpenBLAS loaded: no kernel set to ask for")
    assert "not in force" not in platform.platform_line({"OPENBLAS_CORETYPE": core})
    asked = platform.platform_line({"OPENBLAS_CORETYPE": "NoSuchCore"})
    assert "OPENBLAS_CORETYPE=NoSuchCore is not in force" in asked and f"runs its {core} kernels" in asked


AVX2_ONLY = frozenset({"pni", "ssse3", "sse4_2", "avx", "avx2", "fma"})      # an AMD EPYC family 25 (Zen 3)


def test_kernels_the_cpu_lacks_are_named_with_the_sets_it_runs():
    """Debian's OpenBLAS runs a forced SkylakeX on an AVX2-only CPU and dies at the first matmul
    (SIGILL, measured on an AMD EPYC family 25): the message names the missing instructions and the
    sets that would run; nothing is said where the CPU has them, or where the set or flags are unknown."""
    why = platform.kernels_unsupported("SkylakeX", AVX2_ONLY, env={"OPENBLAS_CORETYPE": "SkylakeX"})
    assert why.startswith("OpenBLAS runs its SkylakeX kernels (OPENBLAS_CORETYPE=SkylakeX), which need avx512bw")
    assert "avx512f" in why and "illegal instruction" in why and "Haswell, Zen" in why
    assert "avx512_bf16" in platform.kernels_unsupported("Cooperlake", AVX2_ONLY | platform._AVX512, env={})
    assert platform.kernels_unsupported("SkylakeX", AVX2_ONLY | platform._AVX512, env={}) is None
    assert platform.kernels_unsupported("Zen", AVX2_ONLY, env={}) is None
    assert platform.kernels_unsupported("NoSuchCore", AVX2_ONLY, env={}) is None
    unasked = platform.kernels_unsupported("Haswell", frozenset({"pni"}), env={})
    assert unasked.startswith("OpenBLAS runs its Haswell kernels, which need avx2, fma")
    assert unasked.endswith('Ask for a set this CPU runs (Prescott); docs/platform.md, "Which kernels run"')


def test_every_entry_point_stops_before_a_matmul_on_kernels_the_cpu_lacks(monkeypatch):
    monkeypatch.setattr(platform, "openblas_core", lambda: "SkylakeX")
    monkeypatch.setattr(platform, "cpu_flags", lambda: AVX2_ONLY)
    monkeypatch.setenv("PREFIX_TRIE_DEVICE", "")
    with pytest.raises(SystemExit, match="needs? avx512bw"):
        platform.apply_device_env()                     # conftest, fuzz, the runners
    monkeypatch.setenv("SOME_GUARD", "1")
    with pytest.raises(SystemExit, match="illegal instruction"):
        platform.reexec_with_openblas("fuzz", guard="SOME_GUARD")    # bench, serve, the CLI, fuzz
    monkeypatch.setattr(platform, "cpu_flags", lambda: AVX2_ONLY | platform._AVX512)
    platform.apply_device_env()
    platform.reexec_with_openblas("fuzz", guard="SOME_GUARD")


def test_cpu_flags_reads_the_first_flags_line(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse pni avx2 fma\n\n"
                 "processor\t: 1\nflags\t\t: fpu\n")
    assert platform.cpu_flags(str(f)) == {"fpu", "sse", "pni", "avx2", "fma"}
    assert platform.cpu_flags(str(tmp_path / "absent")) is None
