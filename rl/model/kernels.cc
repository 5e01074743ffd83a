#include "model/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "model/threads.h"

namespace troupe::rl::model {
namespace {

// ---- BLAS -------------------------------------------------------------

// C (M,N) = alpha * op(A) x op(B) + beta * C, row-major, by BLAS.
inline void gemm(bool trans_a, bool trans_b, size_t M, size_t N, size_t K, float alpha, const float* A, size_t lda,
                 const float* B, size_t ldb, float beta, float* C, size_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
              static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}
inline void gemm(bool trans_a, bool trans_b, size_t M, size_t N, size_t K, double alpha, const double* A, size_t lda,
                 const double* B, size_t ldb, double beta, double* C, size_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
              static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

// Rows or columns of a product's output handed to a thread come in blocks of
// this many (whole vector registers for the BLAS kernels).
constexpr size_t kGemmBlock = 16;
// A product smaller than this many multiply-adds per thread is not split.
constexpr size_t kGemmMinMacs = size_t{1} << 17;

// Runs part(m0, m1, n0, n1) over a split of the (M,N) output of a product
// with inner dimension K: by rows when there are at least as many as
// columns, else by columns, in blocks of kGemmBlock, across the threads.
template <typename Part>
void split_product(size_t M, size_t N, size_t K, Part&& part) {
  const bool by_rows = M >= N;
  const size_t along = by_rows ? M : N, across = by_rows ? N : M;
  const size_t blocks = (along + kGemmBlock - 1) / kGemmBlock;
  const size_t grain = std::max<size_t>(1, kGemmMinMacs / std::max<size_t>(1, kGemmBlock * across * K));
  parallel_for(blocks, grain, [&](size_t b0, size_t b1) {
    const size_t lo = b0 * kGemmBlock, hi = std::min(along, b1 * kGemmBlock);
    if (by_rows) {
      part(lo, hi, size_t{0}, N);
    } else {
      part(size_t{0}, M, lo, hi);
    }
  });
}

// C (M,N) = alpha * op(A) x op(B) + beta * C across the threads.
template <typename F>
void parallel_gemm(bool trans_a, bool trans_b, size_t M, size_t N, size_t K, F alpha, const F* A, size_t lda,
                   const F* B, size_t ldb, F beta, F* C, size_t ldc) {
  split_product(M, N, K, [&](size_t m0, size_t m1, size_t n0, size_t n1) {
    const F* a = trans_a ? A + m0 : A + m0 * lda;
    const F* b = trans_b ? B + n0 * ldb : B + n0;
    gemm(trans_a, trans_b, m1 - m0, n1 - n0, K, alpha, a, lda, b, ldb, beta, C + m0 * ldc + n0, ldc);
  });
}

// ---- Vectors ------------------------------------------------------------
//
// The elementwise loops work on 64-byte vectors (GCC's vector extension:
// the compiler maps them to whatever the target has), so that they
// vectorise at -O2 and without -ffast-math; the last partial vector of a
// row is padded. Helpers take vectors by reference: passing 64-byte vectors
// by value is ABI-dependent on the target.
//
// The loops are compiled three times, for x86-64-v4 (AVX-512), v3 (AVX2,
// FMA) and the baseline (SSE2), and the loader picks the best the machine
// has: the project builds portable binaries (no -march). The v3 and v4
// clones fuse multiply-adds, so their last bits can differ from the
// baseline's, as BLAS's kernels differ from machine to machine.
#define TROUPE_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

template <typename F>
struct Simd;
template <>
struct Simd<float> {
  using V = float __attribute__((vector_size(64)));
  using I = int32_t __attribute__((vector_size(64)));
  using W = double __attribute__((vector_size(128)));
  static constexpr size_t kLanes = 16;
};
template <>
struct Simd<double> {
  using V = double __attribute__((vector_size(64)));
  using W = V;
  static constexpr size_t kLanes = 8;
};
template <typename F>
using Vec = typename Simd<F>::V;
// As many doubles as Vec<F> has lanes.
template <typename F>
using Wide = typename Simd<F>::W;
template <typename F>
constexpr size_t kLanes = Simd<F>::kLanes;

// v = p[0..n) (n <= lanes), the other lanes `fill`.
template <typename F>
[[gnu::always_inline]] inline void load(Vec<F>& v, const F* p, size_t n, F fill = F(0)) {
  if (n == kLanes<F>) {
    std::memcpy(&v, p, sizeof v);
  } else {
    v = Vec<F>{} + fill;
    for (size_t i = 0; i < n; ++i) v[i] = p[i];
  }
}
// p[0..n) = the first n lanes of v.
template <typename F>
[[gnu::always_inline]] inline void store(F* p, const Vec<F>& v, size_t n) {
  if (n == kLanes<F>) {
    std::memcpy(p, &v, sizeof v);
  } else {
    for (size_t i = 0; i < n; ++i) p[i] = v[i];
  }
}
// g = p[0..n) to add a gradient to (Grad::add), or zeros to write it
// (Grad::write: whatever p holds is not read).
template <typename F>
[[gnu::always_inline]] inline void load_grad(Vec<F>& g, const F* p, size_t n, Grad mode) {
  if (mode == Grad::add) {
    load(g, p, n);
  } else {
    g = Vec<F>{};
  }
}
template <typename V>
[[gnu::always_inline]] inline auto hsum(const V& v) {
  auto s = v[0];
  for (size_t i = 1; i < sizeof(V) / sizeof(v[0]); ++i) s += v[i];
  return s;
}
template <typename V>
[[gnu::always_inline]] inline auto hmax(const V& v) {
  auto m = v[0];
  for (size_t i = 1; i < sizeof(V) / sizeof(v[0]); ++i) m = std::max(m, v[i]);
  return m;
}
template <typename F>
[[gnu::always_inline]] inline size_t lanes_left(size_t i, size_t n) {
  return std::min(kLanes<F>, n - i);
}

// x = exp(x) per lane. Float: Cephes' expf (range reduction by ln 2, a
// degree-5 polynomial; within 2 ulp on [-87, 88], inputs clamped to it).
// Double (the tests' reference): std::exp, exact to the last bit.
[[gnu::always_inline]] inline void exp_lanes(Vec<float>& x) {
  using V = Vec<float>;
  using I = Simd<float>::I;
  const V lo = V{} + -87.0f, hi = V{} + 88.0f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  // fx = round(x / ln 2): adding and taking away 1.5 * 2^23 rounds to the
  // nearest integer in float's own rounding.
  V fx = x * 1.44269504088896341f + 12582912.0f - 12582912.0f;
  V r = x - fx * 0.693359375f;
  r = r - fx * -2.12194440e-4f;
  V y = V{} + 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  I n = __builtin_convertvector(fx, I);
  x = y * reinterpret_cast<V>((n + 127) << 23);
}
[[gnu::always_inline]] inline void exp_lanes(Vec<double>& x) {
  for (size_t i = 0; i < kLanes<double>; ++i) x[i] = std::exp(x[i]);
}

// ---- Splits ---------------------------------------------------------------

// Elementwise work is split in ranges of at least this many values; rows in
// ranges of at least this many values' worth of rows.
constexpr size_t kGrainValues = 8192;
inline size_t row_grain(size_t row_values) {
  return std::max<size_t>(1, kGrainValues / std::max<size_t>(1, row_values));
}

// Runs body(c0, c1) over column ranges of a (rows, C) matrix, whole vectors
// each, across the threads: for column reductions (sums over rows), which
// then add up in the same order whatever the thread count.
template <typename F, typename Body>
void for_column_blocks(size_t rows, size_t C, Body&& body) {
  const size_t blocks = (C + kLanes<F> - 1) / kLanes<F>;
  parallel_for(blocks, row_grain(rows * kLanes<F>),
               [&](size_t b0, size_t b1) { body(b0 * kLanes<F>, std::min(C, b1 * kLanes<F>)); });
}

// sums[c0..c1) += sum over rows n of x[n * ld + c], vectorised across
// columns.
template <typename F>
[[gnu::always_inline]] inline void add_column_sums(F* sums, const F* x, size_t rows, size_t ld, size_t c0, size_t c1) {
  using V = Vec<F>;
  for (size_t c = c0; c < c1; c += kLanes<F>) {
    const size_t m = lanes_left<F>(c, c1);
    V acc = V{};
    for (size_t n = 0; n < rows; ++n) {
      V v;
      load(v, x + n * ld + c, m);
      acc += v;
    }
    V s;
    load(s, sums + c, m);
    s += acc;
    store(sums + c, s, m);
  }
}

constexpr double kLayerNormEps = 1e-5;

}  // namespace

template <typename F>
void encoder_forward(F* out, const int32_t* tokens, const F* wte, const F* wpe, size_t B, size_t T, size_t C) {
  parallel_for(B * T, row_grain(C), [&](size_t r0, size_t r1) TROUPE_SIMD_CLONES {
    for (size_t r = r0; r < r1; ++r) {
      F* o = out + r * C;
      const F* te = wte + static_cast<size_t>(tokens[r]) * C;
      const F* pe = wpe + (r % T) * C;
      for (size_t i = 0; i < C; ++i) o[i] = te[i] + pe[i];
    }
  });
}

template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, size_t B, size_t T, size_t C) {
  // By columns: two positions may hold the same token.
  for_column_blocks<F>(B * T, C, [&](size_t c0, size_t c1) TROUPE_SIMD_CLONES {
    for (size_t r = 0; r < B * T; ++r) {
      const F* d = dout + r * C;
      F* dte = dwte + static_cast<size_t>(tokens[r]) * C;
      F* dpe = dwpe + (r % T) * C;
      for (size_t i = c0; i < c1; ++i) {
        dte[i] += d[i];
        dpe[i] += d[i];
      }
    }
  });
}

// In float the statistics and the normalisation are computed in double and
// the output rounded once: the residual stream's values can be large
// against their spread, and float's x - mean then loses digits that the
// normalisation scales back up. Measured on the KV-cache test's model
// (weights x8): the float model's log-probabilities 5x closer to double's
// (1.3e-4 to 2.6e-5), the difference to its KV-cache path under the test's
// 1e-4 with margin (it was 9.8e-5 to 1.1e-4 with float statistics).
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias, size_t N, size_t C) {
  using V = Vec<F>;
  using W = Wide<F>;
  parallel_for(N, row_grain(C), [&](size_t n0, size_t n1) TROUPE_SIMD_CLONES {
    for (size_t n = n0; n < n1; ++n) {
      const F* x = inp + n * C;
      V v;
      W acc = W{}, xd;
      for (size_t i = 0; i < C; i += kLanes<F>) {
        load(v, x + i, lanes_left<F>(i, C));
        acc += __builtin_convertvector(v, W);
      }
      const double m = hsum(acc) / static_cast<double>(C);
      acc = W{};
      for (size_t i = 0; i < C; i += kLanes<F>) {
        const size_t k = lanes_left<F>(i, C);
        load(v, x + i, k);
        xd = __builtin_convertvector(v, W) - m;
        for (size_t j = k; j < kLanes<F>; ++j) xd[j] = 0;
        acc += xd * xd;
      }
      const double s = 1.0 / std::sqrt(hsum(acc) / static_cast<double>(C) + kLayerNormEps);
      F* o = out + n * C;
      for (size_t i = 0; i < C; i += kLanes<F>) {
        const size_t k = lanes_left<F>(i, C);
        V w, b;
        load(v, x + i, k);
        load(w, weight + i, k);
        load(b, bias + i, k);
        xd = (__builtin_convertvector(v, W) - m) * s * __builtin_convertvector(w, W) + __builtin_convertvector(b, W);
        v = __builtin_convertvector(xd, V);
        store(o + i, v, k);
      }
      mean[n] = static_cast<F>(m);
      rstd[n] = static_cast<F>(s);
    }
  });
}

