"""A level's launches issued from C: the GPU level loop without Python per launch (issue 41).

On a GPU the level loop is bound by the host: a Tree-LSTM level step is about 100 µs of host
time against a few µs of device work (an H200, ``benchmarks/cuda_profile.py``), of which
``cuLaunchKernel`` itself takes 4–6 µs a launch and cuBLAS 11–35 µs a product; the rest is
Python around them. So a level plan whose launches are all known kernels and products is
written once as a table of integers (``runtime/level_launches.py``) and issued by the small
C function below, which computes each argument from the level's first row and row count::

    for each operation of the level's table:
        LAUNCH:  f, row width, arguments -> cuLaunchKernel(f, blocks, 256, params)
        GEMM:    dtype, operations, sizes, operands -> cublas{S,D}gemm_v2(handle, ...)
        PRODUCT: up to m rows a LAUNCH of our product kernel (products.py), else a GEMM
        GEMM_INNER: dtype, operations, sizes, operands -> a gemm over the rows (Xᵀ·G)

An argument is ``table[slot] + offset + lo * row_bytes`` (a pointer: the call's arrays are in
``table``, filled once a call), the level's row count ``n``, its first row ``lo``, or a number. The C code
calls the driver through function pointers, so the same code runs on the emulated device,
whose stand-ins for ``cuLaunchKernel`` and the gemms (``emulated.py``) run each kernel through
the g++ shim and each product on the host, counting them as a GPU would.
"""

import ctypes
import functools
import os

import numpy as np

from . import ahead
from .kernels import BLOCK_SIZE, MAX_BLOCKS
from .blas import _ALPHA_BETA, _GEMM
from ..errors import ArgumentError, DeviceError, KernelCompileError, ToolchainError

# operations (PRODUCT: our kernel up to some rows, else GEMM; GEMM_INNER: the rows are the
# product's inner dimension, a shared operand's gradient Xᵀ·G over a batch's rows)
LAUNCH, GEMM, PRODUCT, GEMM_INNER = 0, 1, 2, 3
ADD = 2  # added to a GEMM's dtype: C += A·B (β = 1)
POINTER, ROWS, FIRST, CONST = 0, 1, 2, 3  # argument kinds: a pointer, n, lo, a number
MAX_ARGS = 64

SOURCE = r"""// minicavs: a level's launches issued from C (minicavs/cuda/issuer.py)
#include <cstdint>
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
typedef int (*gemm_t)(void *, int, int, int, int, int, const void *, const void *, int,
                      const void *, int, const void *, void *, int);

struct Context {  // (issuer.Context)
    launch_t launch;
    gemm_t gemm[2];  // float32, float64
    void *handle, *stream;
    const void *alpha[2], *beta[2];
    const int64_t *table;
    int64_t block, max_blocks;
};

static inline int64_t address(const int64_t *at, const int64_t *table, int64_t lo) {
    return table[at[0]] + at[2] + lo * at[1];  // (slot, row bytes, offset)
}

// LAUNCH: f, row width, count, then per argument (kind, slot or number, row bytes, offset)
static int launch(const int64_t *code, int64_t *at, int64_t lo, int64_t n, const Context *c) {
    const int64_t *l = code + *at;
    void *f = (void *)l[0];
    const int64_t width = l[1], count = l[2];
    *at += 3 + 4 * count;
    int64_t cells[64];
    void *params[64];
    for (int64_t i = 0; i < count; ++i) {
        const int64_t *arg = l + 3 + 4 * i;
        cells[i] = arg[0] == 0 ? address(arg + 1, c->table, lo) : arg[0] == 1 ? n
                 : arg[0] == 2 ? lo : arg[1];
        params[i] = &cells[i];
    }
    const int64_t total = n * width;
    if (total == 0) return 0;
    int64_t blocks = (total + c->block - 1) / c->block;
    if (blocks > c->max_blocks) blocks = c->max_blocks;
    return c->launch(f, (unsigned)blocks, 1, 1, (unsigned)c->block, 1, 1, 0, c->stream, params,
                     nullptr);
}

// GEMM: dtype (+ ADD: C += A B), op_b, op_a, N, K, B (3), ldb, A (3), lda, C (3), ldc; the
// level's n rows
static int gemm(const int64_t *code, int64_t *at, int64_t lo, int64_t n, const Context *c) {
    const int64_t *g = code + *at;
    *at += 17;
    if (n == 0) return 0;
    const int dt = (int)(g[0] & 1);
    return c->gemm[dt](c->handle, (int)g[1], (int)g[2], (int)g[3], (int)n, (int)g[4],
                       c->alpha[dt], (const void *)address(g + 5, c->table, lo), (int)g[8],
                       (const void *)address(g + 9, c->table, lo), (int)g[12],
                       g[0] & 2 ? c->alpha[dt] : c->beta[dt],  // (ADD: beta is alpha's one)
                       (void *)address(g + 13, c->table, lo), (int)g[16]);
}

// GEMM_INNER: as GEMM, the n rows the inner dimension and g[4] the output's rows (Xᵀ·G)
static int gemm_inner(const int64_t *code, int64_t *at, int64_t lo, int64_t n, const Context *c) {
    const int64_t *g = code + *at;
    *at += 17;
    if (n == 0) return 0;
    const int dt = (int)g[0];
    return c->gemm[dt](c->handle, (int)g[1], (int)g[2], (int)g[3], (int)g[4], (int)n,
                       c->alpha[dt], (const void *)address(g + 5, c->table, lo), (int)g[8],
                       (const void *)address(g + 9, c->table, lo), (int)g[12], c->beta[dt],
                       (void *)address(g + 13, c->table, lo), (int)g[16]);
}

// 0, or (the failed operation + 1) << 32 | the driver's or cuBLAS's status
extern "C" int64_t minicavs_issue_level(const int64_t *code, int64_t lo, int64_t n,
                                        const Context *c) {
    const int64_t ops = code[0];
    int64_t at = 1;
    for (int64_t op = 0; op < ops; ++op) {
        const int64_t kind = code[at++];
        int status;
        if (kind == 0) {
            status = launch(code, &at, lo, n, c);
        } else if (kind == 1) {
            status = gemm(code, &at, lo, n, c);
        } else if (kind == 3) {
            status = gemm_inner(code, &at, lo, n, c);
        } else {  // PRODUCT: at most this many rows: the LAUNCH that follows, else the GEMM
            const int64_t most = code[at++];
            if (n <= most) {
                status = launch(code, &at, lo, n, c);
                at += 17;
            } else {
                at += 3 + 4 * code[at + 2];  // (past the LAUNCH)
                status = gemm(code, &at, lo, n, c);
            }
        }
        if (status) return ((op + 1) << 32) | (uint32_t)status;
    }
    return 0;
}

// Several levels in a row, each (code, lo, n): 0, or the failed level's status (its index in
// *failed)
extern "C" int64_t minicavs_issue_levels(const int64_t *levels, int64_t count, const Context *c,
                                         int64_t *failed) {
    for (int64_t i = 0; i < count; ++i) {
        const int64_t *l = levels + 3 * i;
        const int64_t status = minicavs_issue_level((const int64_t *)l[0], l[1], l[2], c);
        if (status) {
            *failed = i;
            return status;
        }
    }
    return 0;
}
"""


