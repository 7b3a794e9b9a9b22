"""The native CPU toolchain: generated C++ compiled once and cached on disk (build.py), the BLAS
NumPy/SciPy ship (blas.py), and hand-written kernels called on NumPy arrays (kernels.py). The
Program backend that generates the level loops is ``minicavs/runtime/native.py``. See
docs/native.md."""

from .build import unavailable  # noqa: F401
