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
"""

import contextlib
import ctypes
import functools
import threading

import numpy as np

from . import build, calibrate, isa

_SOURCE = r"""// minicavs native kernels (minicavs/cpu/kernels.py)
#include <cmath>
#include <cstdint>
#include <omp.h>

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

// out[idx[i]] += values[i] for each i with idx[i] >= 0, in order of i (repeats add up, as
// np.add.at does): an embedding's gradient. One core: two rows may name one output row.
template <typename T>
static void scatter_add(T *out, const int64_t *idx, const T *values, int64_t rows,
                        int64_t cols, int64_t ldo, int64_t ldv) {  // (row strides)
  for (int64_t i = 0; i < rows; ++i) {
    if (idx[i] < 0) continue;
    T *__restrict__ o = out + idx[i] * ldo;
    const T *__restrict__ v = values + i * ldv;
    #pragma omp simd
    for (int64_t j = 0; j < cols; ++j) o[j] += v[j];
  }
}

// The window rows [lo, hi) that lie inside [0, n): position o*s - p + offset.
static inline void inside(int64_t offset, int64_t n, int64_t s, int64_t count, int64_t &lo,
                          int64_t &hi) {
  lo = offset < 0 ? (-offset + s - 1) / s : 0;
  hi = n - offset > 0 ? (n - offset + s - 1) / s : 0;
  if (lo > count) lo = count;
  if (hi > count) hi = count;
  if (hi < lo) hi = lo;
}

// im2col of planes (H, W) into (kh, kw, OH, OW) per plane: out[p][i][j][oh][ow] =
// x[p][oh*sh - ph + i*dh][ow*sw - pw + j*dw], or value outside the plane. One core, no
// OpenMP region: an outlined loop body measured 1.7x slower (its sizes read through a
// pointer). A window plane wholly inside the input, at stride 1 (a LeNet layer's every
// plane), is a plain row copy; its rows are short (8-24), where bounds per row cost more
// than the copy.
template <typename T>
static void unfold2d(const T *x, int64_t planes, int64_t H, int64_t W, int64_t kh, int64_t kw,
                     int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t ph, int64_t pw,
                     int64_t OH, int64_t OW, T value, T *out) {
  for (int64_t p = 0; p < planes; ++p) {
    const T *plane = x + p * H * W;
    T *o = out + p * kh * kw * OH * OW;
    for (int64_t i = 0; i < kh; ++i) {
      int64_t top, bottom;  // the output rows whose input row lies inside the plane
      inside(i * dh - ph, H, sh, OH, top, bottom);
      for (int64_t j = 0; j < kw; ++j, o += OH * OW) {
        const int64_t c0 = j * dw - pw;
        int64_t lo, hi;  // the output columns whose input column lies inside the plane
        inside(c0, W, sw, OW, lo, hi);
        const T *first = plane + (top * sh - ph + i * dh) * W + c0;
        if (sw == 1 && lo == 0 && hi == OW && top == 0 && bottom == OH) {
          for (int64_t oh = 0; oh < OH; ++oh)
            for (int64_t ow = 0; ow < OW; ++ow) o[oh * OW + ow] = first[oh * sh * W + ow];
          continue;
        }
        for (int64_t k = 0; k < top * OW; ++k) o[k] = value;
        for (int64_t k = bottom * OW; k < OH * OW; ++k) o[k] = value;
        for (int64_t oh = top; oh < bottom; ++oh) {
          T *r = o + oh * OW;
          const T *row = first + (oh - top) * sh * W;
          for (int64_t ow = 0; ow < lo; ++ow) r[ow] = value;
          for (int64_t ow = lo; ow < hi; ++ow) r[ow] = row[ow * sw];
          for (int64_t ow = hi; ow < OW; ++ow) r[ow] = value;
        }
      }
    }
  }
}