template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, const F* mean,
                        const F* rstd, size_t N, size_t C, Grad mode) {
  using V = Vec<F>;
  parallel_for(N, row_grain(C), [&](size_t n0, size_t n1) TROUPE_SIMD_CLONES {
    for (size_t n = n0; n < n1; ++n) {
      const F* d = dout + n * C;
      const F* x = inp + n * C;
      F* dx = dinp + n * C;
      const F m = mean[n], s = rstd[n];
      // The two reductions of the normalisation's backward (padding: d = 0).
      V sum_dnorm = V{}, sum_dnorm_norm = V{};
      for (size_t i = 0; i < C; i += kLanes<F>) {
        const size_t k = lanes_left<F>(i, C);
        V xv, dv, w;
        load(xv, x + i, k);
        load(dv, d + i, k);
        load(w, weight + i, k);
        const V norm = (xv - m) * s, dnorm = w * dv;
        sum_dnorm += dnorm;
        sum_dnorm_norm += dnorm * norm;
      }
      const F dnorm_mean = hsum(sum_dnorm) / static_cast<F>(C);
      const F dnorm_norm_mean = hsum(sum_dnorm_norm) / static_cast<F>(C);
      for (size_t i = 0; i < C; i += kLanes<F>) {
        const size_t k = lanes_left<F>(i, C);
        V xv, dv, w, g;
        load(xv, x + i, k);
        load(dv, d + i, k);
        load(w, weight + i, k);
        load_grad(g, dx + i, k, mode);
        const V norm = (xv - m) * s;
        g += (w * dv - dnorm_mean - norm * dnorm_norm_mean) * s;
        store(dx + i, g, k);
      }
    }
  });
  // dweight and dbias sum over rows: by columns.
  for_column_blocks<F>(N, C, [&](size_t c0, size_t c1) TROUPE_SIMD_CLONES {
    for (size_t c = c0; c < c1; c += kLanes<F>) {
      const size_t k = lanes_left<F>(c, c1);
      V sum_d = V{}, sum_norm_d = V{};
      for (size_t n = 0; n < N; ++n) {
        V xv, dv;
        load(xv, inp + n * C + c, k);
        load(dv, dout + n * C + c, k);
        sum_d += dv;
        sum_norm_d += (xv - mean[n]) * rstd[n] * dv;
      }
      V w, b;
      load(w, dweight + c, k);
      load(b, dbias + c, k);
      w += sum_norm_d;
      b += sum_d;
      store(dweight + c, w, k);
      store(dbias + c, b, k);
    }
  });
}

