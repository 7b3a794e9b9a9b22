"""The exceptions minicavs raises.

Every error a user can cause derives from :class:`MinicavsError`, so ``except mc.MinicavsError``
catches them all; each also derives from the built-in exception a Python user would expect
(``ValueError`` for bad shapes, ``TypeError`` for bad dtypes), so generic handlers keep working.
"""


class MinicavsError(Exception):
    """Base class of every error minicavs raises on purpose."""


class ShapeError(MinicavsError, ValueError):
    """An op was given arrays whose shapes do not fit together."""


class DTypeError(MinicavsError, TypeError):
    """An op was given arrays whose dtypes (or devices) do not fit together."""


class UnsupportedError(MinicavsError, TypeError):
    """An operation or argument a Python, NumPy or PyTorch user may expect that minicavs does
    not take (item assignment on an immutable Tensor, bitwise operators on numbers, a
    non-Module in a Sequential, ...); the message says what to use instead."""


class DeviceError(MinicavsError, RuntimeError):
    """The requested device cannot be used (CuPy or a GPU is missing)."""


class GraphError(MinicavsError, ValueError):
    """An input graph, a traced graph or a vertex function is malformed."""


class TracedBranchError(GraphError):
    """Python control flow (``if``, ``while``) asked for the truth value of a traced value,
    which has none while tracing."""


class GradientCheckError(MinicavsError, AssertionError):
    """Analytic and numerical gradients disagree (raised by ``gradcheck``)."""


class CheckpointError(MinicavsError, ValueError):
    """A checkpoint cannot be written or does not match the model it is loaded into."""


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint could not be written (a missing directory, no permission, a full disk);
    the message names the path given. The previous file at that path is left intact."""


class IndexRangeError(MinicavsError, IndexError):
    """An index (a row, a child, a label) is outside the range it must lie in."""


class DistributedError(MinicavsError, RuntimeError):
    """Data-parallel ranks cannot work together: MPI or NCCL is missing, the ranks disagree
    (parameters, batches), or a collective did not complete within its timeout."""


class KernelCompileError(MinicavsError, RuntimeError):
    """A kernel source did not compile (NVRTC or the g++ shim); carries the log and the source."""

    def __init__(self, message, log="", source=""):
        super().__init__(message)
        self.log = log
        self.source = source


class ToolchainError(DeviceError):
    """A compiler the CUDA layer needs (NVRTC, or g++ for the CPU shim) cannot be found."""


class ArgumentError(MinicavsError, ValueError, TypeError):
    """An argument of a public function has a value or type it cannot take (a negative size, a
    NaN learning rate, a string for a number, a path that cannot be written); the message names
    the argument. Both ``except ValueError`` and ``except TypeError`` catch it."""


class OutOfMemoryError(MinicavsError, MemoryError):
    """A batch needs more memory than the budget allows or than could be allocated; the message
    names the buffer, the batch's size and what to reduce."""


class InPlaceModificationError(MinicavsError, RuntimeError):
    """A tensor that backward needs was changed in place after the forward pass saved it."""


class NonFiniteError(MinicavsError, FloatingPointError):
    """Debug mode found a NaN or an infinity: the message names the op, the user's line and,
    inside a vertex function, the sample, vertex and level."""
