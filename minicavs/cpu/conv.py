"""The products of a convolution as native calls: ``conv_windows`` and its two gradients
(``ops/conv.py``), each one C call over the batch.

Per sample the windows ``unfold`` laid out are a (C·K, L) matrix, the output and its gradient
(O, L), the filters (O, C·K):

* forward: y = W · cols + b, written straight into (N, O, *out);
* input gradient: ∂cols = Wᵀ · g (``fold`` then makes ∂x);
* weight gradient: ∂W = Σ over samples of g · colsᵀ.

Each picks the fastest of three loops for its sizes (below: filter rows, dot products, or a
gemm of NumPy's BLAS, whose address ``cpu/blas.py`` finds — no link step). A fused op that
took x itself, im2col inside per block of samples, was tried first and measured slower: the
backward lays the windows out again (2.1 against 1.5 ms of kernels on LeNet's two layers).

None is returned where this does not apply — another dtype, non-contiguous or empty arrays,
a BLAS without a CBLAS gemm, native code off — and the op's NumPy/CuPy form runs.
"""

import ctypes
import math

import numpy as np

from . import build
from .kernels import _SUFFIX, _p

_SOURCE = r"""// minicavs native convolution products (minicavs/cpu/conv.py)
#include <cstdint>
#include <cstring>

// CBLAS gemm, row-major (101); 111 no transpose, 112 transpose.
template <typename T, typename I>
using gemm_t = void (*)(int, int, int, I, I, I, T, const T *, I, const T *, I, T, T *, I);

// Sizes: P samples, O filters, CK = C*kh*kw window entries, L output positions; per sample
// the windows are a (CK, L) matrix, the result and its gradient (O, L), the filters (O, CK).

// y (TO, L) = b + w (TO, CK) cols (CK, L) for one sample, w[r][k] at w[r*rs + k*ks]: each
// vector of a row of cols is loaded once and multiplied into TO accumulators.
template <typename T, int TO>
static inline void filter_rows(const T *w, int64_t rs, int64_t ks, const T *b, const T *cols,
                               int64_t CK, int64_t L, T *y) {
  typedef T V __attribute__((vector_size(64)));
  constexpr int64_t n = 64 / sizeof(T);
  int64_t l = 0;
  for (; l + n <= L; l += n) {
    V acc[TO];
    for (int r = 0; r < TO; ++r) acc[r] = V{} + (b ? b[r] : (T)0);
    for (int64_t k = 0; k < CK; ++k) {
      V v;
      std::memcpy(&v, cols + k * L + l, sizeof(V));
      for (int r = 0; r < TO; ++r) acc[r] += w[r * rs + k * ks] * v;
    }
    for (int r = 0; r < TO; ++r) std::memcpy(y + r * L + l, &acc[r], sizeof(V));
  }
  for (; l < L; ++l)
    for (int r = 0; r < TO; ++r) {
      T s = b ? b[r] : (T)0;
      for (int64_t k = 0; k < CK; ++k) s += w[r * rs + k * ks] * cols[k * L + l];
      y[r * L + l] = s;
    }
}

// y (O, L) = b + w (O, CK) cols (CK, L), w[o][k] at w[o*rs + k*ks]: filter_rows eight rows
// at a time.
template <typename T>
static void filters(const T *w, int64_t rs, int64_t ks, const T *b, const T *cols, int64_t O,
                    int64_t CK, int64_t L, T *y) {
  for (int64_t o = 0; o < O; o += 8) {
    const T *wo = w + o * rs, *bo = b ? b + o : nullptr;
    T *yo = y + o * L;
    switch (O - o < 8 ? O - o : 8) {
      case 1: filter_rows<T, 1>(wo, rs, ks, bo, cols, CK, L, yo); break;
      case 2: filter_rows<T, 2>(wo, rs, ks, bo, cols, CK, L, yo); break;
      case 3: filter_rows<T, 3>(wo, rs, ks, bo, cols, CK, L, yo); break;
      case 4: filter_rows<T, 4>(wo, rs, ks, bo, cols, CK, L, yo); break;
      case 5: filter_rows<T, 5>(wo, rs, ks, bo, cols, CK, L, yo); break;
      case 6: filter_rows<T, 6>(wo, rs, ks, bo, cols, CK, L, yo); break;
      case 7: filter_rows<T, 7>(wo, rs, ks, bo, cols, CK, L, yo); break;
      default: filter_rows<T, 8>(wo, rs, ks, bo, cols, CK, L, yo);
    }
  }
}

// y[p] = W cols[p] + b (b may be null).
template <typename T, typename I>
static void forward(void *function, const T *cols, const T *w, const T *b, const int64_t *s,
                    T *y) {
  const gemm_t<T, I> gemm = (gemm_t<T, I>)function;
  const int64_t P = s[0], O = s[1], CK = s[2], L = s[3];
  if (s[4]) {  // rows long enough for filter_rows (conv.py, FILTER_MIN_LENGTH)
    for (int64_t p = 0; p < P; ++p)
      filters(w, CK, 1, b, cols + p * CK * L, O, CK, L, y + p * O * L);
    return;
  }
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

// out[r][c] += sum over samples p < P and l < L of a[p][r][l] b[p][c][l], for TO rows of
// a and TK of b (a sample's rows are sa and sb apart): TO*TK vector accumulators, TO + TK
// loads per TO*TK multiply-adds, added up once for all the samples.
template <typename T, int TO, int TK>
static inline void dot_tile(const T *a, int64_t sa, const T *b, int64_t sb, int64_t P,
                            int64_t L, T *out, int64_t ldo) {
  typedef T V __attribute__((vector_size(64)));
  constexpr int64_t n = 64 / sizeof(T);
  V acc[TO][TK] = {};
  T tail[TO][TK] = {};
  for (int64_t p = 0; p < P; ++p, a += sa, b += sb) {
    int64_t l = 0;
    for (; l + n <= L; l += n) {
      V av[TO], bv[TK];
      for (int r = 0; r < TO; ++r) std::memcpy(&av[r], a + r * L + l, sizeof(V));
      for (int c = 0; c < TK; ++c) std::memcpy(&bv[c], b + c * L + l, sizeof(V));
      for (int r = 0; r < TO; ++r)
        for (int c = 0; c < TK; ++c) acc[r][c] += av[r] * bv[c];
    }
    for (; l < L; ++l)
      for (int r = 0; r < TO; ++r)
        for (int c = 0; c < TK; ++c) tail[r][c] += a[r * L + l] * b[c * L + l];
  }
  for (int r = 0; r < TO; ++r)
    for (int c = 0; c < TK; ++c) {
      T s = tail[r][c];
      for (int64_t k = 0; k < n; ++k) s += acc[r][c][k];
      out[r * ldo + c] += s;
    }
}

// dW (O, CK) += sum over P samples of g[p] (O, L) cols[p]^T (L, CK), as dot products in
// tiles of 3 x 4.
template <typename T>
static void dots(const T *g, const T *cols, int64_t P, int64_t O, int64_t CK, int64_t L,
                 T *dw) {
  const int64_t sg = O * L, sc = CK * L;
  int64_t o = 0;
  for (; o + 3 <= O; o += 3) {
    int64_t k = 0;
    for (; k + 4 <= CK; k += 4)
      dot_tile<T, 3, 4>(g + o * L, sg, cols + k * L, sc, P, L, dw + o * CK + k, CK);
    for (; k < CK; ++k)
      dot_tile<T, 3, 1>(g + o * L, sg, cols + k * L, sc, P, L, dw + o * CK + k, CK);
  }
  for (; o < O; ++o) {
    int64_t k = 0;
    for (; k + 4 <= CK; k += 4)
      dot_tile<T, 1, 4>(g + o * L, sg, cols + k * L, sc, P, L, dw + o * CK + k, CK);
    for (; k < CK; ++k)
      dot_tile<T, 1, 1>(g + o * L, sg, cols + k * L, sc, P, L, dw + o * CK + k, CK);
  }
}

// dW = sum over p of g[p] cols[p]^T.
template <typename T, typename I>
static void weight_grad(void *function, const T *cols, const T *g, const int64_t *s, T *dw) {
  const gemm_t<T, I> gemm = (gemm_t<T, I>)function;
  const int64_t P = s[0], O = s[1], CK = s[2], L = s[3];
  if (s[5]) {  // few filters, long rows: dot products (conv.py, DOT_MAX_FILTERS)
    std::memset(dw, 0, sizeof(T) * O * CK);
    const int64_t chunk = s[5];  // samples whose windows stay in the cache for all tiles
    for (int64_t p = 0; p < P; p += chunk)
      dots(g + p * O * L, cols + p * CK * L, p + chunk < P ? chunk : P - p, O, CK, L, dw);
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
  if (s[4]) {  // W^T: row k of it is column k of W
    for (int64_t p = 0; p < P; ++p)
      filters(w, (int64_t)1, CK, (const T *)nullptr, g + p * O * L, CK, O, L, dcols + p * CK * L);
    return;
  }
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



def _library():
    return build.module_library(_SOURCE, "conv", "minicavs/cpu/conv.py")


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


# Below the products of a LeNet layer (a few filters, 25-150 window entries, rows of 64-576
# output positions) the gemm of NumPy's OpenBLAS runs at 35-90 GFLOP/s. Measured, one thread,
# batch 64, float32:
#
# * forward and input gradient as filter rows (each vector of a window row loaded once and
#   multiplied into up to eight accumulators): 1.7-2.4x faster than the gemm whenever the
#   rows hold 64 positions or more (LeNet's layers: 0.20 -> 0.09 ms, 0.22 -> 0.12 ms), slower
#   on shorter rows (32 filters x 144 entries x 36 positions: 0.24 -> 0.50 ms);
# * weight gradient as dot products of whole rows (tiles of 3 x 4 accumulators, samples in
#   cache-sized chunks): faster for at most 16 filters over rows of 256 or more (LeNet's
#   first layer: 0.35 -> 0.18 ms), slower on short rows (its second: 0.25 -> 0.37 ms).
FILTER_MIN_LENGTH = 64
DOT_MAX_FILTERS, DOT_MIN_LENGTH = 16, 256
DOT_CHUNK_ELEMENTS = 1 << 16  # windows of a chunk of samples: 256 KiB of float32


def _sizes(samples, out_channels, window, length):
    filters = length >= FILTER_MIN_LENGTH
    dots = out_channels <= DOT_MAX_FILTERS and length >= DOT_MIN_LENGTH
    chunk = max(1, DOT_CHUNK_ELEMENTS // (window * length)) if dots else 0
    return np.array([samples, out_channels, window, length, filters, chunk], dtype=np.int64)


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

