"""The row-copy kernels of the Cavs runtime (gather, scatter, pull, push) as CUDA RawKernels.

Cavs §4 "Backend": gather and pull index slices of a tensor and put them together contiguously;
scatter and push split a tensor along its batch axis and copy the slices to different places;
each is *one* kernel launch however many rows move. Here a "row" is ``a[r]`` of a C-contiguous
array, flattened to ``row_size`` elements, and every kernel is a grid-stride loop over (row,
column) elements with no block synchronisation, so the CPU shim (``shim.py``) can run it.
Element positions are 64-bit (``long long``), so arrays past 2**31 elements are fine; row
indices are int32 (the rows a kernel reads or writes), positions into them 64-bit.

Floating point on the GPU: CuPy compiles every kernel with ``-ftz=true`` (nvrtc.py), so float32
arithmetic flushes subnormal inputs and results to zero; row copies do no arithmetic and move
every bit. The deterministic scatter-add keeps subnormals all the same (its float add is PTX
``add.rn.f32``, which has no ``.ftz``), so it equals its NumPy twin bit for bit in both dtypes.
The atomic one cannot: ``atom.global.add.f32`` always flushes (:func:`flush_subnormals` is the
NumPy model of that, and the CPU shim's float ``atomicAdd`` does the same).

Each kernel source is templated on the element type (``float`` / ``double``) and built by a
memoised factory keyed on (kernel, dtype): :func:`kernel_source` gives the source text (NVRTC
and the shim compile exactly this), :func:`raw_kernel` the ``cupy.RawKernel``. The launch
functions check everything a kernel cannot — C-contiguity, dtypes, shapes, that indices are int32
and in range — *before* launching, so a bad index raises :class:`IndexRangeError`, never an
illegal memory access. Index -1 means "no row": a zero row when gathering, dropped when scattering.

Every launch function takes ``runner``: ``"numpy"`` runs the NumPy twin (``*_numpy``, the
reference semantics), ``"shim"`` runs the kernel source on the CPU, ``"cupy"`` launches it on the
GPU; the default is ``"cupy"`` for CuPy arrays and ``"numpy"`` otherwise.

=======================  ==================================================================
``gather_rows``          ``out[i] = src[idx[i]]``                  (``minicavs_gather_rows``)
``gather_children``      ``out[c, i] = src[child_idx[i, c]]``      (``minicavs_gather_children``)
``scatter_add_rows``     ``out[idx[i]] += values[i]``, atomic      (``minicavs_scatter_add_rows``)
  ``deterministic``      the same, one thread per output element summing its rows in index
                         order                                     (``minicavs_scatter_add_sorted``)
``scatter_reduce_rows``  ``out[idx[i]] = f(out[idx[i]], values[i])``, f a product, maximum or
                         minimum, folded as the deterministic sum  (``minicavs_scatter_<f>_sorted``)
``scatter_rows``         ``out[idx[i]] = values[i]``, idx unique   (``minicavs_scatter_rows``)
``copy_rows``            ``out[dst[i]] = src[src[i]]``, dst unique (``minicavs_copy_rows``)
``pull_rows``            caller order -> level order (a gather)
``push_rows``            level order -> caller order (a scatter of a permutation)
``lstm_cell``            the LSTM cell of ``ops/cells.py`` on k previous cells, one launch
                         where CuPy's ufuncs take ten              (``minicavs_lstm_cell<k>``)
``lstm_cell_grad``       its gradient, one launch          (``minicavs_lstm_cell_grad<k>``)
``lstm_cell_sum``        the cell on the sum of its pre-activations' terms (an LSTM step's
                         products and bias), the sum kept   (``minicavs_lstm_cell_sum<k>``)
``softmax_xent``         ``ops/loss.py``'s softmax cross-entropy per row, one launch where CuPy
                         takes eight                         (``minicavs_softmax_xent``)
``softmax_xent_grad``    its gradient            (``minicavs_softmax_xent_grad``)
=======================  ==================================================================

The cell kernels read rows at a stride (``*_ld``, in elements: a previous cell is a column
window of the state [h, c]); their NumPy twin is the op's own forward (``ops/cells.py``).
"""

import functools
import re
from collections import namedtuple
from string import Template

import numpy as np

from . import ahead
from ..errors import DTypeError, IndexRangeError, ShapeError

INDEX_DTYPE = np.dtype(np.int32)
PLAN_DTYPE = np.dtype(np.int64)  # positions in a scatter plan: there may be 2**31 rows or more
DTYPES = {np.dtype(np.float32): ("float", "f32"), np.dtype(np.float64): ("double", "f64")}
BLOCK_SIZE = 256
MAX_BLOCKS = 65535  # grid-stride loops cover any size; more blocks than this buys nothing

# One loop step per element e of the (rows x row_size) output; i = e / row_size is its row.
_GRID_STRIDE = """for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)blockDim.x * gridDim.x)"""

# A float add that keeps subnormals. CuPy's -ftz=true would make "+" flush them, and the
# deterministic scatter-add promises NumPy's bits: PTX add.rn.f32 has no .ftz, so the flag does
# not reach it. (The CPU shim, which has no __CUDA_ARCH__, defines the float version itself.)
_ADD_NOFTZ = """
#ifdef __CUDA_ARCH__
__device__ float minicavs_add_noftz(float a, float b)
{
    float sum;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(sum) : "f"(a), "f"(b));
    return sum;
}
#endif
__device__ double minicavs_add_noftz(double a, double b) { return a + b; }
"""

# atomicAdd on double is native from sm_60 on; before that, the compare-and-swap loop of the
# CUDA C++ Programming Guide (comparing bits, so a NaN sum ends the loop too).
_DOUBLE_ATOMIC_ADD = """
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 600
__device__ double atomicAdd(double* address, double value)
{
    unsigned long long* bits = (unsigned long long*)address;
    unsigned long long old = *bits, assumed;
    do {
        assumed = old;
        const double sum = value + __longlong_as_double((long long)assumed);
        old = atomicCAS(bits, assumed, (unsigned long long)__double_as_longlong(sum));
    } while (assumed != old);
    return __longlong_as_double((long long)old);
}
#endif
"""

# The deterministic scatters: order lists the rows of values grouped by target row, in their
# original order within a group; group s (rows order[starts[s]] .. order[starts[s+1]-1]) folds
# into out[targets[s]]. One thread owns one output element and folds its group's values in that
# fixed order, so the result is the same bits on every run and equals the sequential fold
# (NumPy's ufunc.at order): a sum for scatter_add_rows, a product, maximum or minimum for
# scatter_reduce_rows.
_SCATTER_FOLD = """
extern "C" __global__ void ${name}(const ${T}* __restrict__ values,
                                   const long long* __restrict__ order,
                                   const int* __restrict__ targets,
                                   const long long* __restrict__ starts,
                                   ${T}* __restrict__ out, const long long num_groups,
                                   const long long row_size)
{
    const long long total = num_groups * row_size;
    ${loop} {
        const long long s = e / row_size;
        const long long j = e - s * row_size;
        ${T}* target = &out[(long long)targets[s] * row_size + j];
        ${T} acc = *target;
        for (long long p = starts[s]; p < starts[s + 1]; ++p) {
            const ${T} v = values[order[p] * row_size + j];
            acc = ${fold};
        }
        *target = acc;
    }
}
"""

