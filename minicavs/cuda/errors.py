"""Error helpers of the CUDA layer; the error classes themselves live in minicavs/errors.py."""

from ..errors import KernelCompileError, ToolchainError  # noqa: F401 (re-exported)


def numbered(source):
    """``source`` with 1-based line numbers, the form compiler logs refer to."""
    lines = source.splitlines()
    width = len(str(len(lines)))
    return "\n".join(f"{n:>{width}} | {line}" for n, line in enumerate(lines, 1))