template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, size_t N, size_t C, size_t OC) {
  // The bias goes in first and the product adds to it (beta = 1): one pass
  // over out fewer than adding it after.
  split_product(N, OC, C, [&](size_t n0, size_t n1, size_t j0, size_t j1) {
    if (bias != nullptr) {
      for (size_t n = n0; n < n1; ++n) std::copy(bias + j0, bias + j1, out + n * OC + j0);
    }
    gemm(false, true, n1 - n0, j1 - j0, C, F(1), inp + n0 * C, C, weight + j0 * C, C, bias != nullptr ? F(1) : F(0),
         out + n0 * OC + j0, OC);
  });
}

template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, size_t N, size_t C,
                     size_t OC, Grad mode) {
  const F beta = mode == Grad::add ? F(1) : F(0);
  // dinp (N,C) += dout (N,OC) x weight (OC,C) and dweight (OC,C) += dout^T
  // (OC,N) x inp (N,C) take the same multiply-adds: half the threads each,
  // splitting rows (in blocks) among them; with two threads, each product
  // whole on its own thread, so neither packs its operands twice.
  const size_t half = compute_threads() / 2;
  if (half >= 1 && N * C * OC >= 2 * kGemmMinMacs) {
    parallel_for(2 * half, 1, [&](size_t t0, size_t t1) {
      for (size_t t = t0; t < t1; ++t) {
        const bool for_dinp = t < half;
        const size_t rows = for_dinp ? N : OC, part = for_dinp ? t : t - half;
        const size_t blocks = (rows + kGemmBlock - 1) / kGemmBlock;
        const size_t r0 = std::min(rows, blocks * part / half * kGemmBlock);
        const size_t r1 = std::min(rows, blocks * (part + 1) / half * kGemmBlock);
        if (r0 == r1) continue;
        if (for_dinp) {
          gemm(false, false, r1 - r0, C, OC, F(1), dout + r0 * OC, OC, weight, C, beta, dinp + r0 * C, C);
        } else {
          gemm(true, false, r1 - r0, C, N, F(1), dout + r0, OC, inp, C, F(1), dweight + r0 * C, C);
        }
      }
    });
  } else {
    parallel_gemm(false, false, N, C, OC, F(1), dout, OC, weight, C, beta, dinp, C);
    parallel_gemm(true, false, OC, C, N, F(1), dout, OC, inp, C, F(1), dweight, C);
  }
  if (dbias == nullptr) return;
  for_column_blocks<F>(N, OC,
                       [&](size_t c0, size_t c1) TROUPE_SIMD_CLONES { add_column_sums(dbias, dout, N, OC, c0, c1); });
}

