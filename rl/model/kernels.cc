#include "model/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace troupe::rl::model {
namespace {

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

constexpr double kLayerNormEps = 1e-5;

}  // namespace

template <typename F>
void encoder_forward(F* out, const int32_t* tokens, const F* wte, const F* wpe, size_t B, size_t T, size_t C) {
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      F* o = out + (b * T + t) * C;
      const F* te = wte + static_cast<size_t>(tokens[b * T + t]) * C;
      const F* pe = wpe + t * C;
      for (size_t i = 0; i < C; ++i) o[i] = te[i] + pe[i];
    }
  }
}

template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, size_t B, size_t T, size_t C) {
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      const F* d = dout + (b * T + t) * C;
      F* dte = dwte + static_cast<size_t>(tokens[b * T + t]) * C;
      F* dpe = dwpe + t * C;
      for (size_t i = 0; i < C; ++i) {
        dte[i] += d[i];
        dpe[i] += d[i];
      }
    }
  }
}

template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias, size_t N, size_t C) {
  for (size_t n = 0; n < N; ++n) {
    const F* x = inp + n * C;
    F m = 0;
    for (size_t i = 0; i < C; ++i) m += x[i];
    m /= static_cast<F>(C);
    F v = 0;
    for (size_t i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
    v /= static_cast<F>(C);
    F s = F(1) / std::sqrt(v + static_cast<F>(kLayerNormEps));
    F* o = out + n * C;
    for (size_t i = 0; i < C; ++i) o[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, const F* mean,
                        const F* rstd, size_t N, size_t C) {
  for (size_t n = 0; n < N; ++n) {
    const F* d = dout + n * C;
    const F* x = inp + n * C;
    F* dx = dinp + n * C;
    F m = mean[n], s = rstd[n];
    // The two reductions of the normalisation's backward.
    F dnorm_mean = 0, dnorm_norm_mean = 0;
    for (size_t i = 0; i < C; ++i) {
      F norm = (x[i] - m) * s;
      F dnorm = weight[i] * d[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= static_cast<F>(C);
    dnorm_norm_mean /= static_cast<F>(C);
    for (size_t i = 0; i < C; ++i) {
      F norm = (x[i] - m) * s;
      F dnorm = weight[i] * d[i];
      dbias[i] += d[i];
      dweight[i] += norm * d[i];
      dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, size_t N, size_t C, size_t OC) {
  gemm(false, true, N, OC, C, F(1), inp, C, weight, C, F(0), out, OC);
  if (bias == nullptr) return;
  for (size_t n = 0; n < N; ++n) {
    F* o = out + n * OC;
    for (size_t j = 0; j < OC; ++j) o[j] += bias[j];
  }
}

template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, size_t N, size_t C,
                     size_t OC) {
  gemm(false, false, N, C, OC, F(1), dout, OC, weight, C, F(1), dinp, C);   // dinp += dout (N,OC) x weight (OC,C)
  gemm(true, false, OC, C, N, F(1), dout, OC, inp, C, F(1), dweight, C);    // dweight += dout^T (OC,N) x inp (N,C)
  if (dbias == nullptr) return;
  for (size_t n = 0; n < N; ++n) {
    const F* d = dout + n * OC;
    for (size_t j = 0; j < OC; ++j) dbias[j] += d[j];
  }
}

template <typename F>
void attention_forward(F* out, F* preatt, F* att, const F* qkv, size_t B, size_t T, size_t C, size_t NH) {
  size_t hs = C / NH;
  F scale = F(1) / std::sqrt(static_cast<F>(hs));
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      for (size_t h = 0; h < NH; ++h) {
        const F* q = qkv + (b * T + t) * 3 * C + h * hs;
        F* pre = preatt + ((b * NH + h) * T + t) * T;
        F* a = att + ((b * NH + h) * T + t) * T;
        // Scores against positions 0..t, then their softmax.
        F maxval = -std::numeric_limits<F>::infinity();
        for (size_t t2 = 0; t2 <= t; ++t2) {
          const F* k = qkv + (b * T + t2) * 3 * C + h * hs + C;
          F dot = 0;
          for (size_t i = 0; i < hs; ++i) dot += q[i] * k[i];
          pre[t2] = dot * scale;
          maxval = std::max(maxval, pre[t2]);
        }
        F sum = 0;
        for (size_t t2 = 0; t2 <= t; ++t2) {
          a[t2] = std::exp(pre[t2] - maxval);
          sum += a[t2];
        }
        for (size_t t2 = 0; t2 <= t; ++t2) a[t2] /= sum;
        for (size_t t2 = t + 1; t2 < T; ++t2) pre[t2] = a[t2] = 0;
        // The weighted sum of the values.
        F* o = out + (b * T + t) * C + h * hs;
        std::fill(o, o + hs, F(0));
        for (size_t t2 = 0; t2 <= t; ++t2) {
          const F* v = qkv + (b * T + t2) * 3 * C + h * hs + 2 * C;
          for (size_t i = 0; i < hs; ++i) o[i] += a[t2] * v[i];
        }
      }
    }
  }
}

template <typename F>
void attention_backward(F* dqkv, F* dpreatt, F* datt, const F* dout, const F* qkv, const F* att, size_t B, size_t T,
                        size_t C, size_t NH) {
  size_t hs = C / NH;
  F scale = F(1) / std::sqrt(static_cast<F>(hs));
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      for (size_t h = 0; h < NH; ++h) {
        const F* a = att + ((b * NH + h) * T + t) * T;
        F* da = datt + ((b * NH + h) * T + t) * T;
        F* dpre = dpreatt + ((b * NH + h) * T + t) * T;
        const F* q = qkv + (b * T + t) * 3 * C + h * hs;
        F* dq = dqkv + (b * T + t) * 3 * C + h * hs;
        const F* d = dout + (b * T + t) * C + h * hs;
        // Through the weighted sum of the values.
        for (size_t t2 = 0; t2 <= t; ++t2) {
          const F* v = qkv + (b * T + t2) * 3 * C + h * hs + 2 * C;
          F* dv = dqkv + (b * T + t2) * 3 * C + h * hs + 2 * C;
          for (size_t i = 0; i < hs; ++i) {
            da[t2] += v[i] * d[i];
            dv[i] += a[t2] * d[i];
          }
        }
        // Through the softmax: d pre[t3] = sum_t2 a[t2] (1{t2 = t3} - a[t3]) da[t2]
        // = a[t3] (da[t3] - sum_t2 a[t2] da[t2]): one pass, not t^2.
        F weighted = 0;
        for (size_t t2 = 0; t2 <= t; ++t2) weighted += a[t2] * da[t2];
        for (size_t t3 = 0; t3 <= t; ++t3) dpre[t3] += a[t3] * (da[t3] - weighted);
        // Through the scaled scores q . k.
        for (size_t t2 = 0; t2 <= t; ++t2) {
          const F* k = qkv + (b * T + t2) * 3 * C + h * hs + C;
          F* dk = dqkv + (b * T + t2) * 3 * C + h * hs + C;
          for (size_t i = 0; i < hs; ++i) {
            dq[i] += k[i] * dpre[t2] * scale;
            dk[i] += q[i] * dpre[t2] * scale;
          }
        }
      }
    }
  }
}

namespace {
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;
}  // namespace

template <typename F>
void gelu_forward(F* out, const F* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    F x = inp[i];
    F cube = static_cast<F>(kGeluCubic) * x * x * x;
    out[i] = F(0.5) * x * (F(1) + std::tanh(static_cast<F>(kGeluScale) * (x + cube)));
  }
}

template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    F x = inp[i];
    F cube = static_cast<F>(kGeluCubic) * x * x * x;
    F arg = static_cast<F>(kGeluScale) * (x + cube);
    F th = std::tanh(arg);
    F sech2 = F(1) - th * th;
    F local = F(0.5) * (F(1) + th) +
              x * F(0.5) * sech2 * static_cast<F>(kGeluScale) * (F(1) + F(3) * static_cast<F>(kGeluCubic) * x * x);
    dinp[i] += local * dout[i];
  }
}