// col2im, the adjoint: out[p] (H, W), zeroed here, gets every window entry added back.
template <typename T>
static void fold2d(const T *cols, int64_t planes, int64_t H, int64_t W, int64_t kh, int64_t kw,
                   int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t ph, int64_t pw,
                   int64_t OH, int64_t OW, T *out) {
  for (int64_t p = 0; p < planes; ++p) {
    T *plane = out + p * H * W;
    const T *c = cols + p * kh * kw * OH * OW;
    for (int64_t k = 0; k < H * W; ++k) plane[k] = 0;
    for (int64_t i = 0; i < kh; ++i) {
      int64_t top, bottom;
      inside(i * dh - ph, H, sh, OH, top, bottom);
      for (int64_t j = 0; j < kw; ++j, c += OH * OW) {
        const int64_t c0 = j * dw - pw;
        int64_t lo, hi;
        inside(c0, W, sw, OW, lo, hi);
        T *first = plane + (top * sh - ph + i * dh) * W + c0;
        if (sw == 1 && lo == 0 && hi == OW && top == 0 && bottom == OH) {
          for (int64_t oh = 0; oh < OH; ++oh)
            for (int64_t ow = 0; ow < OW; ++ow) first[oh * sh * W + ow] += c[oh * OW + ow];
          continue;
        }
        for (int64_t oh = top; oh < bottom; ++oh) {
          const T *r = c + oh * OW;
          T *row = first + (oh - top) * sh * W;
          for (int64_t ow = lo; ow < hi; ++ow) row[ow * sw] += r[ow];
        }
      }
    }
  }
}

// Adam (decay: AdamW's p *= 1 - lr * wd first; 1 when none) over several parameters in one
// pass each: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= step * m / (sqrt(v / bc2) + eps), step = lr / bc1. Each parameter's elements are split
// between the cores when there are enough of them in all.
template <typename T>
static void adam(int64_t count, T *const *p, const T *const *g, T *const *m, T *const *v,
                 const int64_t *size, const double *hyper) {
  const T b1 = hyper[0], b2 = hyper[1], eps = hyper[2], bc2 = hyper[3], step = hyper[4],
          decay = hyper[5];
  int64_t total = 0;
  for (int64_t k = 0; k < count; ++k) total += size[k];
  #pragma omp parallel if (total >= (1 << 18))
  {
    for (int64_t k = 0; k < count; ++k) {
      T *__restrict__ pk = p[k];
      T *__restrict__ mk = m[k];
      T *__restrict__ vk = v[k];
      const T *__restrict__ gk = g[k];
      #pragma omp for simd schedule(static) nowait
      for (int64_t i = 0; i < size[k]; ++i) {
        const T gi = gk[i];
        const T mi = b1 * mk[i] + (1 - b1) * gi;
        const T vi = b2 * vk[i] + (1 - b2) * (gi * gi);
        mk[i] = mi;
        vk[i] = vi;
        pk[i] = pk[i] * decay - step * (mi / (std::sqrt(vi / bc2) + eps));
      }
    }
  }
}

// C = op(A) op(B) (row-major; op: transposed or not), on a team of threads each running a
// one-thread gemm on its block: C's columns split, or its rows when it has few columns. The
// BLAS is set to one thread for the call (process-wide in a pthreads OpenBLAS), then restored.
template <typename T, typename I>
static void team_gemm(void *function, void *set_threads, int ta, int tb, I M, I N, I K,
                      const T *A, I lda, const T *B, I ldb, T *C, I ldc, int threads) {
  typedef void (*gemm_t)(int, int, int, I, I, I, T, const T *, I, const T *, I, T, T *, I);
  typedef int (*set_t)(int);
  const gemm_t gemm = (gemm_t)function;
  const set_t set = (set_t)set_threads;
  const int before = set(1);
  const bool by_columns = N > M && N >= 32 * threads;  // split the longer side: each thread packs all of the other operand
  #pragma omp parallel num_threads(threads)
  {
    const I team = omp_get_num_threads(), tid = omp_get_thread_num();
    const I size = by_columns ? N : M;
    const I block = by_columns ? ((size + team - 1) / team + 15) / 16 * 16
                               : (size + team - 1) / team;
    const I a0 = tid * block, a1 = a0 + block < size ? a0 + block : size;
    if (a1 > a0) {
      if (by_columns)
        gemm(101, ta ? 112 : 111, tb ? 112 : 111, M, a1 - a0, K, (T)1, A, lda,
             B + (tb ? a0 * ldb : a0), ldb, (T)0, C + a0, ldc);
      else
        gemm(101, ta ? 112 : 111, tb ? 112 : 111, a1 - a0, N, K, (T)1,
             A + (ta ? a0 : a0 * lda), lda, B, ldb, (T)0, C + a0 * ldc, ldc);
    }
  }
  set(before);
}