namespace {

// a[0..len) = softmax(pre[0..len)) (len >= 1).
template <typename F>
[[gnu::always_inline]] inline void softmax_row(F* a, const F* pre, size_t len) {
  using V = Vec<F>;
  const F lowest = -std::numeric_limits<F>::infinity();
  V mx = V{} + lowest, v;
  for (size_t i = 0; i < len; i += kLanes<F>) {
    load(v, pre + i, lanes_left<F>(i, len), lowest);
    mx = v > mx ? v : mx;
  }
  const F maxval = hmax(mx);
  V sum = V{};
  for (size_t i = 0; i < len; i += kLanes<F>) {
    const size_t k = lanes_left<F>(i, len);
    load(v, pre + i, k, maxval);
    v -= maxval;
    exp_lanes(v);
    if (k < kLanes<F>) {
      for (size_t j = k; j < kLanes<F>; ++j) v[j] = 0;
    }
    sum += v;
    store(a + i, v, k);
  }
  const F total = hsum(sum);
  for (size_t i = 0; i < len; i += kLanes<F>) {
    const size_t k = lanes_left<F>(i, len);
    load(v, a + i, k);
    v /= total;
    store(a + i, v, k);
  }
}

}  // namespace

// The attention's products go by blocks of this many positions (query rows
// for the scores and the weighted sum, key rows for their gradients), so
// that the part above the causal diagonal, all zeros, is computed only
// inside the diagonal blocks: 9/16 of the full products at T = 128.
constexpr size_t kAttentionBlock = 16;