template <typename F>
void residual_forward(F* out, const F* a, const F* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename F>
void residual_backward(F* da, F* db, const F* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

template <typename F>
void softmax_forward(F* probs, const F* logits, size_t N, size_t V) {
  for (size_t n = 0; n < N; ++n) {
    const F* l = logits + n * V;
    F* p = probs + n * V;
    F maxval = *std::max_element(l, l + V);
    F sum = 0;
    for (size_t v = 0; v < V; ++v) {
      p[v] = std::exp(l[v] - maxval);
      sum += p[v];
    }
    for (size_t v = 0; v < V; ++v) p[v] /= sum;
  }
}

template <typename F>
void crossentropy_forward(F* losses, const F* probs, const int32_t* targets, size_t N, size_t V) {
  for (size_t n = 0; n < N; ++n) losses[n] = -std::log(probs[n * V + static_cast<size_t>(targets[n])]);
}

template <typename F>
void crossentropy_softmax_backward(F* dlogits, const F* dlosses, const F* probs, const int32_t* targets, size_t N,
                                   size_t V) {
  for (size_t n = 0; n < N; ++n) {
    const F* p = probs + n * V;
    F* dl = dlogits + n * V;
    size_t target = static_cast<size_t>(targets[n]);
    for (size_t v = 0; v < V; ++v) dl[v] += (p[v] - (v == target ? F(1) : F(0))) * dlosses[n];
  }
}

// The model runs in float; the tests check gradients in double.
#define TROUPE_RL_KERNELS(F)                                                                                       \
  template void encoder_forward<F>(F*, const int32_t*, const F*, const F*, size_t, size_t, size_t);                \
  template void encoder_backward<F>(F*, F*, const F*, const int32_t*, size_t, size_t, size_t);                     \
  template void layernorm_forward<F>(F*, F*, F*, const F*, const F*, const F*, size_t, size_t);                    \
  template void layernorm_backward<F>(F*, F*, F*, const F*, const F*, const F*, const F*, const F*, size_t,        \
                                      size_t);                                                                     \
  template void matmul_forward<F>(F*, const F*, const F*, const F*, size_t, size_t, size_t);                       \
  template void matmul_backward<F>(F*, F*, F*, const F*, const F*, const F*, size_t, size_t, size_t);              \
  template void attention_forward<F>(F*, F*, F*, const F*, size_t, size_t, size_t, size_t);                        \
  template void attention_backward<F>(F*, F*, F*, const F*, const F*, const F*, size_t, size_t, size_t, size_t);   \
  template void gelu_forward<F>(F*, const F*, size_t);                                                             \
  template void gelu_backward<F>(F*, const F*, const F*, size_t);                                                  \
  template void residual_forward<F>(F*, const F*, const F*, size_t);                                               \
  template void residual_backward<F>(F*, F*, const F*, size_t);                                                    \
  template void softmax_forward<F>(F*, const F*, size_t, size_t);                                                  \
  template void crossentropy_forward<F>(F*, const F*, const int32_t*, size_t, size_t);                             \
  template void crossentropy_softmax_backward<F>(F*, const F*, const F*, const int32_t*, size_t, size_t);
TROUPE_RL_KERNELS(float)
TROUPE_RL_KERNELS(double)
#undef TROUPE_RL_KERNELS

}  // namespace troupe::rl::model
