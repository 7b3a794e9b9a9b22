"""Host memory (minicavs/cpu/malloc.py): glibc keeps freed blocks for reuse once minicavs is
imported, MINICAVS_MALLOC=system keeps its defaults, and a bad value names the variable."""

import os
import platform
import subprocess
import sys

import pytest

_REPORT = "import minicavs.cpu.malloc as m, minicavs; print(m.state)"


def _state(value):
    env = dict(os.environ)
    env.pop("MINICAVS_MALLOC", None)
    if value is not None:
        env["MINICAVS_MALLOC"] = value
    return subprocess.run([sys.executable, "-c", _REPORT], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_importing_minicavs_keeps_freed_blocks_for_reuse():
    result = _state(None)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "glibc, freed blocks below 32 MiB kept for reuse"


def test_system_keeps_the_defaults_and_a_bad_value_names_the_variable():
    result = _state("system")
    assert result.returncode == 0 and "MINICAVS_MALLOC=system" in result.stdout
    result = _state("fast")
    assert result.returncode != 0
    assert "MINICAVS_MALLOC='fast': expected one of ('cached', 'system')" in result.stderr