# gather_rows, scatter_add_rows and scatter_rows: row i of the n rows moved (of src for a
# gather, of values for a scatter) pairs with row idx[i] of the other side, its element e with
# element ``at`` there; ${move} is all they do differently.
_ONE_INDEX = """
extern "C" __global__ void ${name}(const ${T}* __restrict__ ${rows}, const int* __restrict__ idx,
                                   ${T}* __restrict__ out, const long long n,
                                   const long long row_size)
{
    const long long total = n * row_size;
    ${loop} {
        const long long i = e / row_size;
        const int r = idx[i];
        const long long at = (long long)r * row_size + (e - i * row_size);
        ${move}
    }
}
"""


def _one_index(rows, move):
    return Template(_ONE_INDEX).safe_substitute(rows=rows, move=move)


_SOURCES = {
    # out[i, :] = src[idx[i], :], or zeros where idx[i] == -1.
    "gather_rows": _one_index("src", "out[e] = r < 0 ? (${T})0 : src[at];"),
    "gather_children": """
// out[c, i, :] = src[child_idx[i, c], :] (zeros for -1): child c of every vertex of a batching
// task lands in its own contiguous (n, row_size) block, the buffer of gather(c).
extern "C" __global__ void ${name}(const ${T}* __restrict__ src,
                                   const int* __restrict__ child_idx, ${T}* __restrict__ out,
                                   const long long n, const long long k,
                                   const long long row_size)
{
    const long long total = k * n * row_size;
    ${loop} {
        const long long ci = e / row_size;  // c * n + i
        const long long c = ci / n;
        const long long i = ci - c * n;
        const int r = child_idx[i * k + c];
        out[e] = r < 0 ? (${T})0 : src[(long long)r * row_size + (e - ci * row_size)];
    }
}
""",
    # out[idx[i], :] += values[i, :] for idx[i] != -1. Repeated indices add up in whatever
    # order the threads reach them, so float sums may differ in the last bits from run to run
    # (and a float32 atomic add flushes subnormals: see the module docstring).
    "scatter_add_rows": _DOUBLE_ATOMIC_ADD + _one_index(
        "values", "if (r >= 0) atomicAdd(&out[at], values[e]);"),
    # out[idx[i], :] = values[i, :] for idx[i] != -1 (the launcher checks that indices do not
    # repeat).
    "scatter_rows": _one_index("values", "if (r >= 0) out[at] = values[e];"),
    "copy_rows": """
// out[dst_idx[i], :] = src[src_idx[i], :]: many slices from many places to many places in one
// launch. src_idx[i] == -1 writes a zero row, dst_idx[i] == -1 drops the row (the launcher
// checks that destinations do not repeat).
extern "C" __global__ void ${name}(const ${T}* __restrict__ src, const int* __restrict__ src_idx,
                                   const int* __restrict__ dst_idx, ${T}* __restrict__ out,
                                   const long long n, const long long row_size)
{
    const long long total = n * row_size;
    ${loop} {
        const long long i = e / row_size;
        const long long j = e - i * row_size;
        const int d = dst_idx[i];
        if (d < 0) continue;
        const int r = src_idx[i];
        out[(long long)d * row_size + j] = r < 0 ? (${T})0 : src[(long long)r * row_size + j];
    }
}
""",
}

# The folds besides the sum: a product, or NumPy's maximum and minimum, which keep the first
# operand when it is NaN or strictly wins, else take the second (NaN propagates; a tie, 0
# against -0, takes the second, as NumPy 2 does). As with the sum, CuPy's -ftz=true would flush
# float32 subnormals in a "*" or a comparison: the product is PTX mul.rn.f32 (no .ftz), and
# float32 NaN and order are decided on the bits.
# No atomics: CuPy's atomic scatter_max/min computed float64 in float32 (seen on an H100, CuPy
# 14.2: the maxima came back rounded to float32).
_MUL_NOFTZ = """
#ifdef __CUDA_ARCH__
__device__ float minicavs_mul_noftz(float a, float b)
{
    float product;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(product) : "f"(a), "f"(b));
    return product;
}
#endif
__device__ double minicavs_mul_noftz(double a, double b) { return a * b; }
"""

_ORDER = """
// NaN test and a > b for numbers (not NaN). float32: on the bits, so that no flush-to-zero mode
// reaches them; the order made monotonic by flipping negative values' magnitude bits, with 0
// and -0 equal.
__device__ bool minicavs_isnan(float a) { return (__float_as_int(a) & 0x7fffffff) > 0x7f800000; }
__device__ bool minicavs_isnan(double a) { return isnan(a); }
__device__ bool minicavs_greater(float a, float b)
{
    int ia = __float_as_int(a), ib = __float_as_int(b);
    if (((ia | ib) & 0x7fffffff) == 0) return false;
    ia ^= (ia >> 31) & 0x7fffffff;
    ib ^= (ib >> 31) & 0x7fffffff;
    return ia > ib;
}
__device__ bool minicavs_greater(double a, double b) { return a > b; }
"""


SCATTER_FOLDS = {  # reduce -> (the fold, as a C expression of acc and v; helpers it needs)
    "add": ("minicavs_add_noftz(acc, v)", _ADD_NOFTZ),
    "multiply": ("minicavs_mul_noftz(acc, v)", _MUL_NOFTZ),
    "maximum": ("minicavs_isnan(acc) || (!minicavs_isnan(v) && minicavs_greater(acc, v)) "
                "? acc : v", _ORDER),
    "minimum": ("minicavs_isnan(acc) || (!minicavs_isnan(v) && minicavs_greater(v, acc)) "
                "? acc : v", _ORDER),
}
for _reduce, (_fold, _helpers) in SCATTER_FOLDS.items():
    _SOURCES[f"scatter_{_reduce}_sorted"] = _helpers + Template(_SCATTER_FOLD).safe_substitute(
        fold=_fold)