class Context(ctypes.Structure):
    _fields_ = [("launch", ctypes.c_void_p), ("gemm", ctypes.c_void_p * 2),
                ("handle", ctypes.c_void_p), ("stream", ctypes.c_void_p),
                ("alpha", ctypes.c_void_p * 2), ("beta", ctypes.c_void_p * 2),
                ("table", ctypes.c_void_p), ("block", ctypes.c_int64),
                ("max_blocks", ctypes.c_int64)]


def enabled():
    """Whether level loops are issued from C (``MINICAVS_CUDA_ISSUER``: ``c``, the default, or
    ``python``: every launch from the interpreter, as before)."""
    choice = os.environ.get("MINICAVS_CUDA_ISSUER", "c").strip().lower() or "c"
    if choice not in ("c", "python"):
        raise ArgumentError(f"MINICAVS_CUDA_ISSUER={choice!r}: expected 'c' (a level's launches "
                          f"issued from C) or 'python' (from the interpreter)")
    return choice == "c"


@functools.lru_cache(maxsize=None)
def _library():
    """The compiled issuer (:func:`driver` checks first that native code is on)."""
    from ..cpu import build

    lib, _ = build.build(SOURCE, "cuda_issuer", origin="minicavs/cuda/issuer.py")
    issue = lib.minicavs_issue_level
    issue.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    issue.restype = ctypes.c_int64
    many = lib.minicavs_issue_levels
    many.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    many.restype = ctypes.c_int64
    return issue, many


