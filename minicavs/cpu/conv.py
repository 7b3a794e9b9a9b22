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

_SOURCE = r"""// minicavs native convolution (minicavs/cpu/conv.py)
#include <cstdint>
#include <cstring>

// The sizes of one convolution (1-D: height 1). ph, pw: the padding before each axis (the
// padding after only decides OH, OW).
struct Geometry {
  int64_t N, C, H, W, O, kh, kw, sh, sw, dh, dw, ph, pw, OH, OW, block;
};

static inline Geometry geometry(const int64_t *g) {
  return Geometry{g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7],
                  g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]};
}

// The output columns [lo, hi) whose input column ow*sw + c0 lies inside [0, W).
static inline void inside(int64_t c0, int64_t W, int64_t sw, int64_t OW, int64_t &lo,
                          int64_t &hi) {
  lo = c0 < 0 ? (-c0 + sw - 1) / sw : 0;
  hi = W - c0 > 0 ? (W - c0 + sw - 1) / sw : 0;
  if (lo > OW) lo = OW;
  if (hi > OW) hi = OW;
  if (hi < lo) hi = lo;
}

// One window offset (i, j) of one input plane: out[oh][ow] = plane[oh*sh - ph + i*dh]
// [ow*sw - pw + j*dw], zero outside.
template <typename T>
static inline void window_plane(const T *plane, const Geometry &g, int64_t i, int64_t j,
                                T *out) {
  const int64_t c0 = j * g.dw - g.pw;
  int64_t lo, hi;
  inside(c0, g.W, g.sw, g.OW, lo, hi);
  for (int64_t oh = 0; oh < g.OH; ++oh, out += g.OW) {
    const int64_t ih = oh * g.sh - g.ph + i * g.dh;
    if (ih < 0 || ih >= g.H) {
      for (int64_t ow = 0; ow < g.OW; ++ow) out[ow] = 0;
      continue;
    }
    const T *row = plane + ih * g.W + c0;
    for (int64_t ow = 0; ow < lo; ++ow) out[ow] = 0;
    if (g.sw == 1) {
      #pragma omp simd
      for (int64_t ow = lo; ow < hi; ++ow) out[ow] = row[ow];
    } else {
      for (int64_t ow = lo; ow < hi; ++ow) out[ow] = row[ow * g.sw];
    }
    for (int64_t ow = hi; ow < g.OW; ++ow) out[ow] = 0;
  }
}

// The adjoint: the window plane added back into the input plane.
template <typename T>
static inline void add_window_plane(const T *in, const Geometry &g, int64_t i, int64_t j,
                                    T *plane) {
  const int64_t c0 = j * g.dw - g.pw;
  int64_t lo, hi;
  inside(c0, g.W, g.sw, g.OW, lo, hi);
  for (int64_t oh = 0; oh < g.OH; ++oh, in += g.OW) {
    const int64_t ih = oh * g.sh - g.ph + i * g.dh;
    if (ih < 0 || ih >= g.H) continue;
    T *row = plane + ih * g.W + c0;
    if (g.sw == 1) {
      #pragma omp simd
      for (int64_t ow = lo; ow < hi; ++ow) row[ow] += in[ow];
    } else {
      for (int64_t ow = lo; ow < hi; ++ow) row[ow * g.sw] += in[ow];
    }
  }
}

// cols (C*kh*kw, nb*L) of samples x[0..nb): row (c, i, j), column n*L + output position.
template <typename T>
static void im2col(const T *x, int64_t nb, const Geometry &g, T *cols) {
  const int64_t L = g.OH * g.OW, HW = g.H * g.W, width = nb * L;
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        T *row = cols + ((c * g.kh + i) * g.kw + j) * width;
        for (int64_t n = 0; n < nb; ++n)
          window_plane(x + (n * g.C + c) * HW, g, i, j, row + n * L);
      }
}

// dx[0..nb) = col2im(cols), dx zeroed first.
template <typename T>
static void col2im(const T *cols, int64_t nb, const Geometry &g, T *dx) {
  const int64_t L = g.OH * g.OW, HW = g.H * g.W, width = nb * L;
  std::memset(dx, 0, sizeof(T) * nb * g.C * HW);
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const T *row = cols + ((c * g.kh + i) * g.kw + j) * width;
        for (int64_t n = 0; n < nb; ++n)
          add_window_plane(row + n * L, g, i, j, dx + (n * g.C + c) * HW);
      }
}

// CBLAS gemm, row-major (101); 111 no transpose, 112 transpose.
template <typename T, typename I>
using gemm_t = void (*)(int, int, int, I, I, I, T, const T *, I, const T *, I, T, T *, I);

// y (N, O, L) = W (O, CK) * cols + b, a block of samples at a time; scratch: cols
// (CK, block*L), then the block's (O, block*L) product unless block is 1.
template <typename T, typename I>
static void forward(void *function, const T *x, const T *w, const T *b, const int64_t *shape,
                    T *scratch, T *y) {
  const gemm_t<T, I> gemm = (gemm_t<T, I>)function;
  const Geometry g = geometry(shape);
  const int64_t L = g.OH * g.OW, CK = g.C * g.kh * g.kw;
  T *cols = scratch, *product = scratch + CK * g.block * L;
  for (int64_t n0 = 0; n0 < g.N; n0 += g.block) {
    const int64_t nb = n0 + g.block < g.N ? g.block : g.N - n0;
    im2col(x + n0 * g.C * g.H * g.W, nb, g, cols);
    T *out = nb == 1 ? y + n0 * g.O * L : product;  // one sample: straight into y
    gemm(101, 111, 111, (I)g.O, (I)(nb * L), (I)CK, (T)1, w, (I)CK, cols, (I)(nb * L), (T)0,
         out, (I)(nb * L));
    for (int64_t n = 0; n < nb; ++n)
      for (int64_t o = 0; o < g.O; ++o) {
        T *target = y + ((n0 + n) * g.O + o) * L;
        const T *source = out + o * nb * L + n * L;
        const T bias = b ? b[o] : (T)0;
        #pragma omp simd
        for (int64_t l = 0; l < L; ++l) target[l] = source[l] + bias;
      }
  }
}

// The gradient of y (N, O, L) for samples [n0, n0 + nb) as one (O, nb*L) matrix: g itself
// for one sample, else gathered into scratch.
template <typename T>
static const T *gradient_block(const T *dy, int64_t n0, int64_t nb, const Geometry &g,
                               T *scratch) {
  const int64_t L = g.OH * g.OW;
  if (nb == 1) return dy + n0 * g.O * L;
  for (int64_t n = 0; n < nb; ++n)
    for (int64_t o = 0; o < g.O; ++o)
      std::memcpy(scratch + o * nb * L + n * L, dy + ((n0 + n) * g.O + o) * L, sizeof(T) * L);
  return scratch;
}

// dW (O, CK) = sum over blocks of dY (O, nb*L) * cols^T.
template <typename T, typename I>
static void weight_grad(void *function, const T *x, const T *dy, const int64_t *shape,
                        T *scratch, T *dw) {
  const gemm_t<T, I> gemm = (gemm_t<T, I>)function;
  const Geometry g = geometry(shape);
  const int64_t L = g.OH * g.OW, CK = g.C * g.kh * g.kw;
  T *cols = scratch, *gathered = scratch + CK * g.block * L;
  for (int64_t n0 = 0; n0 < g.N; n0 += g.block) {
    const int64_t nb = n0 + g.block < g.N ? g.block : g.N - n0;
    im2col(x + n0 * g.C * g.H * g.W, nb, g, cols);
    const T *d = gradient_block(dy, n0, nb, g, gathered);
    gemm(101, 111, 112, (I)g.O, (I)CK, (I)(nb * L), (T)1, d, (I)(nb * L), cols, (I)(nb * L),
         n0 ? (T)1 : (T)0, dw, (I)CK);
  }
}

// dx (N, C, H, W) = col2im(W^T (CK, O) * dY), a block at a time.
template <typename T, typename I>
static void input_grad(void *function, const T *dy, const T *w, const int64_t *shape,
                       T *scratch, T *dx) {
  const gemm_t<T, I> gemm = (gemm_t<T, I>)function;
  const Geometry g = geometry(shape);
  const int64_t L = g.OH * g.OW, CK = g.C * g.kh * g.kw;
  T *cols = scratch, *gathered = scratch + CK * g.block * L;
  for (int64_t n0 = 0; n0 < g.N; n0 += g.block) {
    const int64_t nb = n0 + g.block < g.N ? g.block : g.N - n0;
    const T *d = gradient_block(dy, n0, nb, g, gathered);
    gemm(101, 112, 111, (I)CK, (I)(nb * L), (I)g.O, (T)1, w, (I)CK, d, (I)(nb * L), (T)0, cols,
         (I)(nb * L));
    col2im(cols, nb, g, dx + n0 * g.C * g.H * g.W);
  }
}

extern "C" {
#define CONV(suffix, T, I)                                                                     \
  void conv_forward_##suffix(void *f, const T *x, const T *w, const T *b, const int64_t *s,    \
                             T *scratch, T *y) { forward<T, I>(f, x, w, b, s, scratch, y); }   \
  void conv_weight_grad_##suffix(void *f, const T *x, const T *dy, const int64_t *s,           \
                                 T *scratch, T *dw) {                                          \
    weight_grad<T, I>(f, x, dy, s, scratch, dw); }                                             \
  void conv_input_grad_##suffix(void *f, const T *dy, const T *w, const int64_t *s,            \
                                T *scratch, T *dx) { input_grad<T, I>(f, dy, w, s, scratch, dx); }
CONV(f32_64, float, int64_t)
CONV(f64_64, double, int64_t)
CONV(f32_32, float, int)
CONV(f64_32, double, int)
}
"""