# The LSTM cell (ops/cells.py) with k = 0, 1, 2 previous cells: one thread per (row, unit j);
# pre holds [i, f_1..f_k, o, u] pre-activations, out [h, c], grads [∂pre, ∂c_1..∂c_k].
_CELL_HEAD = """
__device__ float minicavs_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ double minicavs_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
extern "C" __global__ void ${name}(const ${T}* __restrict__ pre, const long long pre_ld,
                                   const ${T}* __restrict__ c1, const long long c1_ld,
                                   const ${T}* __restrict__ c2, const long long c2_ld,
                                   ${ARGS}, const long long rows, const long long H)
{
    const long long total = rows * H;
    ${loop} {
        const long long r = e / H, j = e - r * H;
        const ${T}* p = pre + r * pre_ld;
        const ${T} i = minicavs_sigmoid(p[j]), o = minicavs_sigmoid(p[(1 + K) * H + j]),
                   u = tanh(p[(2 + K) * H + j]);
        const ${T} f1 = K > 0 ? minicavs_sigmoid(p[H + j]) : 0, cp1 = K > 0 ? c1[r * c1_ld + j] : 0;
        const ${T} f2 = K > 1 ? minicavs_sigmoid(p[2 * H + j]) : 0, cp2 = K > 1 ? c2[r * c2_ld + j] : 0;
"""
_SOURCES["lstm_cell"] = _CELL_HEAD.replace("${ARGS}", "${T}* __restrict__ out, "
                                           "const long long out_ld") + """
        const ${T} c = i * u + f1 * cp1 + f2 * cp2;
        out[r * out_ld + H + j] = c;
        out[r * out_ld + j] = o * tanh(c);
    }
}
"""
_SOURCES["lstm_cell_grad"] = _CELL_HEAD.replace(
    "${ARGS}", "const ${T}* __restrict__ out, const long long out_ld, "
    "const ${T}* __restrict__ g, const long long g_ld, ${T}* __restrict__ grads, "
    "const long long grads_ld") + """
        const ${T} tc = tanh(out[r * out_ld + H + j]), gh = g[r * g_ld + j];
        const ${T} d_c = g[r * g_ld + H + j] + gh * o * (1 - tc * tc);
        ${T}* d = grads + r * grads_ld;
        d[j] = d_c * u * i * (1 - i);
        if (K > 0) { d[H + j] = d_c * cp1 * f1 * (1 - f1); d[(3 + K) * H + j] = d_c * f1; }
        if (K > 1) { d[2 * H + j] = d_c * cp2 * f2 * (1 - f2); d[(4 + K) * H + j] = d_c * f2; }
        d[(1 + K) * H + j] = gh * tc * o * (1 - o);
        d[(2 + K) * H + j] = d_c * i * (1 - u * u);
    }
}
"""
# The cell on the sum of its pre-activations' terms (an LSTM step's two products and its bias):
# each thread adds its unit's (3 + k) columns of the terms, in the order given, writes them to
# pre (the cell's gradient reads them) and runs the cell on them: the sum's launch is saved.
# A term with row stride 0 is one row for all (the bias); terms == 2 leaves t2 unread.
_SOURCES["lstm_cell_sum"] = _SOURCES["lstm_cell"].replace(
    "const ${T}* __restrict__ pre, const long long pre_ld,",
    "const ${T}* __restrict__ t0, const long long ld0, const ${T}* __restrict__ t1, "
    "const long long ld1, const ${T}* __restrict__ t2, const long long ld2, "
    "const long long terms, ${T}* __restrict__ pre, const long long pre_ld,").replace(
    "        const ${T}* p = pre + r * pre_ld;\n", """        ${T}* p = pre + r * pre_ld;
        for (int q = 0; q < 3 + K; ++q) {
            const long long col = q * H + j;
            ${T} v = t0[r * ld0 + col] + t1[r * ld1 + col];
            if (terms > 2) v += t2[r * ld2 + col];
            p[col] = v;
        }
""")
# Softmax cross-entropy, one thread per row (a row is one prediction's classes): its max, the
# sum of exps past it, the label's term; a label out of range sets *bad and writes 0, and the
# op then raises its error the NumPy way. The max keeps a NaN, as NumPy's does.
_XENT_ROW = """
        const ${T}* z = logits + e * ld;
        const long long y = labels[e];
        if (y < 0 || y >= C) { *bad = 1; ${on_bad} continue; }
        ${T} m = z[0];
        for (long long c = 1; c < C; ++c) m = (z[c] > m || z[c] != z[c]) ? z[c] : m;
        ${T} s = 0;
        for (long long c = 0; c < C; ++c) s += exp(z[c] - m);
"""
_XENT_HEAD = """
extern "C" __global__ void ${name}(const ${T}* __restrict__ logits, const long long ld,
                                   const long long* __restrict__ labels, ${ARGS},
                                   int* __restrict__ bad, const long long rows, const long long C)
{
    const long long total = rows;
    ${loop} {"""
_SOURCES["softmax_xent"] = _XENT_HEAD.replace("${ARGS}", "${T}* __restrict__ losses") + \
    _XENT_ROW.replace("${on_bad}", "losses[e] = 0;") + """
        losses[e] = log(s) - (z[y] - m);
    }
}
"""
_SOURCES["softmax_xent_grad"] = _XENT_HEAD.replace(
    "${ARGS}", "const ${T}* __restrict__ g, const long long g_step, ${T}* __restrict__ grads") + \
    _XENT_ROW.replace("${on_bad}", "") + """
        ${T}* d = grads + e * C;
        const ${T} ge = g[e * g_step];
        const ${T} scale = ge / s;
        for (long long c = 0; c < C; ++c) d[c] = exp(z[c] - m) * scale;
        d[y] -= ge;
    }
}
"""
# Adam over every parameter of an optimiser's group in one launch (multi-tensor; the NumPy form
# is thirteen element-wise launches a parameter): m, v and p read and written once each, the
# hyperparameters in the parameters' type as cpu/kernel_source.py's adam computes them.
# ``table`` holds the parameters' addresses (count each of p, g, m, v, in that order) and the
# offsets of their elements (count + 1); element e belongs to the parameter whose offsets
# bracket it.
_SOURCES["adam_many"] = """
extern "C" __global__ void ${name}(const long long* __restrict__ table, const long long count,
                                   const ${T} b1, const ${T} b2, const ${T} eps,
                                   const ${T} bc2, const ${T} step, const ${T} decay,
                                   const long long total)
{
    const long long* offsets = table + 4 * count;
    ${loop} {
        long long k = 0, hi = count - 1;
        while (k < hi) {
            const long long mid = (k + hi + 1) / 2;
            if (offsets[mid] <= e) k = mid; else hi = mid - 1;
        }
        const long long i = e - offsets[k];
        ${T}* p = (${T}*)table[k];
        const ${T}* g = (const ${T}*)table[count + k];
        ${T}* m = (${T}*)table[2 * count + k];
        ${T}* v = (${T}*)table[3 * count + k];
        const ${T} gi = g[i];
        const ${T} mi = b1 * m[i] + (1 - b1) * gi;
        const ${T} vi = b2 * v[i] + (1 - b2) * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step * (mi / (sqrt(vi / bc2) + eps));
    }
}
"""
for _k in range(3):
    for _cell in ("lstm_cell", "lstm_cell_grad", "lstm_cell_sum"):
        _SOURCES[f"{_cell}{_k}"] = re.sub(r"\bK\b", str(_k), _SOURCES[_cell])
del _SOURCES["lstm_cell"], _SOURCES["lstm_cell_grad"], _SOURCES["lstm_cell_sum"]

KERNELS = tuple(_SOURCES)
KernelSource = namedtuple("KernelSource", "name code")


def _float_dtype(kernel, dtype):
    dtype = np.dtype(dtype)
    if dtype not in DTYPES:
        raise DTypeError(f"kernel '{kernel}': no version for dtype {dtype} "
                         f"(float32 and float64 only)")
    return dtype


