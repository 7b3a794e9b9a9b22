"""Matrix products on the GPU through cuBLAS itself: ``matmul(xp, a, b, out)``.

CuPy's ``matmul`` costs tens of microseconds of host time a call (an H100's profile, run 6 in
README.md: 52 µs, the largest host cost of a Tree-LSTM level step), and it copies an operand
that is a window of a wider array (some of its columns) before the product. cuBLAS takes such
an operand as it is: a row-major matrix whose rows are ``ld`` elements apart is, read
column-major, its transpose with leading dimension ``ld``. So ``C = A·B`` (row-major) is the
column-major ``Cᵀ = Bᵀ·Aᵀ``, one ``cublasSgemm``/``cublasDgemm`` through CuPy's binding with
the operands' own strides. What that cannot take — another dtype, an operand whose rows or
columns are not contiguous, an empty product, an output that overlaps an operand — goes to
``xp.matmul``. The emulated device (``emulated.py``) runs the same call on the host, column-major
as cuBLAS reads it, so the operand order and leading dimensions are checked without a GPU.
"""

import numpy as np

from .kernels import device_address

_GEMM = {np.dtype(np.float32): "sgemm", np.dtype(np.float64): "dgemm"}
# alpha = 1 and beta = 0 per dtype, as host pointers (cuBLAS's host pointer mode, CuPy's)
_SCALARS = {d: (np.ones(1, d), np.zeros(1, d)) for d in _GEMM}
_ALPHA_BETA = {d: (one.ctypes.data, zero.ctypes.data) for d, (one, zero) in _SCALARS.items()}
OP_N, OP_T = 0, 1  # cublasOperation_t
_INT_MAX = 2**31 - 1


def operand(x):
    """``(op, ld)``: how cuBLAS reads the 2-D array ``x`` as the column-major ``xᵀ`` — a
    row-major matrix with rows ``ld`` elements apart as is (``OP_N``), the transpose of one
    (``x.T`` row-major) transposed (``OP_T``); None for any other layout."""
    rows, cols = x.shape
    item = x.itemsize
    s0, s1 = x.strides
    if s0 % item or s1 % item:
        return None
    s0, s1 = s0 // item, s1 // item
    if (s1 == 1 or cols == 1) and (rows == 1 or s0 >= max(cols, 1)):
        return OP_N, s0 if rows > 1 else max(cols, 1)
    if (s0 == 1 or rows == 1) and (cols == 1 or s1 >= max(rows, 1)):
        return OP_T, s1 if cols > 1 else max(rows, 1)
    return None


def matmul(xp, a, b, out=None):
    """``a @ b`` for 2-D CuPy arrays, into ``out`` (rows contiguous; allocated if None) by one
    cuBLAS call where the layouts allow, else by ``xp.matmul``."""
    key = (a.dtype, b.dtype, a.shape, a.strides, b.shape, b.strides) + (
        (None,) if out is None else (out.dtype, out.shape, out.strides))
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) > _PLANS_KEPT:
            _plans.clear()
        plan = _plans[key] = _plan(a, b, out)
    if plan:
        gemm, (m, n, k), (op_a, ld_a, span_a), (op_b, ld_b, span_b), (ld_c, span_c), \
            (alpha, beta) = plan
        if out is None:
            out = xp.empty((m, n), a.dtype)
        address = device_address(xp)
        pa, pb, pc = address(a), address(b), address(out)
        if not (pa < pc + span_c and pc < pa + span_a or
                pb < pc + span_c and pc < pb + span_b):  # (cuBLAS must not read what it writes)
            # Cᵀ (n x m) = Bᵀ (n x k) · Aᵀ (k x m), column-major: b first
            getattr(xp.cuda.cublas, gemm)(xp.cuda.get_cublas_handle(), op_b, op_a, n, m, k,
                                          alpha, pb, ld_b, pa, ld_a, beta, pc, ld_c)
            return out
    return xp.matmul(a, b) if out is None else xp.matmul(a, b, out=out)


def ones_row(xp, n, dtype):
    """A ``(1, n)`` row of ones on the current device, for column sums as one product (ones · X,
    a bias's gradient): one vector per device and dtype, kept and grown as longer ones are asked
    for (never written: readers share it)."""
    key = (xp.cuda.Device().id, np.dtype(dtype))
    ones = _ones.get(key)
    if ones is None or ones.shape[0] < n:
        ones = _ones[key] = xp.ones(max(n, 2 * (0 if ones is None else ones.shape[0])), dtype)
    return ones[:n].reshape(1, n)


_ones = {}  # (device, dtype) -> the longest row of ones made
_plans = {}  # the operands' dtypes, shapes and strides -> the call's constants, or False
_PLANS_KEPT = 4096


def _plan(a, b, out):
    """What :func:`matmul` passes cuBLAS for operands (and an output; None: a new one) of these
    dtypes, shapes and strides: the gemm, the sizes, each operand's (op, ld, bytes spanned), the
    output's (ld, bytes), alpha and beta; False where one call cannot do it."""
    gemm = _GEMM.get(a.dtype)
    if gemm is None or a.ndim != 2 or b.ndim != 2 or b.dtype != a.dtype or \
            b.shape[0] != a.shape[1] or not 0 < min(a.shape + b.shape) or \
            max(a.shape + b.shape) > _INT_MAX:
        return False
    (m, k), n = a.shape, b.shape[1]
    if out is None:
        out = np.empty((m, n), a.dtype)  # (the layout of the array matmul makes)
    if out.dtype != a.dtype or out.shape != (m, n):
        return False
    layouts = operand(a), operand(b), operand(out)
    if None in layouts or layouts[2][0] != OP_N or max(ld for _, ld in layouts) > _INT_MAX:
        return False
    (op_a, ld_a), (op_b, ld_b), (_, ld_c) = layouts
    return (gemm, (m, n, k), (op_a, ld_a, _span(a)), (op_b, ld_b, _span(b)),
            (ld_c, _span(out)), _ALPHA_BETA[a.dtype])


def _span(x):
    """The bytes from ``x``'s first element to past its last (its strides are not negative)."""
    return sum((n - 1) * s for n, s in zip(x.shape, x.strides)) + x.itemsize
