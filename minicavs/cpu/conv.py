"""The convolution as one native call: im2col into a scratch block and one BLAS gemm per block
of samples, for the ``conv`` primitive and its two gradients (``ops/conv.py``).

Composed from ``unfold`` and ``matmul`` a LeNet layer's step is some twenty op calls, each a
NumPy dispatch, and a batched product of many small matrices. Here each of the three is one C
call over the batch, in blocks of samples: the windows of a block are laid out as one matrix
(C·kH·kW, block·L) — window offset by row, (sample, output position) by column — so each
product is one large gemm of NumPy's BLAS (whose address ``cpu/blas.py`` finds; no link step):

* forward: Y (O, block·L) = W (O, C·K) · cols, then each sample's (O, L) slab is copied into
  ``y`` (N, O, *out) with the bias added;
* weight gradient: ∂W += ∂Y (O, block·L) · colsᵀ, ∂Y gathered from ``g``'s samples;
* input gradient: ∂cols = Wᵀ · ∂Y, added back into ∂x by col2im.

A block of one sample needs no copy of Y or ∂Y at all (they are ``y[n]`` and ``g[n]``); the
block size trades that against the gemms' size (:data:`BLOCK_ELEMENTS`).

None is returned where this does not apply — another dtype, 3-D windows, a BLAS without a
CBLAS gemm, native code off — and the caller runs the composed form.
"""

import ctypes
import functools
import math
import threading

import numpy as np

from . import build

_SOURCE = r"""// minicavs native convolution products (minicavs/cpu/conv.py)
#include <cstdint>
#include <cstring>

// CBLAS gemm, row-major (101); 111 no transpose, 112 transpose.
template <typename T, typename I>
using gemm_t = void (*)(int, int, int, I, I, I, T, const T *, I, const T *, I, T, T *, I);

// Sizes: P samples, O filters, CK = C*kh*kw window entries, L output positions; per sample
// the windows are a (CK, L) matrix, the result and its gradient (O, L), the filters (O, CK).

// y[p] = W cols[p] + b (b may be null).
template <typename T, typename I>
static void forward(void *function, const T *cols, const T *w, const T *b, const int64_t *s,
                    T *y) {
  const gemm_t<T, I> gemm = (gemm_t<T, I>)function;
  const int64_t P = s[0], O = s[1], CK = s[2], L = s[3];
  for (int64_t p = 0; p < P; ++p) {
    T *out = y + p * O * L;
    if (b)
      for (int64_t o = 0; o < O; ++o) {
        const T bias = b[o];
        #pragma omp simd
        for (int64_t l = 0; l < L; ++l) out[o * L + l] = bias;
      }
    gemm(101, 111, 111, (I)O, (I)L, (I)CK, (T)1, w, (I)CK, cols + p * CK * L, (I)L,
         b ? (T)1 : (T)0, out, (I)L);
  }
}

// out[r][c] += sum over l of a[r][l] b[c][l], for TO rows of a and TK of b: TO*TK vector
// accumulators, TO + TK loads per TO*TK multiply-adds.
template <typename T, int TO, int TK>
static inline void dot_tile(const T *a, const T *b, int64_t L, T *out, int64_t ldo) {
  typedef T V __attribute__((vector_size(64)));
  constexpr int64_t n = 64 / sizeof(T);
  V acc[TO][TK] = {};
  int64_t l = 0;
  for (; l + n <= L; l += n) {
    V av[TO], bv[TK];
    for (int r = 0; r < TO; ++r) std::memcpy(&av[r], a + r * L + l, sizeof(V));
    for (int c = 0; c < TK; ++c) std::memcpy(&bv[c], b + c * L + l, sizeof(V));
    for (int r = 0; r < TO; ++r)
      for (int c = 0; c < TK; ++c) acc[r][c] += av[r] * bv[c];
  }
  for (int r = 0; r < TO; ++r)
    for (int c = 0; c < TK; ++c) {
      T s = 0;
      for (int64_t k = 0; k < n; ++k) s += acc[r][c][k];
      for (int64_t k = l; k < L; ++k) s += a[r * L + k] * b[c * L + k];
      out[r * ldo + c] += s;
    }
}

// dW (O, CK) += g (O, L) cols^T (L, CK) for one sample, as dot products in tiles of 3 x 4.
template <typename T>
static void dots(const T *g, const T *cols, int64_t O, int64_t CK, int64_t L, T *dw) {
  int64_t o = 0;
  for (; o + 3 <= O; o += 3) {
    int64_t k = 0;
    for (; k + 4 <= CK; k += 4) dot_tile<T, 3, 4>(g + o * L, cols + k * L, L, dw + o * CK + k, CK);
    for (; k < CK; ++k) dot_tile<T, 3, 1>(g + o * L, cols + k * L, L, dw + o * CK + k, CK);
  }
  for (; o < O; ++o) {
    int64_t k = 0;
    for (; k + 4 <= CK; k += 4) dot_tile<T, 1, 4>(g + o * L, cols + k * L, L, dw + o * CK + k, CK);
    for (; k < CK; ++k) dot_tile<T, 1, 1>(g + o * L, cols + k * L, L, dw + o * CK + k, CK);
  }
}

// dW = sum over p of g[p] cols[p]^T.
template <typename T, typename I>
static void weight_grad(void *function, const T *cols, const T *g, const int64_t *s, T *dw) {
  const gemm_t<T, I> gemm = (gemm_t<T, I>)function;
  const int64_t P = s[0], O = s[1], CK = s[2], L = s[3];
  if (s[4]) {  // few filters, long rows: dot products (conv.py, DOT_MAX_FILTERS)
    std::memset(dw, 0, sizeof(T) * O * CK);
    for (int64_t p = 0; p < P; ++p) dots(g + p * O * L, cols + p * CK * L, O, CK, L, dw);
    return;
  }
  for (int64_t p = 0; p < P; ++p)
    gemm(101, 111, 112, (I)O, (I)CK, (I)L, (T)1, g + p * O * L, (I)L, cols + p * CK * L, (I)L,
         p ? (T)1 : (T)0, dw, (I)CK);
}

// dcols[p] = W^T g[p].
template <typename T, typename I>
static void input_grad(void *function, const T *g, const T *w, const int64_t *s, T *dcols) {
  const gemm_t<T, I> gemm = (gemm_t<T, I>)function;
  const int64_t P = s[0], O = s[1], CK = s[2], L = s[3];
  for (int64_t p = 0; p < P; ++p)
    gemm(101, 112, 111, (I)CK, (I)L, (I)O, (T)1, w, (I)CK, g + p * O * L, (I)L, (T)0,
         dcols + p * CK * L, (I)L);
}

extern "C" {
#define PRODUCTS(suffix, T, I)                                                                 \
  void windows_forward_##suffix(void *f, const T *c, const T *w, const T *b,                   \
                                const int64_t *s, T *y) { forward<T, I>(f, c, w, b, s, y); }   \
  void windows_weight_grad_##suffix(void *f, const T *c, const T *g, const int64_t *s,         \
                                    T *dw) { weight_grad<T, I>(f, c, g, s, dw); }              \
  void windows_input_grad_##suffix(void *f, const T *g, const T *w, const int64_t *s,          \
                                   T *dc) { input_grad<T, I>(f, g, w, s, dc); }
PRODUCTS(f32_64, float, int64_t)
PRODUCTS(f64_64, double, int64_t)
PRODUCTS(f32_32, float, int)
PRODUCTS(f64_32, double, int)
}
"""

