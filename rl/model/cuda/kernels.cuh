// The policy model's layers on CUDA, the parts that are not matrix
// products (those go to cuBLAS, in gpt_cuda.cc): each function enqueues its
// kernel(s) on `stream` and returns the launch's error (cudaGetLastError;
// faults while running show at the next synchronisation). Shapes as in
// model/kernels.h, row-major:
//
//   B batch, T time, C channels, NH heads, OC output channels, V vocabulary,
//   N rows (B * T where flattened).
//
// Unlike the CPU kernels, the backwards here write (=) their activation
// gradients unless the comment says "+=": gpt_cuda.cc reuses one scratch
// buffer per shape instead of zeroing a gradient per activation. Parameter
// gradients always accumulate (+=), as on the CPU. Reductions over rows
// (bias and LayerNorm parameter gradients, the gradient norm) are two-pass
// and deterministic; only encoder_backward's token-embedding gradient uses
// atomics (two positions may hold the same token).
//
// Plain C++ callers may include this header (cuda_runtime_api.h and
// cuda_bf16.h are host-compilable); the definitions are in kernels.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace troupe::rl::model::cuda {

/// out (N,C) = wte[tokens[n]] + wpe[n % T]. tokens (B,T) each < V.
cudaError_t encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, size_t B, size_t T,
                            size_t C, cudaStream_t stream);
/// dwte[tokens[n]] += dout[n]; dwpe[t] += sum over b of dout[b,t].
cudaError_t encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, size_t B, size_t T,
                             size_t C, cudaStream_t stream);

/// LayerNorm of N rows of C (eps 1e-5); mean and rstd (N) kept.
cudaError_t layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                              const float* bias, size_t N, size_t C, cudaStream_t stream);
/// dinp (N,C) += the input gradient; dweight, dbias (C) += theirs.
/// scratch: column_reduce_scratch_floats(C) floats.
cudaError_t layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* weight, const float* mean, const float* rstd, size_t N, size_t C,
                               float* scratch, cudaStream_t stream);

/// Floats of scratch the column reductions (bias_backward,
/// layernorm_backward) need for `cols` columns.
size_t column_reduce_scratch_floats(size_t cols);
/// dbias (OC) += the column sums of dout (N,OC).
cudaError_t bias_backward(float* dbias, const float* dout, size_t N, size_t OC, float* scratch, cudaStream_t stream);

/// out (N,OC) += bias (OC) on every row.
cudaError_t add_bias(float* out, const float* bias, size_t N, size_t OC, cudaStream_t stream);
/// pre (N,OC) += bias; out = gelu(pre) (tanh approximation).
cudaError_t add_bias_gelu(float* pre, float* out, const float* bias, size_t N, size_t OC, cudaStream_t stream);
/// out (N,C) = residual + (x + bias): a projection's bias and the residual
/// connection after it, in one pass.
cudaError_t add_bias_residual(float* out, const float* residual, const float* x, const float* bias, size_t N, size_t C,
                              cudaStream_t stream);
/// d (n) = gelu'(inp) * d, in place.
cudaError_t gelu_backward_inplace(float* d, const float* inp, size_t n, cudaStream_t stream);

/// In place on the scores att (rows, T), rows = B*NH*T and row r the query
/// position r % T: the softmax over positions 0..t, zero above.
cudaError_t causal_softmax_forward(float* att, size_t rows, size_t T, cudaStream_t stream);
/// In place on datt (rows, T): the gradient of the scores for the gradient
/// of their softmax att (rows, T); zero above the diagonal.
cudaError_t causal_softmax_backward(float* datt, const float* att, size_t rows, size_t T, cudaStream_t stream);

/// Per row of logits (N,V): lse = log sum exp, losses = lse - logit[target].
cudaError_t crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, size_t N,
                                 size_t V, cudaStream_t stream);
/// dlogits (N,V) = (softmax(logits) - onehot(target)) * dlosses, the
/// softmax recomputed from logits and lse.
cudaError_t crossentropy_backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets,
                                  const float* dlosses, size_t N, size_t V, cudaStream_t stream);

// -- the inference path (GptCuda::decode): rows of (slot, position, token)
// against a KV cache of (slots, Tmax, C) per layer; `rows` is a device
// array of 3n ints: the n slots, then the n positions, then the n tokens.

/// out (n,C) = wte[token_i] + wpe[position_i].
cudaError_t decode_encoder(float* out, const int32_t* rows, const float* wte, const float* wpe, size_t n, size_t C,
                           cudaStream_t stream);
/// Caches row i's key and value (columns C..2C and 2C..3C of qkv (n,3C))
/// at (slot_i, position_i) of one layer's `keys` and `values`.
cudaError_t kv_store(float* keys, float* values, const float* qkv, const int32_t* rows, size_t n, size_t C, size_t Tmax,
                     cudaStream_t stream);
/// The largest Tmax decode_attention takes (its scores live in shared memory).
size_t decode_attention_max_positions();
/// atty (n,C): for row i and head h, softmax(q . k_t / sqrt(hs)) over
/// positions t = 0..position_i of slot_i's cached keys, times their values
/// (q: qkv's row i, columns h*hs..(h+1)*hs). invalid value past
/// decode_attention_max_positions().
cudaError_t decode_attention(float* atty, const float* qkv, const float* keys, const float* values,
                             const int32_t* rows, size_t n, size_t NH, size_t C, size_t Tmax, cudaStream_t stream);

/// out (n) = in rounded to bfloat16 (nearest even).
cudaError_t to_bf16(__nv_bfloat16* out, const float* in, size_t n, cudaStream_t stream);

/// Doubles of scratch sum_of_squares needs.
size_t sum_of_squares_scratch_doubles();
/// *out (device) = sum of x[i]^2, accumulated in double.
cudaError_t sum_of_squares(double* out, const float* x, size_t n, double* scratch, cudaStream_t stream);

/// One AdamW step's scalars, computed on the host as model/adamw.cc does.
struct AdamWScalars {
  float learning_rate, beta1, beta2, correction1, correction2, eps, weight_decay;
  /// Gradients are multiplied by grad_scale (and stored so) when clip.
  float grad_scale;
  bool clip;
};
/// The AdamW update of n parameters in place; decay[i] != 0 where weight
/// decay applies.
cudaError_t adamw_update(float* params, float* grads, float* m, float* v, const uint8_t* decay, size_t n,
                         const AdamWScalars& s, cudaStream_t stream);

}  // namespace troupe::rl::model::cuda
