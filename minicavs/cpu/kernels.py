"""Hand-written native kernels for eager work that dominates real models outside F.

Softmax cross-entropy over a vocabulary is a language model's hot loop: NumPy spends five
single-threaded passes over the logits (max, subtract, exp, sum, log) and a temporary as large
as them. Here each row is two passes — its maximum, then ``sum(exp(x - max))`` with libmvec's
vector ``exp`` — and rows are split between cores; the gradient is one more pass writing
``softmax * g`` (minus ``g`` at the label). The ops call these on NumPy arrays
(``ops/loss.py``) and keep their NumPy form for CuPy, for other dtypes, and where native code
is off (``build.unavailable()``).
"""

import ctypes
import functools
import threading

import numpy as np

from . import build

_SOURCE = r"""// minicavs native kernels (minicavs/cpu/kernels.py)
#include <cmath>
#include <cstdint>

template <typename T>
static inline T row_max(const T *x, int64_t n) {
  T m = x[0];
  for (int64_t j = 1; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

template <typename T>
static inline T row_sum_exp(const T *x, int64_t n, T m) {
  T s = 0;
  #pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += std::exp(x[j] - m);
  return s;
}

// loss[i] = log(sum_j exp(x[i, j])) - x[i, label[i]], stably.
template <typename T>
static void xent(const T *x, const int64_t *label, int64_t rows, int64_t cols, T *loss) {
  #pragma omp parallel for schedule(static) if (rows * cols >= (1 << 18))
  for (int64_t i = 0; i < rows; ++i) {
    const T *r = x + i * cols;
    const T m = row_max(r, cols);
    loss[i] = std::log(row_sum_exp(r, cols, m)) + m - r[label[i]];
  }
}

// out[i, j] = (softmax(x[i])[j] - (j == label[i])) * g[i]
template <typename T>
static void xent_grad(const T *x, const int64_t *label, const T *g, int64_t rows,
                      int64_t cols, T *out) {
  #pragma omp parallel for schedule(static) if (rows * cols >= (1 << 18))
  for (int64_t i = 0; i < rows; ++i) {
    const T *r = x + i * cols;
    T *o = out + i * cols;
    const T m = row_max(r, cols);
    const T scale = g[i] / row_sum_exp(r, cols, m);
    #pragma omp simd
    for (int64_t j = 0; j < cols; ++j) o[j] = std::exp(r[j] - m) * scale;
    o[label[i]] -= g[i];
  }
}

extern "C" {
void xent_f32(const float *x, const int64_t *l, int64_t r, int64_t c, float *o) { xent(x, l, r, c, o); }
void xent_f64(const double *x, const int64_t *l, int64_t r, int64_t c, double *o) { xent(x, l, r, c, o); }
void xent_grad_f32(const float *x, const int64_t *l, const float *g, int64_t r, int64_t c,
                   float *o) { xent_grad(x, l, g, r, c, o); }
void xent_grad_f64(const double *x, const int64_t *l, const double *g, int64_t r, int64_t c,
                   double *o) { xent_grad(x, l, g, r, c, o); }
}
"""

_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _library():
    if build.unavailable() is not None:
        return None
    with _lock:
        lib, _ = build.build(_SOURCE, "kernels", origin="minicavs/cpu/kernels.py")
    return lib


def _usable(*arrays):
    return all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays)


def softmax_cross_entropy(logits, labels):
    """Per-row losses as the op computes them, or None (the caller's NumPy form runs). The
    labels must already be checked to lie in range."""
    suffix = _SUFFIX.get(getattr(logits, "dtype", None))
    if suffix is None or logits.ndim == 0 or logits.size == 0 or not _usable(logits, labels) \
            or labels.dtype != np.int64:
        return None
    lib = _library()
    if lib is None:
        return None
    cols = logits.shape[-1]
    rows = logits.size // cols
    loss = np.empty(logits.shape[:-1], dtype=logits.dtype)
    getattr(lib, f"xent_{suffix}")(_p(logits), _p(labels), ctypes.c_int64(rows),
                                   ctypes.c_int64(cols), _p(loss))
    return loss


def softmax_cross_entropy_grad(logits, labels, g):
    """``(softmax(logits) - onehot(labels)) * g[..., None]``, or None (NumPy runs)."""
    suffix = _SUFFIX.get(getattr(logits, "dtype", None))
    if suffix is None or logits.ndim == 0 or logits.size == 0 or labels.dtype != np.int64 \
            or getattr(g, "dtype", None) != logits.dtype or g.shape != labels.shape \
            or not _usable(logits, labels, g):
        return None
    lib = _library()
    if lib is None:
        return None
    cols = logits.shape[-1]
    out = np.empty_like(logits)
    getattr(lib, f"xent_grad_{suffix}")(_p(logits), _p(labels), _p(g),
                                        ctypes.c_int64(logits.size // cols),
                                        ctypes.c_int64(cols), _p(out))
    return out


def _p(array):
    return ctypes.c_void_p(array.ctypes.data)