def kernel_source(kernel, dtype):
    """The CUDA source of ``kernel`` for ``dtype``: ``KernelSource(name, code)``, with the kernel
    named ``minicavs_<kernel>_<f32|f64>``."""
    return _kernel_source(kernel, _float_dtype(kernel, dtype).name)


def raw_kernel(kernel, dtype):
    """The ``cupy.RawKernel`` for ``kernel`` and ``dtype`` (compiled by CuPy on first launch,
    with :data:`minicavs.cuda.nvrtc.KERNEL_OPTIONS`)."""
    return _compiled(kernel, _float_dtype(kernel, dtype).name, "cupy")


# The memoised factories, keyed on (kernel, dtype name): np.float32 and np.dtype("float32")
# are equal but hash differently, so the public functions above normalise the dtype first.

@functools.lru_cache(maxsize=None)
def _kernel_source(kernel, dtype_name):
    if kernel not in _SOURCES:
        raise KeyError(f"unknown kernel {kernel!r}; the kernels are {KERNELS}")
    ctype, suffix = DTYPES[np.dtype(dtype_name)]
    name = f"minicavs_{kernel}_{suffix}"
    code = Template(_SOURCES[kernel]).substitute(name=name, T=ctype, loop=_GRID_STRIDE)
    return KernelSource(name, code)


def all_kernel_sources():
    """Every (kernel, dtype) source, for the NVRTC compile check."""
    return [kernel_source(k, d) for k in KERNELS for d in DTYPES]


@functools.lru_cache(maxsize=None)
def _compiled(kernel, dtype, runner):
    source = kernel_source(kernel, dtype)
    return make_kernel(source.code, source.name, runner)


def make_kernel(code, name, runner):
    """Kernel ``name`` of the CUDA source ``code``, ready to launch: for ``runner`` "cupy" a
    ``cupy.RawKernel`` (compiled by CuPy on first launch, with ``nvrtc.KERNEL_OPTIONS``), for
    "shim" its CPU twin."""
    from . import nvrtc, shim

    if runner == "shim":
        return shim.shim_kernel(code, name)
    cupy = nvrtc.cupy_for_kernels()
    kernel = cupy.RawKernel(code, name, options=nvrtc.KERNEL_OPTIONS)
    ahead.start(kernel, cupy.cuda.Device(cupy.cuda.runtime.getDevice()))  # (compiled beside)
    return kernel


# The kernels nearly every GPU job launches (a take, a scatter-add, the loss and its gradient,
# Adam's step), compiled ahead when a job's first graphs or block are made.
COMMON = ("gather_rows", "scatter_add_rows", "softmax_xent", "softmax_xent_grad", "adam_many")


def compile_ahead(dtype="float32"):
    """Start compiling :data:`COMMON` for ``dtype`` side by side (``cuda/ahead.py``)."""
    for kernel in COMMON:
        _compiled(kernel, np.dtype(dtype).name, "cupy")


