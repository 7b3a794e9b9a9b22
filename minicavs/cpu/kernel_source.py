"""The C++ of the native kernels (``cpu/kernels.py`` and ``cpu/products.py`` call them): a module of its own, below
both the kernels and ``cpu/calibrate.py``, whose measurements are keyed on it so that a new
kernel measures again."""

from . import build, isa

SOURCE = r"""// minicavs native kernels (minicavs/cpu/kernels.py)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <omp.h>
// minicavs: a unit of its own

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
static void xent(const T *x, const int64_t *label, int64_t rows, int64_t cols, T *loss,
                 int threads) {
  #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t i = 0; i < rows; ++i) {
    const T *r = x + i * cols;
    const T m = row_max(r, cols);
    loss[i] = std::log(row_sum_exp(r, cols, m)) + m - r[label[i]];
  }
}

// out[i, j] = (softmax(x[i])[j] - (j == label[i])) * g[i]
template <typename T>
static void xent_grad(const T *x, const int64_t *label, const T *g, int64_t rows,
                      int64_t cols, T *out, int threads) {
  #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
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
// np.add.at does): an embedding's gradient. Threads take columns, not rows (two rows may name
// one output row): each element's adds in the order of i, as on one core, so the sums are the
// same bits on any team.
template <typename T>
static void scatter_add(T *out, const int64_t *idx, const T *values, int64_t rows,
                        int64_t cols, int64_t ldo, int64_t ldv, int threads) {  // (row strides)
  #pragma omp parallel num_threads(threads) if (threads > 1)
  {
    constexpr int64_t LINE = 64 / sizeof(T);  // (a cache line of columns: none shared)
    const int64_t team = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t lines = (cols + LINE - 1) / LINE;
    const int64_t lo = std::min(cols, lines * tid / team * LINE),
                  hi = std::min(cols, lines * (tid + 1) / team * LINE);
    for (int64_t i = 0; i < rows && lo < hi; ++i) {
      if (idx[i] < 0) continue;
      T *__restrict__ o = out + idx[i] * ldo;
      const T *__restrict__ v = values + i * ldv;
      #pragma omp simd
      for (int64_t j = lo; j < hi; ++j) o[j] += v[j];
    }
  }
}

// out[i] = x[idx[i]] (rows of cols elements), a zero row where idx[i] is -1: an embedding's
// lookup, in one pass (NumPy's masked form took 3-4 passes). Returns -1, or the first i whose
// idx[i] lies outside -1..num_rows-1 (then nothing is written).
template <typename T>
static int64_t take_rows(const T *x, int64_t num_rows, int64_t ldx, const int64_t *idx,
                         int64_t n, int64_t cols, T *out, int threads) {
  for (int64_t i = 0; i < n; ++i)
    if (idx[i] < -1 || idx[i] >= num_rows) return i;
  #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] < 0)
      std::memset(out + i * cols, 0, cols * sizeof(T));
    else
      std::memcpy(out + i * cols, x + idx[i] * ldx, cols * sizeof(T));
  }
  return -1;
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
// between the team's threads (one where there are too few in all: cpu/calibrate.py).
template <typename T>
static void adam(int64_t count, T *const *p, const T *const *g, T *const *m, T *const *v,
                 const int64_t *size, const double *hyper, int threads) {
  // (v / bc2 as v times its inverse: a division fewer an element, 13 % of the step's time
  // on 0.9 M float32 parameters, Zen 4; within an ulp of the optimiser's NumPy form)
  const T b1 = hyper[0], b2 = hyper[1], eps = hyper[2], inverse_bc2 = 1 / hyper[3],
          step = hyper[4], decay = hyper[5];
  #pragma omp parallel num_threads(threads) if (threads > 1)
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
        pk[i] = pk[i] * decay - step * (mi / (std::sqrt(vi * inverse_bc2) + eps));
      }
    }
  }
}

extern "C" {
void scatter_add_f32(float *o, const int64_t *i, const float *v, int64_t r, int64_t c,
                     int64_t lo, int64_t lv, int t) { scatter_add(o, i, v, r, c, lo, lv, t); }
void scatter_add_f64(double *o, const int64_t *i, const double *v, int64_t r, int64_t c,
                     int64_t lo, int64_t lv, int t) { scatter_add(o, i, v, r, c, lo, lv, t); }
int64_t take_rows_f32(const float *x, int64_t r, int64_t l, const int64_t *i, int64_t n,
                      int64_t c, float *o, int t) { return take_rows(x, r, l, i, n, c, o, t); }
int64_t take_rows_f64(const double *x, int64_t r, int64_t l, const int64_t *i, int64_t n,
                      int64_t c, double *o, int t) { return take_rows(x, r, l, i, n, c, o, t); }
void adam_f32(int64_t n, float *const *p, const float *const *g, float *const *m,
              float *const *v, const int64_t *s, const double *h, int t) { adam(n, p, g, m, v, s, h, t); }
void adam_f64(int64_t n, double *const *p, const double *const *g, double *const *m,
              double *const *v, const int64_t *s, const double *h, int t) { adam(n, p, g, m, v, s, h, t); }
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
void xent_f32(const float *x, const int64_t *l, int64_t r, int64_t c, float *o, int t) {
  xent(x, l, r, c, o, t); }
void xent_f64(const double *x, const int64_t *l, int64_t r, int64_t c, double *o, int t) {
  xent(x, l, r, c, o, t); }
void xent_grad_f32(const float *x, const int64_t *l, const float *g, int64_t r, int64_t c,
                   float *o, int t) { xent_grad(x, l, g, r, c, o, t); }
void xent_grad_f64(const double *x, const int64_t *l, const double *g, int64_t r, int64_t c,
                   double *o, int t) { xent_grad(x, l, g, r, c, o, t); }
}

// minicavs: a unit of its own

// C = op(A) op(B) (row-major; op: transposed or not), on a team of threads each running a
// one-thread gemm on its block: C's columns split, or its rows when it has few columns — or,
// given ``partial`` ((threads - 1) x M x N scratch), the inner dimension K split, each thread's
// sum of products into C or its partial, then the partials added into C by rows (a parameter's
// gradient Xᵀ·G over thousands of rows: each thread reads half of X and G, not all of one).
// The BLAS is set to one thread for the call (process-wide in a pthreads OpenBLAS), then
// restored.
template <typename T, typename I>
static void team_gemm(void *function, void *set_threads, int ta, int tb, I M, I N, I K,
                      const T *A, I lda, const T *B, I ldb, T *C, I ldc, int threads,
                      T *partial) {
  typedef void (*gemm_t)(int, int, int, I, I, I, T, const T *, I, const T *, I, T, T *, I);
  typedef int (*set_t)(int);
  const gemm_t gemm = (gemm_t)function;
  const set_t set = (set_t)set_threads;
  const int before = set(1);
  if (partial != nullptr) {
    #pragma omp parallel num_threads(threads)
    {
      const I team = omp_get_num_threads(), tid = omp_get_thread_num();
      const I block = (K + team - 1) / team;
      const I k0 = tid * block < K ? tid * block : K, k1 = k0 + block < K ? k0 + block : K;
      T *out = tid == 0 ? C : partial + (size_t)(tid - 1) * M * N;
      const I ldo = tid == 0 ? ldc : N;
      if (k1 > k0)
        gemm(101, ta ? 112 : 111, tb ? 112 : 111, M, N, k1 - k0, (T)1,
             A + (ta ? (size_t)k0 * lda : k0), lda, B + (tb ? k0 : (size_t)k0 * ldb), ldb,
             (T)0, out, ldo);
      else
        for (I i = 0; i < M; ++i) std::fill(out + (size_t)i * ldo, out + (size_t)i * ldo + N, (T)0);
      #pragma omp barrier
      const I rows = (M + team - 1) / team, r0 = tid * rows < M ? tid * rows : M,
              r1 = r0 + rows < M ? r0 + rows : M;
      for (I t = 1; t < team; ++t)
        for (I i = r0; i < r1; ++i) {
          T *__restrict__ c = C + (size_t)i * ldc;
          const T *__restrict__ p = partial + (size_t)(t - 1) * M * N + (size_t)i * N;
          #pragma omp simd
          for (I j = 0; j < N; ++j) c[j] += p[j];
        }
    }
    set(before);
    return;
  }
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

// The batches' nodes each where its first reader is (autobatch/schedule.in_reader_order, whose
// NumPy form is the reference): from the last batch back, a batch's nodes in the order of their
// first reader's place, so later batches read their operand rows as one run. order[n]: the
// nodes in batch order, reordered in place; ends: each batch's end; src -> dst: the edges;
// work: 4n + 1 int64.
static void reader_order(int64_t n, int64_t num_batches, int64_t *order, const int64_t *ends,
                         int64_t num_edges, const int64_t *src, const int64_t *dst,
                         int64_t *work) {
  int64_t *batch_of = work, *first_batch = work + n, *reader = work + 2 * n, *at = work + 3 * n;
  for (int64_t b = 0, i = 0; b < num_batches; ++b)
    for (; i < ends[b]; ++i) batch_of[order[i]] = b;
  for (int64_t v = 0; v < n; ++v) { first_batch[v] = num_batches; reader[v] = n; at[v] = n; }
  at[n] = n;
  for (int64_t e = 0; e < num_edges; ++e)
    first_batch[src[e]] = std::min(first_batch[src[e]], batch_of[dst[e]]);
  for (int64_t e = 0; e < num_edges; ++e)  // (the last such edge, as NumPy's assignment)
    if (batch_of[dst[e]] == first_batch[src[e]]) reader[src[e]] = dst[e];
  for (int64_t b = num_batches - 1; b >= 0; --b) {
    const int64_t lo = b ? ends[b - 1] : 0, hi = ends[b];
    if (hi - lo > 1)
      std::stable_sort(order + lo, order + hi, [&](int64_t u, int64_t v) {
        return at[reader[u]] < at[reader[v]];
      });
    for (int64_t i = lo; i < hi; ++i) at[order[i]] = i;
  }
}

// The LSTM cell (ops/cells.py) on rows of gate pre-activations [i, f_1..f_K, o, u] (each H):
// c = s(i) t(u) + sum_j s(f_j) c_j, h = s(o) t(c), written as [h, c]; one pass, no temporaries.
// K (0, 1, 2) is a template argument so the loop over a row has no branch. The previous
// cells may be strided rows, each at its own stride (ldc0, ldc1: the c half of [h, c] states,
// the two children's from slabs of two widths). With `terms` (2 or 3) the
// pre-activations are first summed into `pre`, t[0] + t[1] (+ t[2]) in that order, each rows at
// its stride lt[k] (0: one row for all, a bias): an LSTM step's two products and its bias in
// the cell's pass (runtime/executor.SummedCellStep), the sum kept for the gradient. Rows are
// split between `threads`.
template <typename T>
static inline T sigm(T x) { return T(1) / (T(1) + std::exp(-x)); }

template <typename T, int K>
static void lstm_cell(T *pre, const T *const *t, const int64_t *lt, int terms, const T *c0,
                      const T *c1, int64_t ldc0, int64_t ldc1, int64_t rows, int64_t H, T *out,
                      int threads) {
  const int64_t width = (3 + K) * H;
  #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t r = 0; r < rows; ++r) {
    T *p = pre + r * width;
    if (terms > 1) {
      const T *x = t[0] + r * lt[0], *y = t[1] + r * lt[1];
      #pragma omp simd
      for (int64_t j = 0; j < width; ++j) p[j] = x[j] + y[j];
      if (terms > 2) {
        const T *z = t[2] + r * lt[2];
        #pragma omp simd
        for (int64_t j = 0; j < width; ++j) p[j] += z[j];
      }
    }
    const T *a = K > 0 ? c0 + r * ldc0 : nullptr, *b = K > 1 ? c1 + r * ldc1 : nullptr;
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
// cotangent g = [g_h, g_c] (each rows at its stride: ldo, ldg).
template <typename T, int K>
static void lstm_cell_grad(const T *pre, const T *c0, const T *c1, int64_t ldc0, int64_t ldc1,
                           const T *out, int64_t ldo, const T *g, int64_t ldg, int64_t rows,
                           int64_t H, T *grads, int threads) {
  #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const T *p = pre + r * (3 + K) * H, *o = out + r * ldo, *gr = g + r * ldg;
    const T *a = K > 0 ? c0 + r * ldc0 : nullptr, *b = K > 1 ? c1 + r * ldc1 : nullptr;
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
static void lstm_cell_k(T *pre, const T *const *t, const int64_t *lt, int terms, const T *c0,
                        const T *c1, int64_t ldc0, int64_t ldc1, int64_t k, int64_t rows,
                        int64_t H, T *out, int threads) {
  if (k == 0) lstm_cell<T, 0>(pre, t, lt, terms, c0, c1, ldc0, ldc1, rows, H, out, threads);
  else if (k == 1) lstm_cell<T, 1>(pre, t, lt, terms, c0, c1, ldc0, ldc1, rows, H, out, threads);
  else lstm_cell<T, 2>(pre, t, lt, terms, c0, c1, ldc0, ldc1, rows, H, out, threads);
}

template <typename T>
static void lstm_cell_grad_k(const T *pre, const T *c0, const T *c1, int64_t ldc0,
                             int64_t ldc1, const T *out, int64_t ldo, const T *g, int64_t ldg,
                             int64_t k, int64_t rows, int64_t H, T *grads, int threads) {
  if (k == 0)
    lstm_cell_grad<T, 0>(pre, c0, c1, ldc0, ldc1, out, ldo, g, ldg, rows, H, grads, threads);
  else if (k == 1)
    lstm_cell_grad<T, 1>(pre, c0, c1, ldc0, ldc1, out, ldo, g, ldg, rows, H, grads, threads);
  else
    lstm_cell_grad<T, 2>(pre, c0, c1, ldc0, ldc1, out, ldo, g, ldg, rows, H, grads, threads);
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
void reader_order_schedule(int64_t n, int64_t num_batches, int64_t *order, const int64_t *ends,
                           int64_t num_edges, const int64_t *src, const int64_t *dst,
                           int64_t *work) {
  reader_order(n, num_batches, order, ends, num_edges, src, dst, work);
}
#define TEAM_GEMM(name, T, I)                                                                  \
  void name(void *f, void *s, int ta, int tb, I M, I N, I K, const T *A, I lda, const T *B,   \
            I ldb, T *C, I ldc, int threads, T *partial) {                                    \
    team_gemm<T, I>(f, s, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, threads, partial);         \
  }
TEAM_GEMM(team_gemm_f32_64, float, int64_t)
TEAM_GEMM(team_gemm_f64_64, double, int64_t)
TEAM_GEMM(team_gemm_f32_32, float, int)
TEAM_GEMM(team_gemm_f64_32, double, int)
// The probe that measures from how much work a team pays here (cpu/calibrate.py): a gate-like
// element-wise pass, out = a / (1 + exp(-b)), on `threads` threads, in 8 loops each ending at
// the team's barrier, as a level of a generated loop's instructions runs.
void team_probe(const float *a, const float *b, float *out, int64_t n, int threads) {
  #pragma omp parallel num_threads(threads) if (threads > 1)
  for (int64_t part = 0; part < 8; ++part) {
    #pragma omp for simd schedule(static)
    for (int64_t i = part * n / 8; i < (part + 1) * n / 8; ++i) out[i] = a[i] / (1 + std::exp(-b[i]));
  }
}
#define LSTM_CELL(suffix, T)                                                                   \
  void lstm_cell_##suffix(T *p, const T *const *t, const int64_t *lt, int terms, const T *a,  \
                          const T *b, int64_t ldc0, int64_t ldc1, int64_t k, int64_t r,       \
                          int64_t h, T *o, int threads) {                                     \
    lstm_cell_k(p, t, lt, terms, a, b, ldc0, ldc1, k, r, h, o, threads);                      \
  }                                                                                           \
  void lstm_cell_grad_##suffix(const T *p, const T *a, const T *b, int64_t ldc0, int64_t ldc1, \
                               const T *o, int64_t ldo, const T *g, int64_t ldg, int64_t k,   \
                               int64_t r, int64_t h, T *d, int threads) {                     \
    lstm_cell_grad_k(p, a, b, ldc0, ldc1, o, ldo, g, ldg, k, r, h, d, threads);               \
  }
LSTM_CELL(f32, float)
LSTM_CELL(f64, double)
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
  // B stored transposed (B[k, n] = src[n ldb + k]) is read in tiles of KT of its rows' k: each
  // source line read once, whole. Read column by column instead, a panel's NR source rows
  // ldb apart fall in one set of the L1 cache when ldb is a power of two (a 1024 x 256
  // weight's transpose packed in 417 us, against 23 us untransposed).
  constexpr int64_t KT = 64 / sizeof(T) * 4;
  #pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t n0 = p * NR, width = N - n0 < NR ? N - n0 : NR;
    T *panel = P + p * K * NR;
    if (tb) {
      for (int64_t k0 = 0; k0 < K; k0 += KT) {
        const int64_t k1 = K - k0 < KT ? K : k0 + KT;
        for (int64_t j = 0; j < width; ++j) {
          const T *src = B + (n0 + j) * ldb;
          for (int64_t k = k0; k < k1; ++k) panel[k * NR + j] = src[k];
        }
      }
    } else {
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < width; ++j) panel[k * NR + j] = B[k * ldb + n0 + j];
    }
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = width; j < NR; ++j) panel[k * NR + j] = 0;
  }
}

template <typename T, int R>
static inline __attribute__((always_inline)) void panel_block(
    const T *A, int64_t lda, const T *panel, int64_t K, T *C, int64_t ldc, int64_t width,
    bool add) {
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
      for (int v = 0; v < NV; ++v) {
        V *c = (V *)(C + r * ldc + v * L);
        *c = add ? *c + acc[r][v] : acc[r][v];
      }
    } else {  // the last panel: only its columns inside C
      T row[NR];
      for (int v = 0; v < NV; ++v) *(V *)(row + v * L) = acc[r][v];
      for (int64_t j = 0; j < width; ++j) C[r * ldc + j] = add ? C[r * ldc + j] + row[j] : row[j];
    }
  }
}

template <typename T, int R>
static void rows_tail(const T *a, int64_t lda, const T *panel, int64_t K, T *c, int64_t ldc,
                      int64_t width, int64_t rows, bool add) {  // the last rows, one block
  if constexpr (R > 0) {
    if (rows == R) panel_block<T, R>(a, lda, panel, K, c, ldc, width, add);
    else rows_tail<T, R - 1>(a, lda, panel, K, c, ldc, width, rows, add);
  }
}

// Panels p0 to p1 of C = A B (``add``: C += A B) on the calling thread: a team's share, the
// product of a level of a generated loop (runtime/codegen.py) or of packed_gemm's thread.
template <typename T>
static void packed_panels(const T *A, int64_t lda, const T *P, int64_t M, int64_t N, int64_t K,
                          T *C, int64_t ldc, int64_t p0, int64_t p1, bool add) {
  constexpr int64_t NR = panel_width<T>();
  for (int64_t p = p0; p < p1; ++p) {
    const T *panel = P + p * K * NR;
    const int64_t n0 = p * NR, width = N - n0 < NR ? N - n0 : NR;
    int64_t m = 0;
    for (; m + MR <= M; m += MR)
      panel_block<T, MR>(A + m * lda, lda, panel, K, C + m * ldc + n0, ldc, width, add);
    rows_tail<T, MR - 1>(A + m * lda, lda, panel, K, C + m * ldc + n0, ldc, width, M - m, add);
  }
}

template <typename T>
static void packed_gemm(const T *A, int64_t lda, const T *P, int64_t M, int64_t N, int64_t K,
                        T *C, int64_t ldc, int threads) {
  const int64_t panels = (N + panel_width<T>() - 1) / panel_width<T>();
  #pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t p = 0; p < panels; ++p) packed_panels(A, lda, P, M, N, K, C, ldc, p, p + 1, false);
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
void NAME_packed_panels_f32(const float *a, int64_t lda, const float *p, int64_t m, int64_t n,
                            int64_t k, float *c, int64_t ldc, int64_t p0, int64_t p1, int add) {
  packed_panels(a, lda, p, m, n, k, c, ldc, p0, p1, add != 0); }
void NAME_packed_panels_f64(const double *a, int64_t lda, const double *p, int64_t m,
                            int64_t n, int64_t k, double *c, int64_t ldc, int64_t p0, int64_t p1,
                            int add) {
  packed_panels(a, lda, p, m, n, k, c, ldc, p0, p1, add != 0); }
}
""", build.UNIT)