class Driver:
    """What the C issuer calls on this device: ``cuLaunchKernel`` and the cuBLAS gemms (on the
    emulated device their stand-ins), and how to name a compiled kernel to it."""

    def __init__(self, xp):
        self.xp, self._constant = xp, None
        self.issue_level, self.issue_many = _library()
        self.emulated = getattr(xp, "emulated", False)
        if self.emulated:
            from . import emulated

            self.launch, self.gemms = emulated.c_launch, emulated.c_gemms
            self.function = lambda kernel: emulated.c_function(ahead.ready(kernel))
        else:
            xp.cuda.get_cublas_handle()  # (CuPy loads cuBLAS when it first makes a handle)
            self.launch, self.gemms = _cuda_entry_points()
            self.function = lambda kernel: _cupy_function(ahead.ready(kernel))

    def issue(self, table, lo, n, context):
        """Issue one level's :class:`Table`; a failed launch or product raises, naming it."""
        self.raise_on(self.issue_level(table.code_address, lo, n, context.address), table, lo, n)

    def issue_levels(self, levels, context):
        """Issue several levels' tables in order in one C call: ``levels`` is a list of
        ``(table, lo, n)``."""
        if len(levels) == 1:
            return self.issue(*levels[0], context)
        rows = np.array([(table.code_address, lo, n) for table, lo, n in levels], np.int64)
        failed = ctypes.c_int64(0)
        status = self.issue_many(rows.ctypes.data, len(levels), context.address,
                                 ctypes.addressof(failed))
        if status:
            self.raise_on(status, *levels[failed.value])

    def raise_on(self, status, table, lo, n, what="level loop"):
        if status:
            op, error = (status >> 32) - 1, status & 0xFFFFFFFF
            if self.emulated:  # (a stand-in's own error, e.g. the shim's: raised as it is)
                from . import emulated

                if emulated.c_failure:
                    raise emulated.c_failure.pop()
            raise DeviceError(f"{what}: {table.describe(op)} failed on rows {lo}.."
                              f"{lo + n - 1} (status {error} from the CUDA driver or cuBLAS)")

    def context(self, table):
        """The issuer's :class:`Context` for a call whose pointer table is ``table``."""
        xp = self.xp
        entries = (self.launch, *self.gemms)
        if self._constant is None or self._constant[0] != entries:  # (what no call changes)
            scalars = [_ALPHA_BETA[np.dtype(d)] for d in (np.float32, np.float64)]
            self._constant = entries, bytes(Context(
                self.launch, (ctypes.c_void_p * 2)(*self.gemms), None, None,
                (ctypes.c_void_p * 2)(*[a for a, _ in scalars]),
                (ctypes.c_void_p * 2)(*[b for _, b in scalars]), None, BLOCK_SIZE, MAX_BLOCKS))
        context = Context.from_buffer_copy(self._constant[1])
        context.handle = handle = xp.cuda.get_cublas_handle()
        context.stream = stream = xp.cuda.get_current_stream().ptr
        if not self.emulated:  # (CuPy's binding sets it before each call)
            xp.cuda.cublas.setStream(handle, stream)
        context.table = table.ctypes.data
        context.address = ctypes.addressof(context)
        return context


def check_arguments(kernel, count):
    """A table passes ``count`` arguments to ``kernel`` (a RawKernel): that must be its
    parameter count, read from its source (cuLaunchKernel cannot tell, and reads past them)."""
    from .shim import parse_kernels

    params = parse_kernels(kernel.code).get(kernel.name)
    if params is None or len(params) != count:
        raise KernelCompileError(f"C issuer: kernel {kernel.name} takes "
                                 f"{'?' if params is None else len(params)} arguments, a "
                                 f"table passes {count}")


class Table:
    """A level plan's operations (``runtime/level_launches.py`` writes them), and
    ``describe(op)``: what operation ``op`` is, for an error."""

    def __init__(self, code, describe):
        self.code, self.describe = code, describe
        self.code_address = code.ctypes.data


@functools.lru_cache(maxsize=None)
def driver(xp):
    """The :class:`Driver` of array module ``xp``, or why levels cannot be issued from C here
    (a string: native code off, or the CUDA driver's or cuBLAS's library not found)."""
    from ..cpu import build

    reason = build.unavailable()
    if reason is not None:
        return f"the C issuer needs native code ({reason})"
    try:
        return Driver(xp)
    except (OSError, AttributeError) as error:
        return f"cuLaunchKernel or the cuBLAS gemms not found ({error})"
    except StopIteration:
        return "no libcublas loaded in this process"
    except (KernelCompileError, ToolchainError) as error:
        return f"the C issuer did not build ({str(error).splitlines()[0]})"


def _cuda_entry_points():
    """``cuLaunchKernel`` and ``cublas{S,D}gemm_v2`` of the libraries CuPy loaded."""
    cuda = ctypes.CDLL("libcuda.so.1")
    with open("/proc/self/maps") as maps:
        path = next(line.split()[-1] for line in maps
                    if "/libcublas.so" in line and "libcublasLt" not in line)
    cublas = ctypes.CDLL(path)
    address = (lambda f: ctypes.cast(f, ctypes.c_void_p).value)  # noqa: E731
    return (address(cuda.cuLaunchKernel),
            [address(getattr(cublas, f"cublas{c}gemm_v2")) for c in "SD"])


def _cupy_function(kernel):
    """A compiled ``cupy.RawKernel``'s ``CUfunction`` (compiling it now if it was not)."""
    return int(kernel.kernel.ptr)


def gemm_dtype(dtype):
    """The issuer's index of a product's dtype (float32 0, float64 1), or None."""
    return {"sgemm": 0, "dgemm": 1}.get(_GEMM.get(np.dtype(dtype)))