def _launch(kernel, dtype, runner, total, args):
    """Run ``kernel`` over ``total`` elements with a 1-D grid (nothing to do when total is 0)."""
    if total == 0:
        return
    blocks = min(-(-total // BLOCK_SIZE), MAX_BLOCKS)
    if runner == "cupy":
        args = tuple(np.int64(a) if isinstance(a, int) else a for a in args)
    ahead.ready(_compiled(kernel, dtype.name, runner))((blocks,), (BLOCK_SIZE,), args)


# ---------------------------------------------------------------------------------------------
# Launch-time checks: everything the kernel itself cannot check, done before any launch.

_RUNNERS = ("numpy", "shim", "cupy")


def _is_cupy(a):
    from ..backend import is_cupy_array

    return is_cupy_array(a)


def _pick_runner(kernel, runner, arrays):
    on_gpu = [_is_cupy(a) for a in arrays if a is not None]
    if runner is None:
        runner = "cupy" if any(on_gpu) else "numpy"
    if runner not in _RUNNERS:
        raise ValueError(f"kernel '{kernel}': runner must be one of {_RUNNERS}, got {runner!r}")
    want_gpu = runner == "cupy"
    for a, gpu in zip([a for a in arrays if a is not None], on_gpu):
        if gpu != want_gpu:
            raise DTypeError(f"kernel '{kernel}': runner '{runner}' needs "
                             f"{'CuPy' if want_gpu else 'NumPy'} arrays, got a "
                             f"{'CuPy' if gpu else 'NumPy'} array; move them to one device first")
        if not gpu and not isinstance(a, np.ndarray):
            raise DTypeError(f"kernel '{kernel}': expected arrays, got {type(a).__name__}")
    return runner


def _xp(runner):
    if runner == "cupy":
        from ..backend import _import_cupy

        return _import_cupy()
    return np


def _check_contiguous(kernel, argname, a):
    if not a.flags.c_contiguous:
        raise ShapeError(f"kernel '{kernel}': argument '{argname}' must be C-contiguous "
                         f"(got strides {a.strides} for shape {a.shape}); "
                         f"pass xp.ascontiguousarray({argname})")


def _check_rows(kernel, argname, a):
    """A float32/float64 C-contiguous array with at least one axis (its rows)."""
    if a.ndim == 0:
        raise ShapeError(f"kernel '{kernel}': argument '{argname}' must have rows "
                         f"(at least one axis), got a 0-d array")
    _float_dtype(kernel, a.dtype)
    _check_contiguous(kernel, argname, a)


def _check_same_rows(kernel, argname, a, out):
    """``a`` and ``out`` hold rows (:func:`_check_rows`) of one shape and dtype."""
    _check_rows(kernel, argname, a)
    _check_rows(kernel, "out", out)
    _check_same_dtype(kernel, "out", out, a.dtype)
    if tuple(out.shape[1:]) != tuple(a.shape[1:]):
        raise ShapeError(f"kernel '{kernel}': rows of '{argname}' {tuple(a.shape[1:])} and of "
                         f"'out' {tuple(out.shape[1:])} must have the same shape")


def _check_same_dtype(kernel, argname, a, dtype):
    if a.dtype != dtype:
        raise DTypeError(f"kernel '{kernel}': argument '{argname}' must have dtype {dtype} "
                         f"like the rows it is copied from or to, got {a.dtype}")


def _out(kernel, runner, out, shape, dtype, **inputs):
    """``out`` checked (shape, dtype, C-contiguity, no overlap with ``inputs``), or a new array
    when None."""
    if out is None:
        return _xp(runner).empty(shape, dtype=dtype)
    if tuple(out.shape) != tuple(shape):
        raise ShapeError(f"kernel '{kernel}': argument 'out' must have shape {tuple(shape)}, "
                         f"got {tuple(out.shape)}")
    _check_same_dtype(kernel, "out", out, dtype)
    _check_contiguous(kernel, "out", out)
    _check_no_overlap(kernel, out, **inputs)
    return out


def _check_no_overlap(kernel, out, **inputs):
    """The kernels declare their pointers ``__restrict__``: ``out`` must not alias an input."""
    xp = _xp("cupy" if _is_cupy(out) else "numpy")
    for argname, a in inputs.items():
        if a.size and out.size and xp.may_share_memory(out, a):
            raise ShapeError(f"kernel '{kernel}': argument 'out' overlaps argument '{argname}'; "
                             "the kernel reads and writes separate buffers (copy one first)")


def _check_index(kernel, argname, idx, ndim, num_rows, check_range=True):
    """int32, C-contiguous, ``ndim`` axes and (with ``check_range``, which costs a min and a max,
    a device sync on a GPU) every entry -1 or in ``0..num_rows-1``."""
    if idx.dtype != INDEX_DTYPE:
        raise DTypeError(f"kernel '{kernel}': argument '{argname}' must be int32 indices, got "
                         f"{idx.dtype}; convert once with {argname}.astype(np.int32)")
    if idx.ndim != ndim:
        raise ShapeError(f"kernel '{kernel}': argument '{argname}' must have {ndim} "
                         f"ax{'is' if ndim == 1 else 'es'}, got shape {tuple(idx.shape)}")
    _check_contiguous(kernel, argname, idx)
    if not check_range or idx.size == 0:
        return
    low, high = _bounds(idx)
    if low < -1 or high >= num_rows:
        bad = low if low < -1 else high
        position = tuple(int(p[0]) for p in (idx == bad).nonzero())
        where = position[0] if ndim == 1 else position
        valid = f"0..{num_rows - 1}" if num_rows else "none: there are no rows"
        raise IndexRangeError(f"kernel '{kernel}': argument '{argname}' has index {bad} at "
                              f"position {where}, out of range for {num_rows} rows "
                              f"(valid: -1 for no row, {valid})")


def _bounds(idx):
    """(min, max) of a non-empty index array as Python ints, in one copy from a GPU."""
    if isinstance(idx, np.ndarray):
        return int(idx.min()), int(idx.max())
    low, high = _xp("cupy").stack((idx.min(), idx.max())).get().tolist()
    return int(low), int(high)


def _row_size(a):
    return int(np.prod(a.shape[1:], dtype=np.int64))


# ---------------------------------------------------------------------------------------------
# gather_rows

def gather_rows_numpy(src, idx, out=None):
    """NumPy twin of :func:`gather_rows`."""
    result = np.zeros((idx.shape[0],) + src.shape[1:], dtype=src.dtype) if out is None else out
    present = idx >= 0
    result[present] = src[idx[present]]
    result[~present] = 0
    return result


def gather_rows(src, idx, out=None, *, runner=None, check_indices=True):
    """``out[i] = src[idx[i]]`` for all i in one launch; ``idx[i] == -1`` gives a zero row.

    ``src``: (N, ...) float32/float64; ``idx``: (n,) int32; ``out``: (n, ...), allocated if None.
    """
    kernel = "gather_rows"
    runner = _pick_runner(kernel, runner, (src, idx, out))
    _check_rows(kernel, "src", src)
    _check_index(kernel, "idx", idx, 1, src.shape[0], check_indices)
    shape = (idx.shape[0],) + tuple(src.shape[1:])
    out = _out(kernel, runner, out, shape, src.dtype, src=src, idx=idx)
    if runner == "numpy":
        return gather_rows_numpy(src, idx, out)
    n = int(idx.shape[0])
    row_size = _row_size(src)
    _launch(kernel, src.dtype, runner, n * row_size, (src, idx, out, n, row_size))
    return out


# ---------------------------------------------------------------------------------------------
# gather_children

def gather_children_numpy(src, child_idx, out=None):
    """NumPy twin of :func:`gather_children`."""
    n, k = child_idx.shape
    if out is None:
        out = np.zeros((k, n) + src.shape[1:], dtype=src.dtype)
    for c in range(k):
        gather_rows_numpy(src, child_idx[:, c], out[c])
    return out


def gather_children(src, child_idx, out=None, *, runner=None, check_indices=True):
    """All children of a batching task in one launch: ``out[c, i] = src[child_idx[i, c]]``.

    ``child_idx``: (n, k) int32, row i the children of the task's vertex i, -1 where absent
    (zeros). ``out``: (k, n, ...) so that ``out[c]``, the input of ``gather(c)``, is one
    contiguous (n, ...) block.
    """
    kernel = "gather_children"
    runner = _pick_runner(kernel, runner, (src, child_idx, out))
    _check_rows(kernel, "src", src)
    _check_index(kernel, "child_idx", child_idx, 2, src.shape[0], check_indices)
    n, k = (int(s) for s in child_idx.shape)
    shape = (k, n) + tuple(src.shape[1:])
    out = _out(kernel, runner, out, shape, src.dtype, src=src, child_idx=child_idx)
    if runner == "numpy":
        return gather_children_numpy(src, child_idx, out)
    row_size = _row_size(src)
    _launch(kernel, src.dtype, runner, k * n * row_size, (src, child_idx, out, n, k, row_size))
    return out


# ---------------------------------------------------------------------------------------------
# scatter_add_rows (atomic and deterministic)

ScatterPlan = namedtuple("ScatterPlan", "order targets starts num_rows")
ScatterPlan.__doc__ = """The sorted form of a scatter index, built once and reused by every
deterministic scatter-add with that index (a batch's gather indices do not change between the
levels of its backward pass): rows ``order[starts[s]:starts[s+1]]`` of the values add into row
``targets[s]``; -1 entries are left out. ``targets`` are int32 rows of ``out``; ``order`` and
``starts`` are int64 positions in the values, which may number 2**31 or more."""


def scatter_plan(idx, num_rows, *, check_indices=True):
    """Sort ``idx`` (int32, (n,)) by target row, stably, for :func:`scatter_add_rows`.

    Works on NumPy or CuPy indices (the sort runs where the indices are)."""
    kernel = "scatter_plan"
    _check_index(kernel, "idx", idx, 1, int(num_rows), check_indices)
    xp = _xp("cupy" if _is_cupy(idx) else "numpy")
    order = xp.argsort(idx, kind="stable")  # CuPy's sorts are always stable
    sorted_idx = idx[order]
    first = int((sorted_idx < 0).sum())  # the -1 entries sort first; they are dropped
    order, sorted_idx = order[first:], sorted_idx[first:]
    if sorted_idx.size:
        breaks = xp.flatnonzero(sorted_idx[1:] != sorted_idx[:-1]) + 1
        starts = xp.concatenate([xp.zeros(1, dtype=PLAN_DTYPE), breaks,
                                 xp.full(1, sorted_idx.size, dtype=PLAN_DTYPE)])
    else:
        starts = xp.zeros(1, dtype=PLAN_DTYPE)
    targets = sorted_idx[starts[:-1]]
    return ScatterPlan(order.astype(PLAN_DTYPE), targets.astype(INDEX_DTYPE),
                       starts.astype(PLAN_DTYPE), int(num_rows))


def _check_plan(kernel, plan, out, idx):
    """A plan from :func:`scatter_plan` for this ``out`` and ``idx``: the kernel reads its
    arrays as int64, int32, int64 (a hand-made plan of other dtypes would be misread)."""
    if plan.num_rows != out.shape[0] or plan.order.shape[0] > idx.shape[0]:
        raise ShapeError(f"kernel '{kernel}': the plan was made for {plan.num_rows} rows and "
                         f"{plan.order.shape[0]} indices, not for this 'out'/'idx'")
    for field, dtype in (("order", PLAN_DTYPE), ("targets", INDEX_DTYPE), ("starts", PLAN_DTYPE)):
        array = getattr(plan, field)
        if array.dtype != dtype or array.ndim != 1:
            raise DTypeError(f"kernel '{kernel}': plan.{field} must be a 1-D {dtype} array "
                             f"(make plans with scatter_plan), got {array.dtype} with shape "
                             f"{tuple(array.shape)}")
        _check_contiguous(kernel, f"plan.{field}", array)


def _check_scatter(kernel, runner, values, idx, out, check_indices, plan=None, unique=False):
    """The runner of a scatter, after the checks every scatter kernel makes before launch: rows
    of one shape and dtype, one index per row of ``values``, indices in range (and, with
    ``unique``, none repeated), ``out`` apart from the inputs."""
    plan_arrays = tuple(plan[:3]) if plan is not None else ()
    runner = _pick_runner(kernel, runner, (values, idx, out) + plan_arrays)
    _check_same_rows(kernel, "values", values, out)
    if idx.ndim != 1 or idx.shape[0] != values.shape[0]:
        raise ShapeError(f"kernel '{kernel}': argument 'idx' must have shape "
                         f"({values.shape[0]},), one index per row of 'values', got "
                         f"{tuple(idx.shape)}")
    _check_index(kernel, "idx", idx, 1, out.shape[0], check_indices)
    if unique and check_indices:
        _check_unique(kernel, idx)
    _check_no_overlap(kernel, out, values=values, idx=idx)
    return runner


def _fold_sorted(kernel, reduce, values, idx, out, plan, runner):
    """The deterministic scatter kernel of ``reduce``: each output element folded by one
    thread over its rows in index order, by ``plan`` (made here when None)."""
    if plan is None:
        plan = scatter_plan(idx, out.shape[0], check_indices=False)
    else:
        _check_plan(kernel, plan, out, idx)
    num_groups, row_size = int(plan.targets.shape[0]), _row_size(values)
    _launch(f"scatter_{reduce}_sorted", values.dtype, runner, num_groups * row_size,
            (values, plan.order, plan.targets, plan.starts, out, num_groups, row_size))
    return out


def scatter_add_rows_numpy(values, idx, out):
    """NumPy twin of :func:`scatter_add_rows`: ``np.add.at``, which adds the rows one after
    another in index order — the order the deterministic kernel uses: they agree bit for bit."""
    present = idx >= 0
    np.add.at(out, idx[present], values[present])
    return out


def flush_subnormals(a):
    """``a`` with its float32 subnormals replaced by zeros of the same sign: what a float32
    operation compiled with ``-ftz=true`` (every CuPy kernel) does to its operands and its
    result, and what ``atom.global.add.f32`` always does. float64 arrays come back unchanged
    (doubles never flush). NumPy or CuPy, as ``a`` is."""
    if a.dtype != np.float32:
        return a
    xp = _xp("cupy" if _is_cupy(a) else "numpy")
    tiny = np.finfo(np.float32).tiny
    return xp.where(xp.abs(a) < tiny, xp.copysign(np.float32(0), a), a)


def scatter_add_rows(values, idx, out, *, deterministic=False, plan=None, runner=None,
                     check_indices=True):
    """``out[idx[i]] += values[i]`` for every i with ``idx[i] != -1``; repeated indices add up.

    ``values``: (n, ...); ``idx``: (n,) int32; ``out``: (N, ...) updated in place and returned.
    The default kernel uses ``atomicAdd`` (float64 atomics are native from sm_60 on, a
    compare-and-swap loop below), so with repeated indices the float rounding depends on thread
    timing, and float32 subnormals are flushed (``atom.global.add.f32`` does that whatever the
    compiler flags say): within ``terms * (eps * sum|x| + 3 * tiny)`` of the sequential sum.
    ``deterministic=True`` sorts the indices once (or takes a ready ``plan`` from
    :func:`scatter_plan`) and sums each output row in a fixed order: the same bits on every
    run, equal to :func:`scatter_add_rows_numpy`, subnormals included.
    """
    kernel = "scatter_add_rows"
    runner = _check_scatter(kernel, runner, values, idx, out, check_indices, plan)
    if runner == "numpy":
        return scatter_add_rows_numpy(values, idx, out)
    if deterministic:
        return _fold_sorted(kernel, "add", values, idx, out, plan, runner)
    n, row_size = int(idx.shape[0]), _row_size(values)
    _launch(kernel, values.dtype, runner, n * row_size, (values, idx, out, n, row_size))
    return out


def scatter_reduce_rows_numpy(values, idx, out, reduce):
    """NumPy twin of :func:`scatter_reduce_rows`: ``np.<reduce>.at``, rows in index order."""
    present = idx >= 0
    getattr(np, reduce).at(out, idx[present], values[present])
    return out


def scatter_reduce_rows(values, idx, out, reduce, *, plan=None, runner=None, check_indices=True):
    """``out[idx[i]] = reduce(out[idx[i]], values[i])`` for every i with ``idx[i] != -1``, in
    index order, ``reduce`` one of "add", "multiply", "maximum", "minimum" (NumPy's ufuncs, NaN
    propagating; "add" is :func:`scatter_add_rows`'s deterministic kernel). Each output element
    is folded by one thread over its rows in a fixed order (a ``plan`` from
    :func:`scatter_plan`, made here if not given): the same bits on every run, equal to
    :func:`scatter_reduce_rows_numpy`. Shapes and checks as :func:`scatter_add_rows`."""
    kernel = "scatter_reduce_rows"
    if reduce not in SCATTER_FOLDS:
        raise ValueError(f"kernel '{kernel}': reduce must be one of {tuple(SCATTER_FOLDS)}, "
                         f"got {reduce!r}")
    runner = _check_scatter(kernel, runner, values, idx, out, check_indices, plan)
    if runner == "numpy":
        return scatter_reduce_rows_numpy(values, idx, out, reduce)
    return _fold_sorted(kernel, reduce, values, idx, out, plan, runner)


# ---------------------------------------------------------------------------------------------
# scatter_rows, pull_rows and push_rows

def scatter_rows_numpy(values, idx, out):
    """NumPy twin of :func:`scatter_rows`."""
    present = idx >= 0
    out[idx[present]] = values[present]
    return out


def _check_unique(kernel, idx, argname="idx"):
    xp = _xp("cupy" if _is_cupy(idx) else "numpy")
    kept = xp.sort(idx[idx >= 0])
    repeats = xp.flatnonzero(kept[1:] == kept[:-1])
    if repeats.size:
        bad = int(kept[int(repeats[0])])
        positions = [int(p) for p in xp.flatnonzero(idx == bad)[:2]]
        raise IndexRangeError(f"kernel '{kernel}': argument '{argname}' has index {bad} more "
                              f"than once (positions {positions[0]} and {positions[1]}); each "
                              "row is written at most once — use scatter_add_rows to add up")


def scatter_rows(values, idx, out, *, runner=None, check_indices=True):
    """``out[idx[i]] = values[i]`` for every i with ``idx[i] != -1``; indices must not repeat
    (checked with ``check_indices``). ``out`` is updated in place and returned."""
    kernel = "scatter_rows"
    runner = _check_scatter(kernel, runner, values, idx, out, check_indices, unique=True)
    if runner == "numpy":
        return scatter_rows_numpy(values, idx, out)
    n, row_size = int(idx.shape[0]), _row_size(values)
    _launch(kernel, values.dtype, runner, n * row_size, (values, idx, out, n, row_size))
    return out


def copy_rows_numpy(src, src_idx, out, dst_idx):
    """NumPy twin of :func:`copy_rows`."""
    keep = dst_idx >= 0
    out[dst_idx[keep]] = gather_rows_numpy(src, src_idx[keep])
    return out


def copy_rows(src, src_idx, out, dst_idx, *, runner=None, check_indices=True):
    """``out[dst_idx[i]] = src[src_idx[i]]`` for all i in one launch: the general row copy that
    gather (``dst_idx`` = 0..n-1) and scatter (``src_idx`` = 0..n-1) specialise. ``src_idx``
    -1 writes a zero row; ``dst_idx`` -1 drops the row; destinations must not repeat."""
    kernel = "copy_rows"
    runner = _pick_runner(kernel, runner, (src, src_idx, out, dst_idx))
    _check_same_rows(kernel, "src", src, out)
    _check_index(kernel, "src_idx", src_idx, 1, src.shape[0], check_indices)
    _check_index(kernel, "dst_idx", dst_idx, 1, out.shape[0], check_indices)
    if src_idx.shape != dst_idx.shape:
        raise ShapeError(f"kernel '{kernel}': 'src_idx' and 'dst_idx' must pair up, got shapes "
                         f"{tuple(src_idx.shape)} and {tuple(dst_idx.shape)}")
    if check_indices:
        _check_unique(kernel, dst_idx, "dst_idx")
    _check_no_overlap(kernel, out, src=src, src_idx=src_idx, dst_idx=dst_idx)
    if runner == "numpy":
        return copy_rows_numpy(src, src_idx, out, dst_idx)
    n, row_size = int(src_idx.shape[0]), _row_size(src)
    _launch(kernel, src.dtype, runner, n * row_size, (src, src_idx, dst_idx, out, n, row_size))
    return out


def pull_rows(external, level_order, out=None, *, runner=None, check_indices=True):
    """Rows of the caller's tensor into level order: ``out[p] = external[level_order[p]]``
    (``level_order[p]``: the caller's row of the vertex at level-order position p)."""
    return gather_rows(external, level_order, out, runner=runner, check_indices=check_indices)


def push_rows(level_rows, level_order, out=None, *, runner=None, check_indices=True):
    """Level-order rows back to the caller's order: ``out[level_order[p]] = level_rows[p]``.

    The inverse of :func:`pull_rows` for the same ``level_order``. ``out`` defaults to zeros
    with ``len(level_order)`` rows (caller rows no vertex maps to stay zero)."""
    runner = _pick_runner("push_rows", runner, (level_rows, level_order, out))
    if out is None:
        out = _xp(runner).zeros(level_rows.shape, dtype=level_rows.dtype)
    return scatter_rows(level_rows, level_order, out, runner=runner, check_indices=check_indices)


# ---------------------------------------------------------------------------------------------
# lstm_cell, lstm_cell_grad

def _rows_of(a):
    """``(a C-contiguous 1-D view from a's first element over all its rows, a's row stride in
    elements)`` for a 2-D float array whose last axis is contiguous (a column window of a
    wider array reads in place); None for any other."""
    if a.ndim != 2 or a.dtype not in DTYPES or a.strides[1] != a.itemsize or \
            a.strides[0] % a.itemsize or a.shape[0] == 0:
        return None
    ld = a.strides[0] // a.itemsize
    span = (a.shape[0] - 1) * ld + a.shape[1]
    tricks = np.lib.stride_tricks if isinstance(a, np.ndarray) else _xp("cupy").lib.stride_tricks
    return tricks.as_strided(a, shape=(span,), strides=(a.itemsize,)), ld


def lstm_cell(pre, c_prev, out=None, *, runner=None):
    """``ops/cells.py``'s LSTM cell in one launch: ``pre`` (rows, (3 + k)·H), ``c_prev`` k <= 2
    arrays (rows, H), ``out`` (rows, 2H) = [h, c], allocated if None; rows may be strided.
    Returns None where the kernel does not apply (k > 2, another dtype or layout): the op
    then computes it its own way (its NumPy form is this kernel's twin)."""
    k = len(c_prev)
    runner = _pick_runner("lstm_cell", runner, (pre, *c_prev, out))
    if runner == "numpy" or k > 2 or pre.ndim != 2 or any(c.dtype != pre.dtype for c in c_prev):
        return None
    rows, H = pre.shape[0], pre.shape[1] // (3 + k)
    if out is None:
        out = _xp(runner).empty((rows, 2 * H), pre.dtype)
    operands = [_rows_of(a) for a in (pre, *c_prev, out)]
    if None in operands or out.dtype != pre.dtype:
        return None
    (p, p_ld), *cells, (o, o_ld) = operands
    cells += [(p, 0)] * (2 - k)  # (an absent cell: never read)
    _launch(f"lstm_cell{k}", pre.dtype, runner, rows * H,
            (p, p_ld, *cells[0], *cells[1], o, o_ld, rows, H))
    return out


def lstm_cell_sum(terms, c_prev, out=None, pre=None, *, runner=None):
    """:func:`lstm_cell` on ``pre = terms[0] + terms[1] (+ terms[2])`` (added in that order;
    each (rows, (3 + k)·H), or one row of that width for all rows: a bias), in one launch that
    also writes the sum to ``pre`` (allocated if None). Returns ``(pre, out)``, or None where
    the kernel does not apply."""
    k = len(c_prev)
    runner = _pick_runner("lstm_cell_sum", runner, (*terms, *c_prev, out, pre))
    rows_of = [t for t in terms if t.ndim == 2]
    if runner == "numpy" or k > 2 or len(terms) not in (2, 3) or not rows_of or \
            any(t.dtype != terms[0].dtype for t in (*terms, *c_prev)):
        return None
    rows, width = rows_of[0].shape
    if width % (3 + k) or any(t.ndim not in (1, 2) or t.shape[-1] != width
                              or (t.ndim == 2 and t.shape[0] != rows) for t in terms):
        return None
    H, xp = width // (3 + k), _xp(runner)
    pre = xp.empty((rows, width), terms[0].dtype) if pre is None else pre
    out = xp.empty((rows, 2 * H), terms[0].dtype) if out is None else out
    operands = [_rows_of(a) for a in (*[t for t in terms if t.ndim == 2], pre, *c_prev, out)]
    if None in operands or len({out.dtype, pre.dtype, terms[0].dtype}) > 1:
        return None
    rowwise = iter(operands)
    summed = [next(rowwise) if t.ndim == 2 else (xp.ascontiguousarray(t), 0) for t in terms]
    summed += [summed[0]] * (3 - len(terms))  # (an absent third term: never read)
    (p, p_ld), *cells, (o, o_ld) = list(rowwise)
    cells += [(p, 0)] * (2 - k)
    _launch(f"lstm_cell_sum{k}", pre.dtype, runner, rows * H,
            (*summed[0], *summed[1], *summed[2], len(terms), p, p_ld, *cells[0], *cells[1],
             o, o_ld, rows, H))
    return pre, out


def lstm_cell_grad(pre, c_prev, out, g, *, runner=None):
    """The gradient of :func:`lstm_cell` in one launch: ``[∂pre, ∂c_prev[0], …]`` side by side
    ((rows, (3 + 2k)·H)) from the cell's ``out`` and its gradient ``g``; None where the
    kernel does not apply (as :func:`lstm_cell`)."""
    k = len(c_prev)
    runner = _pick_runner("lstm_cell_grad", runner, (pre, *c_prev, out, g))
    if runner == "numpy" or k > 2 or pre.ndim != 2 or \
            any(a.dtype != pre.dtype for a in (*c_prev, out, g)):
        return None
    rows, H = pre.shape[0], pre.shape[1] // (3 + k)
    grads = _xp(runner).empty((rows, (3 + 2 * k) * H), pre.dtype)
    operands = [_rows_of(a) for a in (pre, *c_prev, out, g, grads)]
    if None in operands:
        return None
    (p, p_ld), *cells, (o, o_ld), (gg, g_ld), (d, d_ld) = operands
    cells += [(p, 0)] * (2 - k)
    _launch(f"lstm_cell_grad{k}", pre.dtype, runner, rows * H,
            (p, p_ld, *cells[0], *cells[1], o, o_ld, gg, g_ld, d, d_ld, rows, H))
    return grads


# ---------------------------------------------------------------------------------------------
# softmax_xent, softmax_xent_grad

def _xent_operands(kernel, runner, logits, labels, *rest):
    """(runner, logits as rows with their stride, labels as int64 rows, rows, C), or None where
    the kernel does not apply (another dtype or layout, NumPy arrays: the op's own form)."""
    runner = _pick_runner(kernel, runner, (logits, labels, *rest))
    if runner == "numpy" or logits.ndim == 0 or labels.dtype != np.int64 or \
            any(a.dtype != logits.dtype for a in rest):
        return None
    C = logits.shape[-1]
    rows_view = _rows_of(logits.reshape(-1, C)) if logits.size else None
    if rows_view is None or not labels.flags.c_contiguous:
        return None
    return runner, rows_view, labels.reshape(-1), int(labels.size), C


def softmax_xent(logits, labels, out=None, *, runner=None):
    """Per row ``log Σ exp(logits) - logits[label]`` in one launch (``ops/loss.py``'s
    softmax_cross_entropy; its NumPy form is the twin): the losses, shaped as ``labels``
    (into ``out`` where given, contiguous), or None where the kernel does not apply or a label
    is out of range (the op then raises)."""
    operands = _xent_operands("softmax_xent", runner, logits, labels)
    if operands is None or (out is not None and not out.flags.c_contiguous):
        return None
    runner, (z, ld), y, rows, C = operands
    xp = _xp(runner)
    losses = xp.empty(labels.shape, logits.dtype) if out is None else out
    from ..backend import known_range

    known = known_range(labels)  # (labels copied from the host: checked there, no wait)
    checked = known is not None and 0 <= known[0] and known[1] < C
    bad = xp.empty(1, np.int32) if checked else xp.zeros(1, np.int32)
    _launch("softmax_xent", logits.dtype, runner, rows, (z, ld, y, losses, bad, rows, C))
    return losses if checked or not int(bad[0]) else None  # (else one copy back, the check
    # the op makes anyway)


def softmax_xent_grad(logits, labels, g, *, runner=None):
    """``(softmax(logits) - onehot(labels)) · g`` per row in one launch, shaped as ``logits``
    (``g``: contiguous, or one value broadcast, as a mean's gradient is); None where the
    kernel does not apply."""
    operands = _xent_operands("softmax_xent_grad", runner, logits, labels, g)
    if operands is None:
        return None
    runner, (z, ld), y, rows, C = operands
    if g.flags.c_contiguous:
        g, g_step = g.reshape(-1), 1
    elif g.size and not any(g.strides):  # one value for every row: read in place
        g, g_step = _xp(runner).lib.stride_tricks.as_strided(g, (1,), (g.itemsize,)), 0
    else:
        return None
    xp = _xp(runner)  # (the labels were checked by the forward: the flag is not read)
    grads, bad = xp.empty(logits.shape, logits.dtype), xp.empty(1, np.int32)
    _launch("softmax_xent_grad", logits.dtype, runner, rows,
            (z, ld, y, g, g_step, grads, bad, rows, C))
    return grads


# ---------------------------------------------------------------------------------------------
# adam

def adam_many(params, grads, ms, vs, beta1, beta2, eps, bc2, step, decay, *, runner=None):
    """One Adam step for same-dtype, contiguous CuPy parameters (lists, in place with their
    moments) in one launch and one copy of their addresses to the device; False where the
    kernel does not apply (NumPy arrays, another dtype or layout): the optimiser's own form
    runs."""
    arrays = [*params, *grads, *ms, *vs]
    if not params:
        return False
    runner = _pick_runner("adam_many", runner, arrays)
    dtype = params[0].dtype
    if runner == "numpy" or dtype not in DTYPES or any(
            a.dtype != dtype or not a.flags.c_contiguous for a in arrays) or any(
            a.shape != p.shape for group in (grads, ms, vs) for a, p in zip(group, params)):
        return False
    address = device_address(_xp(runner))
    offsets = np.cumsum([0] + [p.size for p in params])
    table = np.array([address(a) for a in arrays] + offsets.tolist(), np.int64)
    if runner == "cupy":  # (a step's gradients tend to get last step's blocks from the pool:
        # the same addresses, then the table on the device is the one copied before)
        key = table.tobytes()
        found = _adam_tables.get(key)
        if found is None:
            if len(_adam_tables) >= 8:
                _adam_tables.clear()
            found = _adam_tables[key] = _xp(runner).asarray(table)
        table = found
    hyper = (dtype.type(h) for h in (beta1, beta2, eps, bc2, step, decay))
    _launch("adam_many", dtype, runner, int(offsets[-1]),
            (table, len(params), *hyper, int(offsets[-1])))
    return True


_adam_tables = {}  # the address tables copied to the device lately (read only), by content


def device_address(xp):
    """How to read an array's address for a kernel: a CuPy array's device pointer; on the
    emulated device or for the shim (NumPy arrays) its host memory's, as the native kernels
    read it."""
    if xp is np or getattr(xp, "emulated", False):
        from ..cpu.kernels import data_address

        return data_address
    return _cupy_address


def _cupy_address(x):
    return x.data.ptr