template <typename F>
void attention_forward(F* out, F* preatt, F* att, const F* qkv, size_t B, size_t T, size_t C, size_t NH) {
  const size_t hs = C / NH, C3 = 3 * C;
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
  // One (batch, head) pair at a time per thread; its q, k and v are (T,hs)
  // column slices of qkv (row stride 3C).
  parallel_for(B * NH, 1, [&](size_t p0, size_t p1) TROUPE_SIMD_CLONES {
    for (size_t bh = p0; bh < p1; ++bh) {
      const size_t b = bh / NH, h = bh % NH;
      const F* q = qkv + b * T * C3 + h * hs;
      const F* k = q + C;
      const F* v = q + 2 * C;
      F* pre = preatt + bh * T * T;
      F* a = att + bh * T * T;
      for (size_t r0 = 0; r0 < T; r0 += kAttentionBlock) {
        const size_t r1 = std::min(T, r0 + kAttentionBlock);
        // pre rows r0..r1 (cols 0..r1) = q k^T * scale; then each row's
        // softmax over 0..t, zeros past t.
        gemm(false, true, r1 - r0, r1, hs, scale, q + r0 * C3, C3, k, C3, F(0), pre + r0 * T, T);
        for (size_t t = r0; t < r1; ++t) {
          softmax_row(a + t * T, pre + t * T, t + 1);
          std::fill(pre + t * T + t + 1, pre + (t + 1) * T, F(0));
          std::fill(a + t * T + t + 1, a + (t + 1) * T, F(0));
        }
        // out rows r0..r1 (T,hs) = att (rows r0..r1, cols 0..r1) x v.
        gemm(false, false, r1 - r0, hs, r1, F(1), a + r0 * T, T, v, C3, F(0), out + (b * T + r0) * C + h * hs, C);
      }
    }
  });
}

