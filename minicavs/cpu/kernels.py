"""Hand-written native kernels for eager work that dominates real models outside F.

Softmax cross-entropy over a vocabulary is a language model's hot loop: NumPy spends five
single-threaded passes over the logits (max, subtract, exp, sum, log) and a temporary as large
as them. Here each row is two passes — its maximum, then ``sum(exp(x - max))`` with libmvec's
vector ``exp`` — and rows are split between cores; the gradient is one more pass writing
``softmax * g`` (minus ``g`` at the label). The ops call these on NumPy arrays
(``ops/loss.py``) and keep their NumPy form for CuPy, for other dtypes, and where native code
is off (``build.unavailable()``).

im2col and col2im (``unfold``/``fold``, the two primitives of ``ops/conv.py``) are plain loops
here: an output row per inner loop, one core (an OpenMP team beside OpenBLAS's threads, used
by the products between them, measured 2-6× slower on a busy 2-core machine). On LeNet's
second layer: col2im 0.15 ms, against 0.79 ms for NumPy's strided adds; im2col 0.16 ms.

The C++ is ``kernel_source.py``; the team's size and state, ``team.py``.
"""

import contextlib
import ctypes
import threading

import numpy as np

from . import build, calibrate, isa
from .kernel_source import SOURCE as _SOURCE
from .team import (in_team_products, one_blas_thread, set_blas_threads,  # noqa: F401
                   state as _team, team_size)  # (the API)

_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def _library():
    return build.module_library(_SOURCE, "kernels", "minicavs/cpu/kernels.py")


def _usable(*arrays):
    return all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays)


_P, _I = ctypes.c_void_p, ctypes.c_int64  # a pointer (passed as an int), a size
_SIGNATURES = {  # the hot calls' argument types: declared, plain ints pass without wrappers
    "lstm_cell": (_P, _P, _P, _I, _I, _I, _I, _P),
    "lstm_cell_grad": (_P, _P, _P, _I, _P, _P, _I, _I, _I, _P),
    "scatter_add": (_P, _P, _P, _I, _I, _I, _I),
    "xent": (_P, _P, _I, _I, _P, ctypes.c_int),
    "xent_grad": (_P, _P, _P, _I, _I, _P, ctypes.c_int),
}
_typed_functions = {}


def _function(kernel, suffix):
    """The C function ``<kernel>_<suffix>`` with its argument types declared (``_SIGNATURES``),
    or None without native code; looked up once (these run thousands of times a step)."""
    name = f"{kernel}_{suffix}"
    function = _typed_functions.get(name)
    if function is None:
        lib = _library()
        if lib is None:
            return None
        function = _typed_functions[name] = _typed(lib, name, _SIGNATURES[kernel])
    return function


def softmax_cross_entropy(logits, labels):
    """Per-row losses as the op computes them, or None (the caller's NumPy form runs). The
    labels must already be checked to lie in range."""
    suffix = _SUFFIX.get(getattr(logits, "dtype", None))
    if suffix is None or logits.ndim == 0 or logits.size == 0 or not _usable(logits, labels) \
            or labels.dtype != np.int64:
        return None
    xent = _function("xent", suffix)
    if xent is None:
        return None
    cols = logits.shape[-1]
    rows = logits.size // cols
    loss = np.empty(logits.shape[:-1], dtype=logits.dtype)
    xent(data_address(logits), data_address(labels), rows, cols, data_address(loss),
         calibrate.threads_for(logits.size))
    return loss


def softmax_cross_entropy_grad(logits, labels, g):
    """``(softmax(logits) - onehot(labels)) * g[..., None]``, or None (NumPy runs)."""
    suffix = _SUFFIX.get(getattr(logits, "dtype", None))
    if suffix is None or logits.ndim == 0 or logits.size == 0 or labels.dtype != np.int64 \
            or getattr(g, "dtype", None) != logits.dtype or g.shape != labels.shape \
            or not _usable(logits, labels, g):
        return None
    xent_grad = _function("xent_grad", suffix)
    if xent_grad is None:
        return None
    cols = logits.shape[-1]
    out = np.empty_like(logits)
    xent_grad(data_address(logits), data_address(labels), data_address(g), logits.size // cols,
              cols, data_address(out), calibrate.threads_for(logits.size))
    return out


