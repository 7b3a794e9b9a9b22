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

The library's other kernels are the products on its team and on packed panels
(``products.py``) and the convolutions' loops (``conv.py``); the C++ of this file's and the
products' kernels is ``kernel_source.py``, the team's size and state ``team.py``.
"""

import ctypes
import threading

import numpy as np

from . import build, calibrate
from .kernel_source import SOURCE as _SOURCE

SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def library():
    return build.module_library(_SOURCE, "kernels", "minicavs/cpu/kernels.py")


def compile_ahead():
    """Start compiling :func:`library` on a thread of its own (``build.compile_ahead``): a
    job about to run native code on the CPU (its first graphs, its first recorded block)
    loads it soon."""
    build.compile_ahead(_SOURCE, "kernels", "minicavs/cpu/kernels.py")


def _usable(*arrays):
    return all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays)


_P, _I = ctypes.c_void_p, ctypes.c_int64  # a pointer (passed as an int), a size
_SIGNATURES = {  # the hot calls' argument types: declared, plain ints pass without wrappers
    "lstm_cell": (_P, _P, _P, ctypes.c_int, _P, _P, _I, _I, _I, _I, _I, _P, ctypes.c_int),
    "lstm_cell_grad": (_P, _P, _P, _I, _I, _P, _I, _P, _I, _I, _I, _I, _P, ctypes.c_int),
    "scatter_add": (_P, _P, _P, _I, _I, _I, _I, ctypes.c_int),
    "take_rows": (_P, _I, _I, _P, _I, _I, _P, ctypes.c_int),
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
        lib = library()
        if lib is None:
            return None
        function = _typed_functions[name] = typed(lib, name, _SIGNATURES[kernel])
    return function


def softmax_cross_entropy(logits, labels):
    """Per-row losses as the op computes them, or None (the caller's NumPy form runs). The
    labels must already be checked to lie in range."""
    suffix = SUFFIX.get(getattr(logits, "dtype", None))
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
    if type(g) is np.ndarray and not g.flags.c_contiguous:  # (a summed or averaged loss's
        g = np.ascontiguousarray(g)  # gradient: one number broadcast to every row, which sent
        # it to NumPy's form: the Tree-LSTM's loss, 1,000 x 5, 276 -> 209 us forward + backward)
    suffix = SUFFIX.get(getattr(logits, "dtype", None))
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
    """The dtype suffix, the previous cells' row strides (two: the second cell's the first's
    where there is one), rows and H of an LSTM cell's operands as the kernels take them, or
    None: ``pre`` and ``more`` C-contiguous, the cells (rows, H) with contiguous rows, each at
    its own stride (the c half of [h, c] states; a Tree-LSTM's two children from slabs of two
    widths: it ran NumPy's form, a batch in four of an autobatched Tree-LSTM)."""
    if type(pre) is not np.ndarray:
        return None
    dtype, k = pre.dtype, len(c_prev)
    suffix = SUFFIX.get(dtype)
    if suffix is None or k > 2 or pre.ndim == 0 or pre.size == 0 or not pre.flags.c_contiguous:
        return None
    for a in more:
        if type(a) is not np.ndarray or a.dtype != dtype or not a.flags.c_contiguous:
            return None
    width = pre.shape[-1]
    H, rows, strides = width // (3 + k), pre.size // width, []
    for c in c_prev:
        if getattr(c, "dtype", None) != dtype:
            return None
        stride = _row_stride(c, rows, H)
        if stride is None:
            return None
        strides.append(stride)
    strides += [strides[0] if strides else H] * (2 - len(strides))
    return suffix, strides, rows, H


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
    _, lds, rows, H = found
    out = np.empty(pre.shape[:-1] + (2 * H,), pre.dtype)
    cell(data_address(pre), None, None, 0, *_cell_addresses(c_prev), *lds, len(c_prev), rows, H,
         data_address(out), calibrate.threads_for(pre.size))
    return out


def lstm_cell_sum(terms, c_prev, out=None, pre=None):
    """:func:`lstm_cell` on ``pre = terms[0] + terms[1] (+ terms[2])``, added in that order in
    the cell's pass (each term (rows, (3 + k)·H) with contiguous rows, or one row of that width
    for all rows: a bias), the sum written to ``pre``: ``(pre, out)``, each allocated where
    None, or None where the kernel does not apply (the caller adds, then runs the cell)."""
    count = len(terms)
    if count not in (2, 3) or len(c_prev) > 2:
        return None
    first = next((t for t in terms if getattr(t, "ndim", 0) == 2), None)
    if first is None:
        return None
    (rows, width), dtype = first.shape, first.dtype
    addresses, lds = _term_arrays()  # (this thread's: filled for this call)
    kept = []  # (a strided bias is read from a contiguous copy, alive until the call returns)
    for i, t in enumerate(terms):
        if type(t) is not np.ndarray or t.dtype != dtype:
            return None
        if t.ndim == 1 and t.shape[0] == width:  # a bias: one row for all rows
            if t.strides[0] != t.itemsize:
                t = np.ascontiguousarray(t)
                kept.append(t)
            ld = 0
        elif t.ndim == 2 and t.shape == (rows, width):
            ld = _rows_of(t, width)
            if ld is None:
                return None
        else:
            return None
        addresses[i], lds[i] = data_address(t), ld
    if count == 2:
        addresses[2], lds[2] = None, 0
    if pre is None:
        pre = np.empty((rows, width), dtype)
    found = _lstm_operands(pre, c_prev, *([] if out is None else [out]))
    cell = found and _function("lstm_cell", found[0])
    if not cell or pre.shape != (rows, width) or pre.dtype != dtype:
        return None
    _, cell_lds, _, H = found
    if out is None:
        out = np.empty((rows, 2 * H), dtype)
    elif out.shape != (rows, 2 * H):
        return None
    cell(data_address(pre), addresses, lds, count, *_cell_addresses(c_prev), *cell_lds,
         len(c_prev), rows, H, data_address(out), calibrate.threads_for(pre.size))
    return pre, out


_thread_arrays = threading.local()


def _term_arrays():
    """This thread's two ctypes arrays of three (addresses, row strides) that a summed cell's
    call reads its terms from: made once, not per call (1.7 us a call)."""
    arrays = getattr(_thread_arrays, "terms", None)
    if arrays is None:
        arrays = _thread_arrays.terms = ((ctypes.c_void_p * 3)(), (ctypes.c_int64 * 3)())
    return arrays


def _cell_addresses(c_prev):
    """The previous cells' data addresses as the cell kernels take them: two, None for none."""
    k = len(c_prev)
    return (data_address(c_prev[0]) if k else None), (data_address(c_prev[1]) if k > 1 else None)


def lstm_cell_grad(pre, c_prev, out, g, grads=None):
    """``ops.lstm_cell_grad``'s [∂pre, ∂c_prev…] in one pass over the rows (into ``grads``,
    C-contiguous, where given), or None. ``out`` and ``g``: rows at any stride."""
    found = _lstm_operands(pre, c_prev, *([] if grads is None else [grads]))
    cell_grad = found and _function("lstm_cell_grad", found[0])
    if not cell_grad:
        return None
    _, lds, rows, H = found
    ldo, ldg = _row_stride(out, rows, 2 * H), _row_stride(g, rows, 2 * H)
    if ldo is None or ldg is None or out.dtype != pre.dtype or g.dtype != pre.dtype:
        return None
    k = len(c_prev)
    shape = pre.shape[:-1] + ((3 + 2 * k) * H,)
    if grads is None:
        grads = np.empty(shape, pre.dtype)
    elif grads.shape != shape:
        return None
    c0, c1 = _cell_addresses(c_prev)
    cell_grad(data_address(pre), c0, c1, *lds, data_address(out), ldo, data_address(g), ldg, k,
              rows, H, data_address(grads), calibrate.threads_for(pre.size))
    return grads


def scatter_add_rows(out, idx, values):
    """``out[idx[i]] += values[i]`` (rows; idx -1 skipped, repeats add up, in order), in place;
    False where it does not apply (the caller's NumPy form runs). ``out`` and ``values``:
    C-contiguous, or 2-D with contiguous rows at any stride (a view of some columns of a
    gradient slab). Indices must be checked."""
    suffix = SUFFIX.get(getattr(out, "dtype", None))
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
                ldv, calibrate.threads_for(values.size))
    return True


