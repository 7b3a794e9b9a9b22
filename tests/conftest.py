"""Test configuration: hypothesis profiles and the ``gpu`` marker.

The default profile is ``ci`` (15 examples a property, derandomised): the README's test command
and CI (``.ci/run``) run the same suite, on every core (``-n auto``, pytest-xdist): on 2 cores
3.5 minutes, 7 the first time (it compiles the native loops into the suite's own cache, below).
``dev`` explores more
(``HYPOTHESIS_PROFILE=dev``: 60 examples, random); ``gpu`` is for the rare machine with a GPU:
``HYPOTHESIS_PROFILE=gpu pytest -m gpu``.
"""

import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=15, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("gpu", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The suite keeps its compiled code and its kernel measurements (cpu/calibrate.py) apart from
# the user's: a choice measured while the tests load the cores (two workers under -n auto)
# must not pick the kernels of the user's own runs. (Inherited by the workers and by the
# processes the tests start; a folder of the user's MINICAVS_CACHE_DIR where that is set.)
_cache = os.environ.get("MINICAVS_CACHE_DIR", "").strip()
if os.path.basename(_cache) != "minicavs-tests":
    _base = _cache or os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                        ".cache")
    os.environ["MINICAVS_CACHE_DIR"] = os.path.join(_base, "minicavs-tests")


def pytest_collection_modifyitems(config, items):
    from minicavs.backend import gpu_available

    if gpu_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU and CuPy; none is visible on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seeded_cpu():
    """Every test starts on the CPU with fixed seeds, whatever the previous test did."""
    import minicavs as mc

    mc.set_device("cpu")
    mc.seed(0)
    np.random.seed(0)
    yield


@pytest.fixture(params=["native", "interpreter"])
def cpu_backend(request):
    """Run the test once with vertex functions on the native C++ level loops (minicavs/cpu) and
    once on the NumPy interpreter: the property tests hold on both backends. Where no native
    code can run (no compiler, MINICAVS_NATIVE=0) the native case says so and skips."""
    from minicavs.cpu import unavailable
    from minicavs.runtime import interpreter_only

    if request.param == "interpreter":
        with interpreter_only():
            yield request.param
        return
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"the native CPU backend is off here: {reason}")
    yield request.param


def pytest_terminal_summary(terminalreporter):
    """How many code blocks of the documentation ran (tests/test_docs.py)."""
    counts = getattr(sys.modules.get("test_docs"), "COUNTS", None)
    if counts and counts["pages"]:
        terminalreporter.write_line(
            f"docs: {counts['python']} python blocks and {counts['figure']} figures ran on "
            f"{counts['pages']} pages; {counts['not_run']} blocks marked not to run")