// DyNet's agenda over a recorded graph (autobatch/schedule.py has the same loop in NumPy and
// the meaning of every array): repeatedly emit every ready node of the signature with the
// lowest average depth (the first such signature on a tie), then release its consumers.
// Writes the nodes in batch order to order[n] and each batch's end to ends; returns the
// number of batches, or -1 if nodes remain that never become ready (a cycle).
static int64_t agenda(int64_t n, int64_t num_sigs, const int64_t *sig, int64_t *waiting,
                      const int64_t *consumer_ptr, const int64_t *consumers,
                      const int64_t *per_sig, const int64_t *position, const int64_t *sig_start,
                      const double *average_depth, char *ready, int64_t *ready_count,
                      double *priority, int64_t *order, int64_t *ends) {
  const double none = HUGE_VAL;
  for (int64_t s = 0; s < num_sigs; ++s)
    priority[s] = ready_count[s] > 0 ? average_depth[s] : none;
  int64_t done = 0, batches = 0;
  while (done < n) {
    int64_t s = 0;
    for (int64_t k = 1; k < num_sigs; ++k)
      if (priority[k] < priority[s]) s = k;
    if (priority[s] == none) return -1;
    const int64_t first = done;
    for (int64_t p = sig_start[s]; p < sig_start[s + 1]; ++p)
      if (ready[p]) { ready[p] = 0; order[done++] = per_sig[p]; }
    ready_count[s] = 0;
    priority[s] = none;
    ends[batches++] = done;
    for (int64_t i = first; i < done; ++i) {
      const int64_t v = order[i];
      for (int64_t e = consumer_ptr[v]; e < consumer_ptr[v + 1]; ++e) {
        const int64_t c = consumers[e];
        if (--waiting[c] == 0) {
          ready[position[c]] = 1;
          ++ready_count[sig[c]];
          priority[sig[c]] = average_depth[sig[c]];
        }
      }
    }
  }
  return batches;
}

// The LSTM cell (ops/cells.py) on rows of gate pre-activations [i, f_1..f_K, o, u] (each H):
// c = s(i) t(u) + sum_j s(f_j) c_j, h = s(o) t(c), written as [h, c]; one pass, no temporaries.
// K (0, 1, 2) is a template argument so the loop over a row has no branch. The previous
// cells may be strided rows (ldc: the c half of [h, c] states). One core: a row of a
// recurrent step is short and a step has few rows.
template <typename T>
static inline T sigm(T x) { return T(1) / (T(1) + std::exp(-x)); }

template <typename T, int K>
static void lstm_cell(const T *pre, const T *c0, const T *c1, int64_t ldc, int64_t rows,
                      int64_t H, T *out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T *p = pre + r * (3 + K) * H;
    const T *a = K > 0 ? c0 + r * ldc : nullptr, *b = K > 1 ? c1 + r * ldc : nullptr;
    T *h = out + r * 2 * H, *c = h + H;
    #pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      T cell = sigm(p[j]) * std::tanh(p[(2 + K) * H + j]);
      if (K > 0) cell += sigm(p[H + j]) * a[j];
      if (K > 1) cell += sigm(p[2 * H + j]) * b[j];
      c[j] = cell;
      h[j] = sigm(p[(1 + K) * H + j]) * std::tanh(cell);
    }
  }
}

// Its gradient, [d_pre (3+K)H, d_c_1..d_c_K] per row, from the output [h, c] and its
// cotangent g = [g_h, g_c].
template <typename T, int K>
static void lstm_cell_grad(const T *pre, const T *c0, const T *c1, int64_t ldc, const T *out,
                           const T *g, int64_t rows, int64_t H, T *grads) {
  for (int64_t r = 0; r < rows; ++r) {
    const T *p = pre + r * (3 + K) * H, *o = out + r * 2 * H, *gr = g + r * 2 * H;
    const T *a = K > 0 ? c0 + r * ldc : nullptr, *b = K > 1 ? c1 + r * ldc : nullptr;
    T *d = grads + r * (3 + 2 * K) * H;
    #pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      const T i = sigm(p[j]), og = sigm(p[(1 + K) * H + j]), u = std::tanh(p[(2 + K) * H + j]);
      const T tc = std::tanh(o[H + j]), gh = gr[j];
      const T dc = gr[H + j] + gh * og * (T(1) - tc * tc);
      d[j] = dc * u * i * (T(1) - i);
      if (K > 0) {
        const T f = sigm(p[H + j]);
        d[H + j] = dc * a[j] * f * (T(1) - f);
        d[(3 + K) * H + j] = dc * f;
      }
      if (K > 1) {
        const T f = sigm(p[2 * H + j]);
        d[2 * H + j] = dc * b[j] * f * (T(1) - f);
        d[(4 + K) * H + j] = dc * f;
      }
      d[(1 + K) * H + j] = gh * tc * og * (T(1) - og);
      d[(2 + K) * H + j] = dc * i * (T(1) - u * u);
    }
  }
}