template <typename F>
void attention_backward(F* dqkv, F* dpreatt, F* datt, const F* dout, const F* qkv, const F* att, size_t B, size_t T,
                        size_t C, size_t NH, Grad mode) {
  using V = Vec<F>;
  const size_t hs = C / NH, C3 = 3 * C;
  // Each block of rows of dq, dk, dv of a (batch, head) pair is one
  // product's output.
  const F beta = mode == Grad::add ? F(1) : F(0);
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
  parallel_for(B * NH, 1, [&](size_t p0, size_t p1) TROUPE_SIMD_CLONES {
    for (size_t bh = p0; bh < p1; ++bh) {
      const size_t b = bh / NH, h = bh % NH;
      const F* q = qkv + b * T * C3 + h * hs;
      const F* k = q + C;
      const F* v = q + 2 * C;
      F* dq = dqkv + b * T * C3 + h * hs;
      F* dk = dq + C;
      F* dv = dq + 2 * C;
      const F* d = dout + b * T * C + h * hs;
      const F* a = att + bh * T * T;
      F* da = datt + bh * T * T;
      F* dpre = dpreatt + bh * T * T;
      for (size_t r0 = 0; r0 < T; r0 += kAttentionBlock) {
        const size_t r1 = std::min(T, r0 + kAttentionBlock);
        // Through out = att v: datt rows r0..r1 (cols 0..r1) = dout v^T.
        gemm(false, true, r1 - r0, r1, hs, F(1), d + r0 * C, C, v, C3, F(0), da + r0 * T, T);
        // Through the softmax, row t: dpre[t3] = a[t3] (da[t3] - sum_t2
        // a[t2] da[t2]), zero past t to the block's end (what the
        // products below read).
        for (size_t t = r0; t < r1; ++t) {
          const F* ar = a + t * T;
          const F* dar = da + t * T;
          F* dp = dpre + t * T;
          const size_t len = t + 1;
          V acc = V{}, av, dav;
          for (size_t i = 0; i < len; i += kLanes<F>) {
            const size_t m = lanes_left<F>(i, len);
            load(av, ar + i, m);
            load(dav, dar + i, m);
            acc += av * dav;
          }
          const F weighted = hsum(acc);
          for (size_t i = 0; i < len; i += kLanes<F>) {
            const size_t m = lanes_left<F>(i, len);
            load(av, ar + i, m);
            load(dav, dar + i, m);
            av *= dav - weighted;
            store(dp + i, av, m);
          }
          std::fill(dp + len, dp + r1, F(0));
        }
        // Through pre = q k^T * scale: dq rows r0..r1 = dpre (rows r0..r1,
        // cols 0..r1) k * scale.
        gemm(false, false, r1 - r0, hs, r1, scale, dpre + r0 * T, T, k, C3, beta, dq + r0 * C3, C3);
      }
      // By key rows c0..c1: only query rows t >= c0 attend to them. dv =
      // att^T dout and dk = dpre^T q * scale over those rows.
      for (size_t c0 = 0; c0 < T; c0 += kAttentionBlock) {
        const size_t c1 = std::min(T, c0 + kAttentionBlock);
        gemm(true, false, c1 - c0, hs, T - c0, F(1), a + c0 * T + c0, T, d + c0 * C, C, beta, dv + c0 * C3, C3);
        gemm(true, false, c1 - c0, hs, T - c0, scale, dpre + c0 * T + c0, T, q + c0 * C3, C3, beta, dk + c0 * C3, C3);
      }
    }
  });
}

namespace {
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;
}  // namespace

// GELU's tanh form through the logistic function, 0.5 (1 + tanh(u)) =
// 1 / (1 + exp(-2u)): the same function, without the cancellation of
// 1 + tanh(u) for negative u, and one exp per value instead of a tanh.
template <typename F>
void gelu_forward(F* out, const F* inp, size_t n) {
  using V = Vec<F>;
  const F s = static_cast<F>(kGeluScale), c = static_cast<F>(kGeluCubic);
  parallel_for(n, kGrainValues, [&](size_t i0, size_t i1) TROUPE_SIMD_CLONES {
    for (size_t i = i0; i < i1; i += kLanes<F>) {
      const size_t k = lanes_left<F>(i, i1);
      V x, e;
      load(x, inp + i, k);
      e = F(-2) * s * (x + c * x * x * x);
      exp_lanes(e);
      x = x / (F(1) + e);
      store(out + i, x, k);
    }
  });
}