def take_rows(x, idx, out=None):
    """``x[idx]`` by rows with a zero row where ``idx`` is -1, as a new C-contiguous array (or
    into ``out``, C-contiguous); None where it does not apply (the caller's NumPy form runs) or
    where an index lies outside -1..len(x)-1 (the caller's check names it). ``x``: C-contiguous,
    or 2-D with contiguous rows at any stride."""
    suffix = SUFFIX.get(getattr(x, "dtype", None))
    if suffix is None or x.ndim == 0 or getattr(idx, "dtype", None) != np.int64 \
            or idx.ndim != 1:
        return None
    if not idx.flags.c_contiguous:  # (a column of ids: TreeRNN's [word, internal] pulls; it
        idx = np.ascontiguousarray(idx)  # ran NumPy's masked form)
    cols = x.size // x.shape[0] if x.shape[0] else 0
    ldx = _rows_of(x, cols)
    take = _function("take_rows", suffix) if ldx is not None and cols else None
    if take is None:
        return None
    shape = (len(idx),) + x.shape[1:]
    if out is None:
        out = np.empty(shape, x.dtype)
    elif out.shape != shape or out.dtype != x.dtype or not out.flags.c_contiguous:
        return None
    if take(data_address(x), x.shape[0], ldx, data_address(idx), len(idx), cols,
            data_address(out), calibrate.threads_for(out.size)) >= 0:
        return None
    return out


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
    lib = library()
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
    count = function(ctypes.c_int64(n), ctypes.c_int64(num_sigs), pointer(int64[0]), pointer(waiting),
                     pointer(int64[1]), pointer(int64[2]), pointer(int64[3]), pointer(int64[4]), pointer(int64[5]),
                     pointer(depth), pointer(ready), pointer(ready_count), pointer(priority), pointer(order), pointer(ends))
    if count < 0:
        raise RuntimeError("agenda: nodes that never become ready (the recorded graph has a "
                           "cycle)")
    return np.split(order, ends[:count - 1]) if count else []


