"""The products of a convolution as native calls: ``conv_windows`` and its two gradients
(``ops/conv.py``), each one C call over the batch.

Per sample the windows ``unfold`` laid out are a (C·K, L) matrix, the output and its gradient
(O, L), the filters (O, C·K):

* forward: y = W · cols + b, written straight into (N, O, *out);
* input gradient: ∂cols = Wᵀ · g (``fold`` then makes ∂x);
* weight gradient: ∂W = Σ over samples of g · colsᵀ.

Each runs a loop of its own (filter rows, dot products; written per instruction set,
``cpu/isa.py``) or a gemm of NumPy's BLAS (its address from ``cpu/blas.py`` — no link step),
whichever is measured faster here for its sizes (below). A fused op that
took x itself, im2col inside per block of samples, was tried first and measured slower: the
backward lays the windows out again (2.1 against 1.5 ms of kernels on LeNet's two layers).

None is returned where this does not apply — another dtype, non-contiguous or empty arrays,
a BLAS without a CBLAS gemm, native code off — and the op's NumPy/CuPy form runs.
"""

import ctypes
import math

import numpy as np

from . import build, calibrate, isa
from .kernels import SUFFIX, pointer

_SOURCE = r"""// minicavs native convolution products (minicavs/cpu/conv.py)
#include <cstdint>
#include <cstring>
""" + isa.variants(r"""
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
  typedef T V __attribute__((vector_size(VB)));
  constexpr int64_t n = VB / sizeof(T);
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
  if (s[4]) {  // filter rows measured faster than the gemm here (conv.py)
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
  typedef T V __attribute__((vector_size(VB)));
  constexpr int64_t n = VB / sizeof(T);
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
// tiles of R x 4: R R*4 accumulators and R + 4 loads in the vector registers (3 of 32, 2 of 16).
constexpr int DOT_ROWS = REGS >= 32 ? 3 : 2;

template <typename T>
static void dots(const T *g, const T *cols, int64_t P, int64_t O, int64_t CK, int64_t L,
                 T *dw) {
  constexpr int R = DOT_ROWS;
  const int64_t sg = O * L, sc = CK * L;
  int64_t o = 0;
  for (; o + R <= O; o += R) {
    int64_t k = 0;
    for (; k + 4 <= CK; k += 4)
      dot_tile<T, R, 4>(g + o * L, sg, cols + k * L, sc, P, L, dw + o * CK + k, CK);
    for (; k < CK; ++k)
      dot_tile<T, R, 1>(g + o * L, sg, cols + k * L, sc, P, L, dw + o * CK + k, CK);
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
  if (s[5]) {  // dot products measured faster than the gemm here (conv.py)
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
  if (s[4]) {  // filter rows of W^T (row k of it is column k of W)
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
  void NAME_windows_forward_##suffix(void *f, const T *c, const T *w, const T *b,              \
                                     const int64_t *s, T *y) { forward<T, I>(f, c, w, b, s, y); } \
  void NAME_windows_weight_grad_##suffix(void *f, const T *c, const T *g, const int64_t *s,    \
                                         T *dw) { weight_grad<T, I>(f, c, g, s, dw); }         \
  void NAME_windows_input_grad_##suffix(void *f, const T *g, const T *w, const int64_t *s,     \
                                        T *dc) { input_grad<T, I>(f, g, w, s, dc); }
PRODUCTS(f32_64, float, int64_t)
PRODUCTS(f64_64, double, int64_t)
PRODUCTS(f32_32, float, int)
PRODUCTS(f64_32, double, int)
#undef PRODUCTS
}
""", build.UNIT)


def _library():
    return build.module_library(_SOURCE, "conv", "minicavs/cpu/conv.py")


def _entry(name, *arrays):
    """The C function for ``name`` and the arrays' dtype, with the gemm to pass it; None where
    it does not apply."""
    dtype = arrays[0].dtype
    suffix = SUFFIX.get(dtype)
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
    return (getattr(lib, f"{isa.target()}_windows_{name}_{suffix}_{interface[-2:]}"),
            ctypes.c_void_p(address))