def _lstm_operands(pre, c_prev, *more):
    """The dtype suffix, row stride of the previous cells, rows and H of an LSTM cell's
    operands as the kernels take them, or None: ``pre`` and ``more`` C-contiguous, the cells
    (rows, H) with contiguous rows at one stride (the c half of [h, c] states)."""
    dtype = getattr(pre, "dtype", None)
    suffix = _SUFFIX.get(dtype)
    k = len(c_prev)
    if suffix is None or k > 2 or type(pre) is not np.ndarray or pre.ndim == 0 \
            or pre.size == 0 or not pre.flags.c_contiguous:
        return None
    for a in c_prev:
        if getattr(a, "dtype", None) != dtype:
            return None
    for a in more:
        if type(a) is not np.ndarray or a.dtype != dtype or not a.flags.c_contiguous:
            return None
    H = pre.shape[-1] // (3 + k)
    rows = pre.size // pre.shape[-1]
    ldc = H
    if c_prev:
        ldc = _row_stride(c_prev[0], rows, H)
        if ldc is None or any(_row_stride(c, rows, H) != ldc for c in c_prev[1:]):
            return None
    return suffix, ldc, rows, H


def _row_stride(a, rows, width):
    """The stride in elements between the rows of ``a`` seen as (rows, width), or None."""
    if not isinstance(a, np.ndarray):
        return None
    if a.flags.c_contiguous:
        return width
    if a.ndim == 2 and a.shape == (rows, width) and a.strides[1] == a.itemsize \
            and a.strides[0] % a.itemsize == 0 and a.strides[0] >= width * a.itemsize:
        return a.strides[0] // a.itemsize
    return None


def lstm_cell(pre, c_prev):
    """``ops.lstm_cell``'s [h, c] in one pass over the rows, or None (NumPy runs). Shapes must
    be checked."""
    found = _lstm_operands(pre, c_prev)
    cell = found and _function("lstm_cell", found[0])
    if not cell:
        return None
    _, ldc, rows, H = found
    out = np.empty(pre.shape[:-1] + (2 * H,), pre.dtype)
    c0, c1 = _cell_addresses(c_prev)
    cell(data_address(pre), c0, c1, ldc, len(c_prev), rows, H, data_address(out))
    return out


def _cell_addresses(c_prev):
    """The previous cells' data addresses as the cell kernels take them: two, None for none."""
    k = len(c_prev)
    return (data_address(c_prev[0]) if k else None), (data_address(c_prev[1]) if k > 1 else None)


def lstm_cell_grad(pre, c_prev, out, g):
    """``ops.lstm_cell_grad``'s [∂pre, ∂c_prev…] in one pass over the rows, or None."""
    found = _lstm_operands(pre, c_prev, out, g)
    cell_grad = found and _function("lstm_cell_grad", found[0])
    if not cell_grad:
        return None
    _, ldc, rows, H = found
    k = len(c_prev)
    grads = np.empty(pre.shape[:-1] + ((3 + 2 * k) * H,), pre.dtype)
    c0, c1 = _cell_addresses(c_prev)
    cell_grad(data_address(pre), c0, c1, ldc, data_address(out), data_address(g), k, rows, H,
              data_address(grads))
    return grads


def scatter_add_rows(out, idx, values):
    """``out[idx[i]] += values[i]`` (rows; idx -1 skipped, repeats add up, in order), in place;
    False where it does not apply (the caller's NumPy form runs). ``out`` and ``values``:
    C-contiguous, or 2-D with contiguous rows at any stride (a view of some columns of a
    gradient slab). Indices must be checked."""
    suffix = _SUFFIX.get(getattr(out, "dtype", None))
    if suffix is None or values.dtype != out.dtype or out.ndim == 0 or len(idx) != len(values) \
            or idx.dtype != np.int64 or not idx.flags.c_contiguous:
        return False
    cols = out.size // out.shape[0] if out.shape[0] else 0
    ldo, ldv = _rows_of(out, cols), _rows_of(values, cols)
    if ldo is None or ldv is None or values.size != len(values) * cols:
        return False
    scatter_add = _function("scatter_add", suffix)
    if scatter_add is None:
        return False
    scatter_add(data_address(out), data_address(idx), data_address(values), len(idx), cols, ldo,
                ldv)
    return True


def _rows_of(a, cols):
    """The row stride, in elements, of ``a`` read as rows of ``cols`` contiguous elements, or
    None where it cannot be."""
    if not isinstance(a, np.ndarray):
        return None
    if a.flags.c_contiguous:
        return cols
    item = a.itemsize
    if a.ndim == 2 and a.strides[1] == item and a.strides[0] % item == 0 \
            and a.strides[0] >= cols * item:
        return a.strides[0] // item
    return None


