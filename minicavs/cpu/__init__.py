"""The native CPU backend: a Program's level loop compiled to C++ (codegen.py), built once and
cached on disk (build.py), calling the BLAS SciPy ships (blas.py); native.py decides, per
program, whether it or the NumPy interpreter runs. See docs/native.md."""

from .native import backend_of, interpreter_only, unavailable  # noqa: F401