template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n, Grad mode) {
  using V = Vec<F>;
  const F s = static_cast<F>(kGeluScale), c = static_cast<F>(kGeluCubic);
  parallel_for(n, kGrainValues, [&](size_t i0, size_t i1) TROUPE_SIMD_CLONES {
    for (size_t i = i0; i < i1; i += kLanes<F>) {
      const size_t k = lanes_left<F>(i, i1);
      V x, d, g, e;
      load(x, inp + i, k);
      load(d, dout + i, k);
      load_grad(g, dinp + i, k, mode);
      e = F(-2) * s * (x + c * x * x * x);
      exp_lanes(e);
      // gelu = x sig(2u): gelu' = sig + x sig (1 - sig) 2u'.
      const V sig = F(1) / (F(1) + e);
      const V local = sig + F(2) * s * x * (F(1) + F(3) * c * x * x) * sig * (F(1) - sig);
      g += local * d;
      store(dinp + i, g, k);
    }
  });
}

template <typename F>
void residual_forward(F* out, const F* a, const F* b, size_t n) {
  using V = Vec<F>;
  parallel_for(n, kGrainValues, [&](size_t i0, size_t i1) TROUPE_SIMD_CLONES {
    for (size_t i = i0; i < i1; i += kLanes<F>) {
      const size_t k = lanes_left<F>(i, i1);
      V x, y;
      load(x, a + i, k);
      load(y, b + i, k);
      x += y;
      store(out + i, x, k);
    }
  });
}

template <typename F>
void residual_backward(F* da, F* db, const F* dout, size_t n) {
  using V = Vec<F>;
  parallel_for(n, kGrainValues, [&](size_t i0, size_t i1) TROUPE_SIMD_CLONES {
    for (size_t i = i0; i < i1; i += kLanes<F>) {
      const size_t k = lanes_left<F>(i, i1);
      V d, x, y;
      load(d, dout + i, k);
      load(x, da + i, k);
      load(y, db + i, k);
      x += d;
      y += d;
      store(da + i, x, k);
      store(db + i, y, k);
    }
  });
}

template <typename F>
void softmax_forward(F* probs, const F* logits, size_t N, size_t V) {
  parallel_for(N, row_grain(V), [&](size_t n0, size_t n1) TROUPE_SIMD_CLONES {
    for (size_t n = n0; n < n1; ++n) softmax_row(probs + n * V, logits + n * V, V);
  });
}

template <typename F>
void crossentropy_forward(F* losses, const F* probs, const int32_t* targets, size_t N, size_t V) {
  for (size_t n = 0; n < N; ++n) losses[n] = -std::log(probs[n * V + static_cast<size_t>(targets[n])]);
}

template <typename F>
void crossentropy_softmax_backward(F* dlogits, const F* dlosses, const F* probs, const int32_t* targets, size_t N,
                                   size_t V, Grad mode) {
  using Vv = Vec<F>;
  parallel_for(N, row_grain(V), [&](size_t n0, size_t n1) TROUPE_SIMD_CLONES {
    for (size_t n = n0; n < n1; ++n) {
      const F* p = probs + n * V;
      F* dl = dlogits + n * V;
      const F w = dlosses[n];
      for (size_t v = 0; v < V; v += kLanes<F>) {
        const size_t k = lanes_left<F>(v, V);
        Vv pv, g;
        load(pv, p + v, k);
        load_grad(g, dl + v, k, mode);
        g += pv * w;
        store(dl + v, g, k);
      }
      dl[static_cast<size_t>(targets[n])] -= w;
    }
  });
}