def agenda_schedule(sig, waiting, consumer_ptr, consumers, per_sig, position, sig_start,
                    average_depth, ready, ready_count):
    """The agenda loop of ``autobatch/schedule.py`` in C (one call, no NumPy per batch): the
    batches as arrays of node ids, or None (native code is off: NumPy runs it). ``waiting``,
    ``ready`` and ``ready_count`` are worked on in place."""
    lib = _library()
    if lib is None:
        return None
    n, num_sigs = len(sig), len(sig_start) - 1
    int64 = [np.ascontiguousarray(a, dtype=np.int64) for a in
             (sig, consumer_ptr, consumers, per_sig, position, sig_start)]
    order, ends = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    priority = np.empty(num_sigs, dtype=np.float64)
    depth = np.ascontiguousarray(average_depth, dtype=np.float64)
    function = lib.agenda_schedule
    function.restype = ctypes.c_int64
    count = function(ctypes.c_int64(n), ctypes.c_int64(num_sigs), _p(int64[0]), _p(waiting),
                     _p(int64[1]), _p(int64[2]), _p(int64[3]), _p(int64[4]), _p(int64[5]),
                     _p(depth), _p(ready), _p(ready_count), _p(priority), _p(order), _p(ends))
    if count < 0:
        raise RuntimeError("agenda: nodes that never become ready (the recorded graph has a "
                           "cycle)")
    return np.split(order, ends[:count - 1]) if count else []


def _geometry(planes, size, kernel, stride, dilation, padding, out):
    """The 13 sizes the 2-D window kernels take; a 1-D window is a 2-D one of height 1."""
    pad = lambda k: (1,) * (2 - len(k)) + tuple(k)  # noqa: E731
    (H, W), (kh, kw), (sh, sw), (dh, dw), (OH, OW) = map(pad, (size, kernel, stride, dilation,
                                                               out))
    ph, pw = pad([b for b, _ in padding]) if len(padding) == 2 else (0, padding[0][0])
    return np.array([planes, H, W, kh, kw, sh, sw, dh, dw, ph, pw, OH, OW], dtype=np.int64)


def unfold(x, kernel, stride, dilation, padding, value):
    """The windows of the last 1 or 2 axes of ``x`` as ``ops/conv.py``'s ``unfold`` lays them
    out, (..., *kernel, *out), or None (NumPy runs): another dtype, 3-D windows."""
    suffix = _SUFFIX.get(getattr(x, "dtype", None))
    nd = len(kernel)
    if suffix is None or nd not in (1, 2) or x.ndim < nd or not _usable(x) or x.size == 0:
        return None
    lib = _library()
    if lib is None:
        return None
    size = x.shape[x.ndim - nd:]
    out = tuple((n + b + a - d * (k - 1) - 1) // s + 1 for n, k, s, d, (b, a)
                in zip(size, kernel, stride, dilation, padding))
    planes = x.size // int(np.prod(size))
    result = np.empty(x.shape[:x.ndim - nd] + tuple(kernel) + out, dtype=x.dtype)
    geometry = _geometry(planes, size, kernel, stride, dilation, padding, out)
    getattr(lib, f"unfold2d_{suffix}")(_p(x), _p(geometry), ctypes.c_double(value), _p(result))
    return result


def fold(cols, size, kernel, stride, dilation, padding):
    """The adjoint of :func:`unfold`: windows (..., *kernel, *out) added into (..., *size);
    or None (NumPy runs)."""
    suffix = _SUFFIX.get(getattr(cols, "dtype", None))
    nd = len(kernel)
    if suffix is None or nd not in (1, 2) or not _usable(cols) or cols.size == 0:
        return None
    lib = _library()
    if lib is None:
        return None
    out = cols.shape[cols.ndim - nd:]
    lead = cols.shape[:cols.ndim - 2 * nd]
    result = np.empty(lead + tuple(size), dtype=cols.dtype)
    geometry = _geometry(int(np.prod(lead)), size, kernel, stride, dilation, padding, out)
    getattr(lib, f"fold2d_{suffix}")(_p(cols), _p(geometry), _p(result))
    return result