template <typename T>
static void lstm_cell_k(const T *pre, const T *c0, const T *c1, int64_t ldc, int64_t k,
                        int64_t rows, int64_t H, T *out) {
  if (k == 0) lstm_cell<T, 0>(pre, c0, c1, ldc, rows, H, out);
  else if (k == 1) lstm_cell<T, 1>(pre, c0, c1, ldc, rows, H, out);
  else lstm_cell<T, 2>(pre, c0, c1, ldc, rows, H, out);
}

template <typename T>
static void lstm_cell_grad_k(const T *pre, const T *c0, const T *c1, int64_t ldc,
                             const T *out, const T *g, int64_t k, int64_t rows, int64_t H,
                             T *grads) {
  if (k == 0) lstm_cell_grad<T, 0>(pre, c0, c1, ldc, out, g, rows, H, grads);
  else if (k == 1) lstm_cell_grad<T, 1>(pre, c0, c1, ldc, out, g, rows, H, grads);
  else lstm_cell_grad<T, 2>(pre, c0, c1, ldc, out, g, rows, H, grads);
}

extern "C" {
int64_t agenda_schedule(int64_t n, int64_t num_sigs, const int64_t *sig, int64_t *waiting,
                        const int64_t *consumer_ptr, const int64_t *consumers,
                        const int64_t *per_sig, const int64_t *position,
                        const int64_t *sig_start, const double *average_depth, char *ready,
                        int64_t *ready_count, double *priority, int64_t *order, int64_t *ends) {
  return agenda(n, num_sigs, sig, waiting, consumer_ptr, consumers, per_sig, position,
                sig_start, average_depth, ready, ready_count, priority, order, ends);
}
#define TEAM_GEMM(name, T, I)                                                                  \
  void name(void *f, void *s, int ta, int tb, I M, I N, I K, const T *A, I lda, const T *B,   \
            I ldb, T *C, I ldc, int threads) {                                                \
    team_gemm<T, I>(f, s, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, threads);                  \
  }
TEAM_GEMM(team_gemm_f32_64, float, int64_t)
TEAM_GEMM(team_gemm_f64_64, double, int64_t)
TEAM_GEMM(team_gemm_f32_32, float, int)
TEAM_GEMM(team_gemm_f64_32, double, int)
void scatter_add_f32(float *o, const int64_t *i, const float *v, int64_t r, int64_t c,
                     int64_t lo, int64_t lv) { scatter_add(o, i, v, r, c, lo, lv); }
void scatter_add_f64(double *o, const int64_t *i, const double *v, int64_t r, int64_t c,
                     int64_t lo, int64_t lv) { scatter_add(o, i, v, r, c, lo, lv); }
void adam_f32(int64_t n, float *const *p, const float *const *g, float *const *m,
              float *const *v, const int64_t *s, const double *h) { adam(n, p, g, m, v, s, h); }
void adam_f64(int64_t n, double *const *p, const double *const *g, double *const *m,
              double *const *v, const int64_t *s, const double *h) { adam(n, p, g, m, v, s, h); }
void unfold2d_f32(const float *x, const int64_t *g, double v, float *o) {
  unfold2d(x, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12],
           (float)v, o); }
void unfold2d_f64(const double *x, const int64_t *g, double v, double *o) {
  unfold2d(x, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12],
           v, o); }
void fold2d_f32(const float *c, const int64_t *g, float *o) {
  fold2d(c, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], o); }
void fold2d_f64(const double *c, const int64_t *g, double *o) {
  fold2d(c, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], o); }
