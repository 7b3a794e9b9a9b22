"""``mc.set_flush_denormal``: subnormal floats flushed to zero on the calling thread, the
native team and OpenBLAS's threads, and kept again when switched off (``cpu/denormals.py``).
Each check runs in a child process: the setting belongs to a process's threads."""

import os
import platform
import subprocess
import sys
import textwrap

import pytest

import minicavs as mc
from minicavs.cpu import build, denormals

needs_flush = pytest.mark.skipif(not denormals.supported(),
                                 reason="flushing needs an x86 CPU and native code "
                                        f"({build.unavailable() or platform.machine()})")


def _run(code, **env):
    return " ".join(_run_lines(code, **env)).split()


CHECK = """
    import numpy as np, minicavs as mc
    from minicavs.cpu import denormals, products
    tiny = np.full((600, 300), 1e-39, np.float32)  # subnormal (below 1.2e-38)
    ones = np.ones((300, 300), np.float32)

    def results():
        with products.team_products():
            team = products.team_matmul(tiny, ones, measured=False)
        return [float((tiny * np.float32(2))[0, 0]),  # a ufunc on this thread
                float((tiny @ ones).max()),  # NumPy's product, on OpenBLAS's threads
                float(team.max()) if team is not None else -1.0]  # the native team's
    print(*results(), denormals.flushes_denormal())
    print(mc.set_flush_denormal(True), *results(), denormals.flushes_denormal())
    print(mc.set_flush_denormal(False), *results(), denormals.flushes_denormal())
"""


@needs_flush
def test_flushing_zeroes_subnormals_on_every_thread_and_switches_back():
    before, on, off = (line.split() for line in _run_lines(CHECK, OMP_NUM_THREADS="2"))
    kept = [pytest.approx(2e-39, rel=1e-6), pytest.approx(300e-39, rel=1e-5),
            pytest.approx(300e-39, rel=1e-5)]

    def values(line):  # (the team's product is -1 where no team ran: one core free)
        return [float(v) for v in line if v not in ("True", "False")]

    def expect(line, wanted):
        got = values(line)
        return [w for g, w in zip(got, wanted) if g != -1.0], [g for g in got if g != -1.0]

    wanted, got = expect(before, kept)
    assert got == wanted and before[-1] == "False"
    assert on[0] == "True" and on[-1] == "True"
    assert set(values(on[1:-1])) <= {0.0, -1.0} and 0.0 in values(on[1:-1])
    wanted, got = expect(off[1:], kept)
    assert off[0] == "True" and off[-1] == "False" and got == wanted


def _run_lines(code, **env):
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=300, env=dict(os.environ, **env))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()


def test_off_where_native_code_is_off_and_nothing_changes():
    out = _run("""
        import numpy as np, minicavs as mc
        print(mc.set_flush_denormal(True), float(np.float32(1e-39) * np.float32(2)))
    """, MINICAVS_NATIVE="0")
    assert out[0] == "False" and float(out[1]) == pytest.approx(2e-39, rel=1e-6)


def test_a_setting_that_is_not_a_bool_is_refused_naming_it():
    with pytest.raises(mc.ArgumentError, match=r"set_flush_denormal\(enabled\).*'yes'"):
        mc.set_flush_denormal("yes")