@contextlib.contextmanager
def team_products(on=True):
    """Inside this block (on a thread), large NumPy products run on the native team
    (:func:`matmul`); the runtime opens it around a call whose level loops are all native, so
    the whole call uses one pool of threads. Elsewhere NumPy's BLAS runs them: work that mixes
    the two pools (an interpreted loop's products between the team's) measured slower than
    either (RNTN: 183 -> 240 ms per 8 batches)."""
    before = getattr(_team, "on", False), getattr(_team, "threads", None)
    _team.on = on
    if not before[0]:
        _fresh_choices()
        _team.threads = calibrate.free_cores() if on else None  # (sampled once a call)
    # NumPy's own products in the block (those too small for the team) run on one BLAS
    # thread: a product on OpenBLAS's pool leaves its threads spinning, and the team's next
    # product then shares the cores with them (measured: recursive Tree-LSTM 128, 2 threads,
    # the same team products 1.6-1.8x slower after the leaf kind's small NumPy products).
    threads = set_blas_threads(1) if on and not before[0] else None
    try:
        yield
    finally:
        _team.on, _team.threads = before
        if threads is not None:
            set_blas_threads(threads)


def matmul(a, b, out=None):
    """``a @ b`` for 2-D float32/float64 NumPy matrices (each row-contiguous or a transpose of
    one), inside :func:`team_products`: with ``b`` an operand of :func:`invariant_operands`, on
    its packed panels (:func:`packed_matmul`); else on a team of threads (:func:`team_size`),
    each running a one-thread gemm of NumPy's BLAS; into ``out`` (C-contiguous) when given —
    each only where measured faster here than NumPy's call (``cpu/calibrate.py``). None
    where it does not apply or is slower (NumPy runs): another BLAS, one core. Every large
    product of a step comes here, not only some: switching between OpenBLAS's threads and the
    team's costs more than either (measured: with the Xᵀ·G products left to OpenBLAS the step
    was 12 % slower)."""
    if not getattr(_team, "on", False):
        return None
    if getattr(_invariant, "arrays", None):
        done = packed_matmul(a, b, out)
        if done is not None:
            return done
    return team_matmul(a, b, out)


def team_matmul(a, b, out=None, measured=True):
    """``a @ b`` on the team (see :func:`matmul`), or None; ``measured=False`` runs it
    wherever it applies (the calibration's own side)."""
    dtype = getattr(a, "dtype", None)
    suffix = _SUFFIX.get(dtype)
    if suffix is None or getattr(b, "dtype", None) != dtype or a.ndim != 2 or b.ndim != 2 \
            or a.shape[1] != b.shape[0] or not isinstance(a, np.ndarray) \
            or not isinstance(b, np.ndarray) or a.size == 0 or b.size == 0:
        return None
    (m, k), n = a.shape, b.shape[1]
    if out is not None and (out.dtype != dtype or out.shape != (m, n)
                            or not out.flags.c_contiguous):
        return None
    threads = team_size()
    if threads < 2:
        return None
    from . import blas

    address, interface = blas.gemm(dtype)
    if interface not in ("cblas64", "cblas32"):
        return None
    lib = _library()
    if lib is None:
        return None
    (ta, lda, a), (tb, ldb, b) = _operand(a), _operand(b)
    if measured:
        if not getattr(_team, "on", False):
            return None  # outside team_products
        key = ("team", suffix, ta, tb, bucket(m), bucket(n), bucket(k), threads)
        wins = _wins.get(key)
        if wins is None:
            name = f"team {suffix} {'x'.join(f'<={1 << e}' for e in key[4:7])}" \
                   f"{' Aᵀ' if ta else ''}{' Bᵀ' if tb else ''} ({threads} threads)"
            scratch = np.empty((m, n), dtype)
            wins = _wins[key] = calibrate.own_is_faster(
                name, lambda: (lambda: team_matmul(a, b, scratch, False),
                               lambda: np.matmul(a, b)), threads)
        if not wins:
            return None
    if out is None:
        out = np.empty((m, n), dtype=dtype)
    integer = ctypes.c_int64 if interface == "cblas64" else ctypes.c_int
    getattr(lib, f"team_gemm_{suffix}_{interface[-2:]}")(
        ctypes.c_void_p(address), ctypes.c_void_p(blas.threads_local()), ctypes.c_int(ta),
        ctypes.c_int(tb), integer(m), integer(n), integer(k), _p(a), integer(lda), _p(b),
        integer(ldb), _p(out), integer(n), ctypes.c_int(threads))
    return out


_wins = {}  # bucket -> whether the library's kernel runs it (calibrate.py), for the state:
_wins_forced = [None]  # MINICAVS_KERNELS when they were chosen


def _fresh_choices():
    """At a block's start: choices made before a change of ``MINICAVS_KERNELS`` are dropped."""
    force = calibrate.forced()
    if force != _wins_forced[0]:
        _wins.clear()
        _wins_forced[0] = force


