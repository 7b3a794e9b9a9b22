"""The benchmark peers as test oracles: PyTorch where it is installed (a benchmark-only extra,
never needed by the library or its tests)."""

import pytest


def torch_or_skip():
    """PyTorch, or a skip that says why: the comparison needs it, and every test that compares
    with it has a check against NumPy, a loop definition or finite differences that runs
    without it."""
    return pytest.importorskip(
        "torch", reason="PyTorch is a benchmark-only extra, not installed here "
                        "(pip install -e '.[bench]'); the checks against NumPy and finite "
                        "differences run without it")