def reader_order(order, ends, src, dst):
    """``autobatch/schedule.in_reader_order`` in C, on the batches as one array ``order`` (the
    nodes in batch order, reordered in place) and each batch's end ``ends``; False where native
    code is off (NumPy runs it)."""
    lib = library()
    if lib is None:
        return False
    n = len(order)
    arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in (ends, src, dst)]
    work = np.empty(4 * n + 1, dtype=np.int64)
    lib.reader_order_schedule(ctypes.c_int64(n), ctypes.c_int64(len(ends)), pointer(order),
                              pointer(arrays[0]), ctypes.c_int64(len(src)), pointer(arrays[1]),
                              pointer(arrays[2]), pointer(work))
    return True


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
    suffix = SUFFIX.get(getattr(x, "dtype", None))
    nd = len(kernel)
    if suffix is None or nd not in (1, 2) or x.ndim < nd or not _usable(x) or x.size == 0:
        return None
    lib = library()
    if lib is None:
        return None
    size = x.shape[x.ndim - nd:]
    out = tuple((n + b + a - d * (k - 1) - 1) // s + 1 for n, k, s, d, (b, a)
                in zip(size, kernel, stride, dilation, padding))
    planes = x.size // int(np.prod(size))
    result = np.empty(x.shape[:x.ndim - nd] + tuple(kernel) + out, dtype=x.dtype)
    geometry = _geometry(planes, size, kernel, stride, dilation, padding, out)
    getattr(lib, f"unfold2d_{suffix}")(pointer(x), pointer(geometry), ctypes.c_double(value), pointer(result))
    return result


def fold(cols, size, kernel, stride, dilation, padding):
    """The adjoint of :func:`unfold`: windows (..., *kernel, *out) added into (..., *size);
    or None (NumPy runs)."""
    suffix = SUFFIX.get(getattr(cols, "dtype", None))
    nd = len(kernel)
    if suffix is None or nd not in (1, 2) or not _usable(cols) or cols.size == 0:
        return None
    lib = library()
    if lib is None:
        return None
    out = cols.shape[cols.ndim - nd:]
    lead = cols.shape[:cols.ndim - 2 * nd]
    result = np.empty(lead + tuple(size), dtype=cols.dtype)
    geometry = _geometry(int(np.prod(lead)), size, kernel, stride, dilation, padding, out)
    getattr(lib, f"fold2d_{suffix}")(pointer(cols), pointer(geometry), pointer(result))
    return result


def typed(lib, name, argtypes):
    """``lib.name`` with its argument types declared (the calls above pass ctypes objects,
    which declared types accept too)."""
    function = getattr(lib, name)
    function.argtypes = argtypes
    return function


def adam(params, grads, ms, vs, beta1, beta2, eps, bc2, step, decay):
    """One Adam step for same-dtype, contiguous NumPy ``params`` (in place, with their
    gradients and moments), one C call; False where it does not apply (NumPy runs)."""
    suffix = SUFFIX.get(params[0].dtype) if params else None
    if suffix is None or not all(a.dtype == params[0].dtype and _usable(a)
                                 for group in (params, grads, ms, vs) for a in group):
        return False
    lib = library()
    if lib is None:
        return False
    n = len(params)
    pointers = [np.array([data_address(a) for a in group], dtype=np.uintp)
                for group in (params, grads, ms, vs)]
    sizes = np.array([a.size for a in params], dtype=np.int64)
    hyper = np.array([beta1, beta2, eps, bc2, step, decay], dtype=np.float64)
    getattr(lib, f"adam_{suffix}")(ctypes.c_int64(n), *(pointer(a) for a in pointers), pointer(sizes),
                                   pointer(hyper), ctypes.c_int(calibrate.threads_for(sizes.sum())))
    return True


def pointer(array):
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