void xent_f32(const float *x, const int64_t *l, int64_t r, int64_t c, float *o) { xent(x, l, r, c, o); }
void xent_f64(const double *x, const int64_t *l, int64_t r, int64_t c, double *o) { xent(x, l, r, c, o); }
void xent_grad_f32(const float *x, const int64_t *l, const float *g, int64_t r, int64_t c,
                   float *o) { xent_grad(x, l, g, r, c, o); }
void xent_grad_f64(const double *x, const int64_t *l, const double *g, int64_t r, int64_t c,
                   double *o) { xent_grad(x, l, g, r, c, o); }
void lstm_cell_f32(const float *p, const float *a, const float *b, int64_t ldc, int64_t k,
                   int64_t r, int64_t h, float *o) { lstm_cell_k(p, a, b, ldc, k, r, h, o); }
void lstm_cell_f64(const double *p, const double *a, const double *b, int64_t ldc, int64_t k,
                   int64_t r, int64_t h, double *o) { lstm_cell_k(p, a, b, ldc, k, r, h, o); }
void lstm_cell_grad_f32(const float *p, const float *a, const float *b, int64_t ldc,
                        const float *o, const float *g, int64_t k, int64_t r, int64_t h,
                        float *d) { lstm_cell_grad_k(p, a, b, ldc, o, g, k, r, h, d); }
void lstm_cell_grad_f64(const double *p, const double *a, const double *b, int64_t ldc,
                        const double *o, const double *g, int64_t k, int64_t r, int64_t h,
                        double *d) { lstm_cell_grad_k(p, a, b, ldc, o, g, k, r, h, d); }
}
""" + isa.variants(r"""// A product with few rows, X (M x K) times a matrix B (K x N) that stays the same over many
// products (a recurrent weight, one product per time step): B is copied once into panels of
// NR columns, P[p][k][0:NR] = B[k, p NR : p NR + NR] (zero past N), and each product streams
// its panels from cache (OpenBLAS packs B again at every call, which for a few rows costs
// more than the arithmetic). A thread takes whole panels; within one, a register block of MR
// rows by NV vectors of VB bytes runs down K: MR x NV accumulators, NV loads of B and one
// broadcast of A, sized by cpu/isa.py to the target's registers (BLIS's micro-kernels).
template <typename T> struct Vec {
  typedef T type __attribute__((vector_size(VB), aligned(sizeof(T))));  // (unaligned loads)
};

template <typename T>
constexpr int64_t panel_width() { return NV * VB / sizeof(T); }

template <typename T>
static void pack_panels(const T *B, int64_t ldb, int tb, int64_t K, int64_t N, T *P,
                        int threads) {
  constexpr int64_t NR = panel_width<T>();
  const int64_t panels = (N + NR - 1) / NR;
  #pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t n0 = p * NR, width = N - n0 < NR ? N - n0 : NR;
    for (int64_t k = 0; k < K; ++k) {
      T *row = P + (p * K + k) * NR;
      if (tb)  // B stored transposed: B[k, n] = src[n ldb + k]
        for (int64_t j = 0; j < width; ++j) row[j] = B[(n0 + j) * ldb + k];
      else
        for (int64_t j = 0; j < width; ++j) row[j] = B[k * ldb + n0 + j];
      for (int64_t j = width; j < NR; ++j) row[j] = 0;
    }
  }
}