def bucket(size):
    """The power of two at or above ``size``, as an exponent: shapes measured together."""
    return (size - 1).bit_length()


# --- products with an operand that stays the same (packed_gemm in the source above) ------------

_invariant = threading.local()


@contextlib.contextmanager
def invariant_operands(arrays):
    """Inside this block (on a thread) the NumPy matrices ``arrays`` — a step's parameters —
    do not change: a product with few rows whose right operand is one of them, or its
    transpose (``G · Wᵀ`` backward), runs on a copy of it packed once into panels
    (:func:`packed_matmul`), not packed again by the BLAS at every call. The block holds the
    arrays, so no other array can take their memory while their packings are cached. Nested:
    the inner block adds its arrays and its own packings."""
    before = getattr(_invariant, "arrays", None), getattr(_invariant, "packs", None)
    known = dict(before[0] or {})
    for a in arrays:
        if isinstance(a, np.ndarray) and a.ndim == 2 and a.dtype in _SUFFIX and (
                a.flags.c_contiguous or a.flags.f_contiguous):
            known[(data_address(a), a.size)] = a
    _invariant.arrays, _invariant.packs = known, {}
    _fresh_choices()
    try:
        yield
    finally:
        _invariant.arrays, _invariant.packs = before


def packed_matmul(a, b, out=None, measured=True):
    """``a @ b`` inside :func:`invariant_operands` with ``b`` (or ``b.T``) one of its arrays,
    from ``b``'s panels (packed on first use in the block) where they are measured faster here
    than what runs otherwise (``cpu/calibrate.py``: per row count rounded up to a power of
    two); None where it does not apply or is slower. ``measured=False``: wherever it applies.
    Every product of a step asks, thousands a step, so what depends on ``b`` alone is worked
    out once per ``b`` in the block."""
    packs = getattr(_invariant, "packs", None)
    if packs is None or type(a) is not np.ndarray or type(b) is not np.ndarray or a.ndim != 2 \
            or b.ndim != 2:
        return None
    key = (data_address(b), b.shape, b.strides, b.dtype)
    panels = packs.get(key)
    if panels is None:
        panels = packs[key] = _Panels.of(b)
    if not panels:
        return None
    (m, k), n = a.shape, b.shape[1]
    if a.dtype != b.dtype or k != b.shape[0] or m == 0:
        return None
    if out is not None and (out.dtype != a.dtype or out.shape != (m, n)
                            or not out.flags.c_contiguous):
        return None
    item = b.itemsize
    if a.strides[1] != item or a.strides[0] < k * item or a.strides[0] % item:
        a = np.ascontiguousarray(a)
    if measured and not panels.faster(m):
        return None
    if out is None:
        out = np.empty((m, n), dtype=a.dtype)
    panels.gemm(data_address(a), a.strides[0] // item, data_address(panels.packed()), m, n, k,
                data_address(out), n, panels.threads)
    return out