_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _library():
    if build.unavailable() is not None:
        return None
    with _lock:
        lib, _ = build.build(_SOURCE, "conv", origin="minicavs/cpu/conv.py")
    return lib


def _entry(name, *arrays):
    """The C function for ``name`` and the arrays' dtype, with the gemm to pass it; None where
    it does not apply."""
    dtype = arrays[0].dtype
    suffix = _SUFFIX.get(dtype)
    if suffix is None or not all(isinstance(a, np.ndarray) and a.dtype == dtype
                                 and a.flags.c_contiguous and a.size for a in arrays):
        return None
    from . import blas

    address, interface = blas.gemm(dtype)
    if interface not in ("cblas64", "cblas32"):
        return None
    lib = _library()
    if lib is None:
        return None
    return getattr(lib, f"windows_{name}_{suffix}_{interface[-2:]}"), ctypes.c_void_p(address)


# The weight gradient as dot products of whole rows, not gemms, for few filters over many
# output positions: a gemm with 6 rows of 576-long rows (LeNet's first layer) runs at 35
# GFLOP/s, the dot products at 70 (0.35 -> 0.18 ms per batch of 64); from 32 filters, or
# rows of 64, the gemm is faster (0.25 against 0.64 ms on the second layer).
DOT_MAX_FILTERS, DOT_MIN_LENGTH = 16, 256


def _sizes(samples, out_channels, window, length):
    dots = out_channels <= DOT_MAX_FILTERS and length >= DOT_MIN_LENGTH
    return np.array([samples, out_channels, window, length, dots], dtype=np.int64)


def product(cols, w, b, nd):
    """``y`` (*lead, O, *out) from the windows ``cols`` (*lead, C, *kernel, *out), filters
    ``w`` (O, C, *kernel) and ``b`` (O,) or None; None where native code does not apply."""
    entry = _entry("forward", cols, w) if b is None else _entry("forward", cols, w, b)
    if entry is None:
        return None
    function, gemm = entry
    lead, out = cols.shape[:cols.ndim - 2 * nd - 1], cols.shape[cols.ndim - nd:]
    sizes = _sizes(math.prod(lead), w.shape[0], w.size // w.shape[0], math.prod(out))
    y = np.empty(lead + (w.shape[0],) + out, dtype=cols.dtype)
    function(gemm, _p(cols), _p(w), None if b is None else _p(b), _p(sizes), _p(y))
    return y


def weight_grad(cols, g, nd):
    """∂w (O, C, *kernel) of ``sum(product(cols, w) * g)``; None where native code does not
    apply."""
    entry = _entry("weight_grad", cols, g)
    if entry is None:
        return None
    function, gemm = entry
    rank = cols.ndim - 2 * nd - 1  # the leading axes
    window = cols.shape[rank:cols.ndim - nd]
    out_channels = g.shape[rank]
    sizes = _sizes(math.prod(cols.shape[:rank]), out_channels, math.prod(window),
                   math.prod(cols.shape[cols.ndim - nd:]))
    dw = np.empty((out_channels,) + window, dtype=cols.dtype)
    function(gemm, _p(cols), _p(g), _p(sizes), _p(dw))
    return dw


def input_grad(g, w, nd):
    """∂cols (*lead, C, *kernel, *out) of ``sum(product(cols, w) * g)``; None where native
    code does not apply."""
    entry = _entry("input_grad", g, w)
    if entry is None:
        return None
    function, gemm = entry
    lead, out = g.shape[:g.ndim - nd - 1], g.shape[g.ndim - nd:]
    sizes = _sizes(math.prod(lead), w.shape[0], w.size // w.shape[0], math.prod(out))
    dcols = np.empty(lead + w.shape[1:] + out, dtype=g.dtype)
    function(gemm, _p(g), _p(w), _p(sizes), _p(dcols))
    return dcols


def _p(array):
    return ctypes.c_void_p(array.ctypes.data)