# Each product has a loop of its own beside NumPy's gemm: forward and input gradient as filter
# rows (each vector of a window row loaded once and multiplied into up to eight accumulators),
# the weight gradient as dot products of whole rows (register tiles, samples in cache-sized
# chunks). Which is faster depends on the sizes and the machine (on one AVX-512 machine, one
# thread, batch 64: filter rows 1.7-2.4x faster than the gemm on LeNet's layers, 2x slower
# on rows of 36 positions; dot products faster for LeNet's first layer's gradient, slower for
# its second's): it is measured here, per bucket of sizes, on the first product of each
# (``cpu/calibrate.py``).
DOT_CHUNK_ELEMENTS = 1 << 16  # windows of a chunk of samples: 256 KiB of float32, in L2
_wins = {}  # (kind, dtype, sizes' buckets, target, forced) -> own loop faster


def _sizes(samples, out_channels, window, length, own):
    """The sizes the C functions take; ``own``: its own loop instead of the gemm."""
    chunk = max(1, DOT_CHUNK_ELEMENTS // (window * length)) if own else 0
    return np.array([samples, out_channels, window, length, int(own), chunk], dtype=np.int64)


def _run(kind, function, gemm, arrays, sizes):
    """``function`` on ``arrays`` (the last its output) with its own loop where that is
    measured faster for these sizes than the gemm."""
    samples, out_channels, window, length = sizes
    force = calibrate.forced()
    key = (kind, arrays[0].dtype.char, *((s - 1).bit_length() for s in sizes[1:]), isa.target(),
           force)
    own = _wins.get(key)
    pointers = [None if a is None else pointer(a) for a in arrays]
    if own is None:
        def call(own):
            shape = _sizes(samples, out_channels, window, length, own)
            return lambda: function(gemm, *pointers[:-1], pointer(shape), pointers[-1])
        name = (f"conv {kind} {arrays[0].dtype.name} O<={1 << key[2]} CK<={1 << key[3]} "
                f"L<={1 << key[4]} ({isa.target()})")
        own = _wins[key] = calibrate.own_is_faster(name, lambda: (call(True), call(False)),
                                                   source=_SOURCE)
    function(gemm, *pointers[:-1], pointer(_sizes(samples, out_channels, window, length, own)),
             pointers[-1])


def product(cols, w, b, nd):
    """``y`` (*lead, O, *out) from the windows ``cols`` (*lead, C, *kernel, *out), filters
    ``w`` (O, C, *kernel) and ``b`` (O,) or None; None where native code does not apply."""
    entry = _entry("forward", cols, w) if b is None else _entry("forward", cols, w, b)
    if entry is None:
        return None
    function, gemm = entry
    lead, out = cols.shape[:cols.ndim - 2 * nd - 1], cols.shape[cols.ndim - nd:]
    y = np.empty(lead + (w.shape[0],) + out, dtype=cols.dtype)
    _run("forward", function, gemm, (cols, w, b, y),
         (math.prod(lead), w.shape[0], w.size // w.shape[0], math.prod(out)))
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
    dw = np.empty((out_channels,) + window, dtype=cols.dtype)
    _run("weight_grad", function, gemm, (cols, g, dw),
         (math.prod(cols.shape[:rank]), out_channels, math.prod(window),
          math.prod(cols.shape[cols.ndim - nd:])))
    return dw


def input_grad(g, w, nd):
    """∂cols (*lead, C, *kernel, *out) of ``sum(product(cols, w) * g)``; None where native
    code does not apply."""
    entry = _entry("input_grad", g, w)
    if entry is None:
        return None
    function, gemm = entry
    lead, out = g.shape[:g.ndim - nd - 1], g.shape[g.ndim - nd:]
    dcols = np.empty(lead + w.shape[1:] + out, dtype=g.dtype)
    _run("input_grad", function, gemm, (g, w, dcols),
         (math.prod(lead), w.shape[0], w.size // w.shape[0], math.prod(out)))
    return dcols