// H = lse - sum p z with lse = max z - log p(max z) (that probability is
// 1 / the softmax's sum): H = -log p_max - sum p (z - z_max), two terms that
// are never negative, so nothing cancels; and no log of a probability that
// may have underflowed to 0.
template <typename F>
void entropy_forward(F* entropy, F* mean_logit, const F* probs, const F* logits, size_t N, size_t V) {
  using Vv = Vec<F>;
  const F lowest = -std::numeric_limits<F>::infinity();
  parallel_for(N, row_grain(V), [&](size_t n0, size_t n1) TROUPE_SIMD_CLONES {
    for (size_t n = n0; n < n1; ++n) {
      const F* p = probs + n * V;
      const F* z = logits + n * V;
      Vv zmax = Vv{} + lowest, pmax = Vv{}, pv, zv;
      for (size_t v = 0; v < V; v += kLanes<F>) {
        const size_t k = lanes_left<F>(v, V);
        load(zv, z + v, k, lowest);
        load(pv, p + v, k);
        zmax = zv > zmax ? zv : zmax;
        pmax = pv > pmax ? pv : pmax;
      }
      const F zm = hmax(zmax), pm = hmax(pmax);
      Vv acc = Vv{};
      for (size_t v = 0; v < V; v += kLanes<F>) {
        const size_t k = lanes_left<F>(v, V);
        load(pv, p + v, k);
        load(zv, z + v, k, zm);
        acc += pv * (zv - zm);
      }
      const F centred = hsum(acc);  // sum p (z - z_max), at most 0
      entropy[n] = -std::log(pm) - centred;
      mean_logit[n] = zm + centred;
    }
  });
}

template <typename F>
void entropy_softmax_backward(F* dlogits, const F* dentropy, const F* probs, const F* logits, const F* mean_logit,
                              size_t N, size_t V, Grad mode) {
  using Vv = Vec<F>;
  parallel_for(N, row_grain(V), [&](size_t n0, size_t n1) TROUPE_SIMD_CLONES {
    for (size_t n = n0; n < n1; ++n) {
      const F* p = probs + n * V;
      const F* z = logits + n * V;
      F* dl = dlogits + n * V;
      const F w = dentropy[n], m = mean_logit[n];
      for (size_t v = 0; v < V; v += kLanes<F>) {
        const size_t k = lanes_left<F>(v, V);
        Vv pv, zv, g;
        load(pv, p + v, k);
        load(zv, z + v, k);
        load_grad(g, dl + v, k, mode);
        g -= w * pv * (zv - m);
        store(dl + v, g, k);
      }
    }
  });
}

// The model runs in float; the tests check gradients in double.
#define TROUPE_RL_KERNELS(F)                                                                                           \
  template void encoder_forward<F>(F*, const int32_t*, const F*, const F*, size_t, size_t, size_t);                    \
  template void encoder_backward<F>(F*, F*, const F*, const int32_t*, size_t, size_t, size_t);                         \
  template void layernorm_forward<F>(F*, F*, F*, const F*, const F*, const F*, size_t, size_t);                        \
  template void layernorm_backward<F>(F*, F*, F*, const F*, const F*, const F*, const F*, const F*, size_t, size_t,    \
                                      Grad);                                                                           \
  template void matmul_forward<F>(F*, const F*, const F*, const F*, size_t, size_t, size_t);                           \
  template void matmul_backward<F>(F*, F*, F*, const F*, const F*, const F*, size_t, size_t, size_t, Grad);            \
  template void attention_forward<F>(F*, F*, F*, const F*, size_t, size_t, size_t, size_t);                            \
  template void attention_backward<F>(F*, F*, F*, const F*, const F*, const F*, size_t, size_t, size_t, size_t, Grad); \
  template void gelu_forward<F>(F*, const F*, size_t);                                                                 \
  template void gelu_backward<F>(F*, const F*, const F*, size_t, Grad);                                                \
  template void residual_forward<F>(F*, const F*, const F*, size_t);                                                   \
  template void residual_backward<F>(F*, F*, const F*, size_t);                                                        \
  template void softmax_forward<F>(F*, const F*, size_t, size_t);                                                      \
  template void crossentropy_forward<F>(F*, const F*, const int32_t*, size_t, size_t);                                 \
  template void crossentropy_softmax_backward<F>(F*, const F*, const F*, const int32_t*, size_t, size_t, Grad);        \
  template void entropy_forward<F>(F*, F*, const F*, const F*, size_t, size_t);                                        \
  template void entropy_softmax_backward<F>(F*, const F*, const F*, const F*, const F*, size_t, size_t, Grad);
TROUPE_RL_KERNELS(float)
TROUPE_RL_KERNELS(double)
#undef TROUPE_RL_KERNELS
#undef TROUPE_SIMD_CLONES

}  // namespace troupe::rl::model