_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
# Elements of the im2col block (C·K × block·L) a call lays out at once, at most: the gemms
# grow with the block, the scratch leaves the caches. Measured on LeNet's layers: see
# docs/conv.md.
BLOCK_ELEMENTS = 1 << 20
_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _library():
    if build.unavailable() is not None:
        return None
    with _lock:
        lib, _ = build.build(_SOURCE, "conv", origin="minicavs/cpu/conv.py")
    return lib


def _entry(name, dtype, *arrays):
    """The C function for ``name`` and ``dtype`` with the gemm to pass it, or None."""
    suffix = _SUFFIX.get(dtype)
    if suffix is None or not all(isinstance(a, np.ndarray) and a.dtype == dtype
                                 for a in arrays):
        return None
    from . import blas

    address, interface = blas.gemm(dtype)
    if interface not in ("cblas64", "cblas32"):
        return None
    lib = _library()
    if lib is None:
        return None
    return getattr(lib, f"conv_{name}_{suffix}_{interface[-2:]}"), ctypes.c_void_p(address)


def _shape(samples, channels, size, out_channels, kernel, stride, dilation, padding, out):
    """The 16 sizes the C functions take (a 1-D convolution is a 2-D one of height 1), and
    the scratch they need."""
    pad = lambda k: (1,) * (2 - len(k)) + tuple(k)  # noqa: E731
    (H, W), (kh, kw), (sh, sw), (dh, dw), (OH, OW) = map(pad, (size, kernel, stride, dilation,
                                                               out))
    ph, pw = pad([before for before, _ in padding]) if len(padding) == 2 else (0, padding[0][0])
    window, length = channels * kh * kw, OH * OW
    block = max(1, min(samples, BLOCK_ELEMENTS // max(1, window * length)))
    scratch = window * block * length + (out_channels * block * length if block > 1 else 0)
    shape = np.array([samples, channels, H, W, out_channels, kh, kw, sh, sw, dh, dw, ph, pw,
                      OH, OW, block], dtype=np.int64)
    return shape, scratch


def _applies(kernel, *arrays):
    return len(kernel) in (1, 2) and all(a.flags.c_contiguous for a in arrays) \
        and all(a.size for a in arrays)


def conv(x, w, b, stride, dilation, padding, out):
    """``y`` (*lead, O, *out) of ``x`` (*lead, C, *size) and ``w`` (O, C, *kernel), plus
    ``b`` (O,) if given; or None (the composed form runs)."""
    kernel = w.shape[2:]
    arrays = (x, w) if b is None else (x, w, b)
    if not _applies(kernel, *arrays):
        return None
    entry = _entry("forward", x.dtype, *arrays)
    if entry is None:
        return None
    function, gemm = entry
    nd = len(kernel)
    lead = x.shape[:x.ndim - nd - 1]
    shape, scratch = _shape(math.prod(lead), w.shape[1], x.shape[x.ndim - nd:], w.shape[0],
                            kernel, stride, dilation, padding, out)
    y = np.empty(lead + (w.shape[0],) + tuple(out), dtype=x.dtype)
    scratch = np.empty(scratch, dtype=x.dtype)  # held here until the call returns
    function(gemm, _p(x), _p(w), None if b is None else _p(b), _p(shape), _p(scratch), _p(y))
    return y


def conv_weight_grad(x, g, kernel, stride, dilation, padding):
    """∂w (O, C, *kernel) of ``sum(conv(x, w) * g)``; or None (the composed form runs)."""
    if not _applies(kernel, x, g):
        return None
    entry = _entry("weight_grad", x.dtype, x, g)
    if entry is None:
        return None
    function, gemm = entry
    nd = len(kernel)
    lead, channels = x.shape[:x.ndim - nd - 1], x.shape[x.ndim - nd - 1]
    out_channels = g.shape[g.ndim - nd - 1]
    shape, scratch = _shape(math.prod(lead), channels, x.shape[x.ndim - nd:], out_channels,
                            kernel, stride, dilation, padding, g.shape[g.ndim - nd:])
    dw = np.empty((out_channels, channels) + tuple(kernel), dtype=x.dtype)
    scratch = np.empty(scratch, dtype=x.dtype)
    function(gemm, _p(x), _p(g), _p(shape), _p(scratch), _p(dw))
    return dw


def conv_input_grad(g, w, size, stride, dilation, padding):
    """∂x (*lead, C, *size) of ``sum(conv(x, w) * g)``; or None (the composed form runs)."""
    kernel = w.shape[2:]
    if not _applies(kernel, g, w):
        return None
    entry = _entry("input_grad", g.dtype, g, w)
    if entry is None:
        return None
    function, gemm = entry
    nd = len(kernel)
    lead = g.shape[:g.ndim - nd - 1]
    shape, scratch = _shape(math.prod(lead), w.shape[1], size, w.shape[0], kernel, stride,
                            dilation, padding, g.shape[g.ndim - nd:])
    dx = np.empty(lead + (w.shape[1],) + tuple(size), dtype=g.dtype)
    scratch = np.empty(scratch, dtype=g.dtype)
    function(gemm, _p(g), _p(w), _p(shape), _p(scratch), _p(dx))
    return dx


def _p(array):
    return ctypes.c_void_p(array.ctypes.data)