template <typename T, int R>
static inline __attribute__((always_inline)) void panel_block(
    const T *A, int64_t lda, const T *panel, int64_t K, T *C, int64_t ldc, int64_t width) {
  typedef typename Vec<T>::type V;
  constexpr int L = VB / sizeof(T), NR = NV * L;
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int64_t k = 0; k < K; ++k) {
    V b[NV];
    for (int v = 0; v < NV; ++v) b[v] = *(const V *)(panel + k * NR + v * L);
    for (int r = 0; r < R; ++r) {
      const T a = A[r * lda + k];
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
  for (int r = 0; r < R; ++r) {
    if (width == NR) {
      for (int v = 0; v < NV; ++v) *(V *)(C + r * ldc + v * L) = acc[r][v];
    } else {  // the last panel: only its columns inside C
      T row[NR];
      for (int v = 0; v < NV; ++v) *(V *)(row + v * L) = acc[r][v];
      for (int64_t j = 0; j < width; ++j) C[r * ldc + j] = row[j];
    }
  }
}

template <typename T, int R>
static void rows_tail(const T *a, int64_t lda, const T *panel, int64_t K, T *c, int64_t ldc,
                      int64_t width, int64_t rows) {  // the last rows, a block of their height
  if constexpr (R > 0) {
    if (rows == R) panel_block<T, R>(a, lda, panel, K, c, ldc, width);
    else rows_tail<T, R - 1>(a, lda, panel, K, c, ldc, width, rows);
  }
}

template <typename T>
static void packed_gemm(const T *A, int64_t lda, const T *P, int64_t M, int64_t N, int64_t K,
                        T *C, int64_t ldc, int threads) {
  constexpr int64_t NR = panel_width<T>();
  const int64_t panels = (N + NR - 1) / NR;
  #pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t p = 0; p < panels; ++p) {
    const T *panel = P + p * K * NR;
    const int64_t n0 = p * NR, width = N - n0 < NR ? N - n0 : NR;
    int64_t m = 0;
    for (; m + MR <= M; m += MR)
      panel_block<T, MR>(A + m * lda, lda, panel, K, C + m * ldc + n0, ldc, width);
    rows_tail<T, MR - 1>(A + m * lda, lda, panel, K, C + m * ldc + n0, ldc, width, M - m);
  }
}

extern "C" {
int64_t NAME_panel_width_f32() { return panel_width<float>(); }
int64_t NAME_panel_width_f64() { return panel_width<double>(); }
void NAME_pack_panels_f32(const float *b, int64_t ldb, int tb, int64_t k, int64_t n, float *p,
                          int t) { pack_panels(b, ldb, tb, k, n, p, t); }
void NAME_pack_panels_f64(const double *b, int64_t ldb, int tb, int64_t k, int64_t n,
                          double *p, int t) { pack_panels(b, ldb, tb, k, n, p, t); }
void NAME_packed_gemm_f32(const float *a, int64_t lda, const float *p, int64_t m, int64_t n,
                          int64_t k, float *c, int64_t ldc, int t) {
  packed_gemm(a, lda, p, m, n, k, c, ldc, t); }
void NAME_packed_gemm_f64(const double *a, int64_t lda, const double *p, int64_t m, int64_t n,
                          int64_t k, double *c, int64_t ldc, int t) {
  packed_gemm(a, lda, p, m, n, k, c, ldc, t); }
}
""")

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
    "xent": (_P, _P, _I, _I, _P),
    "xent_grad": (_P, _P, _P, _I, _I, _P),
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
    xent(data_address(logits), data_address(labels), rows, cols, data_address(loss))
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
              cols, data_address(out))
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


_team = threading.local()


def in_team_products():
    """Whether this thread is inside :func:`team_products` (a call of native loops)."""
    return getattr(_team, "on", False)


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
    threads = _set_blas_threads(1) if on and not before[0] else None
    try:
        yield
    finally:
        _team.on, _team.threads = before
        if threads is not None:
            _set_blas_threads(threads)


def _set_blas_threads(count):
    """Set the BLAS's threads (process-wide in NumPy's OpenBLAS); the previous count, or None
    where the BLAS has no such call."""
    from . import blas

    address = blas.threads_local()
    if address is None:
        return None
    return _SET_THREADS(address)(count)


_SET_THREADS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)


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


def team_size():
    """Threads of a native team, chosen here and never by the user (the level loops' teams in
    ``runtime/native.py`` too): the cores this process may use (``OMP_NUM_THREADS`` caps it,
    as it caps OpenBLAS); 1 where the BLAS cannot be set to one thread per call (two pools of
    threads would contend), and 1 in a child forked after OpenMP started (its parent's pool
    threads are gone: a team there would wait for them forever; ``build.forked_child``).
    Inside :func:`team_products`, only the cores no other work ran on when the block began
    (``calibrate.free_cores``): a team waits at every barrier for a member that another
    process holds off its core."""
    threads = getattr(_team, "threads", None)
    if threads:
        return threads
    from . import blas

    if build.forked_child() or blas.threads_local() is None:
        return 1
    return _cores()


@functools.lru_cache(maxsize=None)
def _cores():
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    cap = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return max(1, min(cores, int(cap))) if cap.isdigit() and int(cap) > 0 else cores


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
                                   _p(hyper))
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