class _Panels:
    """One invariant ``b``'s panels in a block, packed when first used."""

    def __init__(self, lib, b, transposed, prefix, suffix):
        self.lib, self.b, self.transposed, self.suffix = lib, b, transposed, suffix
        self.prefix, self.threads = prefix, calibrate.free_cores()
        self.gemm = _typed(lib, f"{prefix}_packed_gemm_{suffix}", _PACKED_GEMM_ARGS)
        self.key = ("panels", prefix, suffix, transposed, b.shape, self.threads)
        self._packed = None

    @classmethod
    def of(cls, b):
        """The panels of ``b``, or False where products with it do not run on panels: not an
        invariant operand, a layout other than one of a matrix and its transpose, no native
        code, a forked child."""
        (k, n), item = b.shape, b.itemsize
        if b.dtype not in _SUFFIX or (data_address(b), b.size) not in _invariant.arrays \
                or build.forked_child() or b.size == 0:
            return False
        if b.strides == (n * item, item):
            transposed = 0
        elif b.strides == (item, k * item):
            transposed = 1
        else:
            return False
        lib = _library()
        if lib is None:
            return False
        return cls(lib, b, transposed, isa.target(), _SUFFIX[b.dtype])

    def packed(self):
        if self._packed is None:
            (k, n), lib, suffix = self.b.shape, self.lib, self.suffix
            width = getattr(lib, f"{self.prefix}_panel_width_{suffix}")()
            self._packed = np.empty(-(-n // width) * width * k, dtype=self.b.dtype)
            getattr(lib, f"{self.prefix}_pack_panels_{suffix}")(
                _p(self.b), ctypes.c_int64(k if self.transposed else n),
                ctypes.c_int(self.transposed), ctypes.c_int64(k), ctypes.c_int64(n),
                _p(self._packed), ctypes.c_int(self.threads))
        return self._packed

    def faster(self, m):
        key = self.key + (m,)
        wins = _wins.get(key)
        if wins is None:
            (k, n), rows, b = self.b.shape, 1 << bucket(m), self.b
            name = (f"panels {self.suffix} <={rows}x{k}x{n}{' Bᵀ' if self.transposed else ''} "
                    f"({self.prefix}, {self.threads} threads)")

            def make():
                x = np.random.default_rng(0).standard_normal((rows, k)).astype(b.dtype)
                return lambda: packed_matmul(x, b, measured=False), _otherwise(x, b)
            wins = _wins[key] = calibrate.own_is_faster(name, make, self.threads)
        return wins


def _otherwise(a, b):
    """What runs ``a @ b`` in a team block where the panels do not, as a call (the team's
    choice made first: only the product itself is timed)."""
    if team_matmul(a, b) is not None:
        return lambda: team_matmul(a, b, measured=False)
    return lambda: a @ b


# (pointers as ints, sizes as int64, the team as int: declared, ctypes converts plain ints in C)
_PACKED_GEMM_ARGS = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                     ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                     ctypes.c_int)


def _typed(lib, name, argtypes):
    """``lib.name`` with its argument types declared (the calls above pass ctypes objects,
    which declared types accept too)."""
    function = getattr(lib, name)
    function.argtypes = argtypes
    return function


def _operand(x):
    """(transposed, leading dimension, array) of a matrix as a gemm reads it."""
    item = x.itemsize
    if x.strides[1] == item and x.strides[0] >= max(1, x.shape[1]) * item:
        return 0, x.strides[0] // item, x
    if x.strides[0] == item and x.strides[1] >= max(1, x.shape[0]) * item:
        return 1, x.strides[1] // item, x
    x = np.ascontiguousarray(x)
    return 0, max(1, x.shape[1]), x


def team_ready():
    """Whether large products can run on the native team in this process: native code on,
    more than one core, and NumPy's BLAS callable one thread a call (CBLAS)."""
    from . import blas

    if build.unavailable() is not None or team_size() < 2:
        return False
    return blas.gemm("float32")[1] in ("cblas64", "cblas32")


def adam(params, grads, ms, vs, beta1, beta2, eps, bc2, step, decay):
    """One Adam step for same-dtype, contiguous NumPy ``params`` (in place, with their
    gradients and moments), one C call; False where it does not apply (NumPy runs)."""
    suffix = _SUFFIX.get(params[0].dtype) if params else None
    if suffix is None or not all(a.dtype == params[0].dtype and _usable(a)
                                 for group in (params, grads, ms, vs) for a in group):
        return False
    lib = _library()
    if lib is None:
        return False
    n = len(params)
    pointers = [np.array([data_address(a) for a in group], dtype=np.uintp)
                for group in (params, grads, ms, vs)]
    sizes = np.array([a.size for a in params], dtype=np.int64)
    hyper = np.array([beta1, beta2, eps, bc2, step, decay], dtype=np.float64)
    getattr(lib, f"adam_{suffix}")(ctypes.c_int64(n), *(_p(a) for a in pointers), _p(sizes),
                                   _p(hyper), ctypes.c_int(calibrate.threads_for(sizes.sum())))
    return True


def _p(array):
    return ctypes.c_void_p(data_address(array))


# A NumPy array's data address. ``ndarray.ctypes.data`` builds a helper object each time
# (about 1 us; a native call takes several, a training step thousands of calls); the address is
# the first field of NumPy's array struct (``PyArrayObject_fields.data``, right after the
# object's header), read directly (0.13 us) where a probe at import confirms that layout.
_HEADER = object.__basicsize__
_read_pointer = ctypes.c_void_p.from_address


def _address_by_layout(array):
    if isinstance(array, np.ndarray):  # (a NumPy scalar has no such field)
        return _read_pointer(id(array) + _HEADER).value
    return array.ctypes.data


def _layout_holds():
    probe = np.arange(5.0)[2:]
    return _address_by_layout(probe) == probe.ctypes.data


data_address = _address_by_layout if _layout_holds() else (lambda array: array.ctypes.data)

