// The layers of the policy model as plain functions over plain buffers
// (llm.c's style): each forward writes its outputs, each backward ADDS into
// the gradient buffers it is given (so a gradient shared by several uses,
// like a residual stream, accumulates) unless told to write its input's
// gradient (Grad::write: no zeroing first), and every buffer's shape is in
// the comment, row-major, with
//
//   B batch, T time (positions), C channels, NH heads, hs = C / NH,
//   OC output channels, V vocabulary, N rows (B * T where flattened).
//
// Every kernel is a template on the scalar type, instantiated for float (the
// model) and double (the reference the tests check gradients against by
// finite differences). Matrix products go to BLAS (OpenBLAS's sgemm/dgemm);
// the rest are vectorised loops. Each kernel splits its work over the
// compute threads (threads.h) in ranges that depend only on the sizes and
// the thread count, so results are reproducible at a given thread count.
// No allocation, no I/O.
//
// Float is computed with float's own rounding except where that loses
// digits the model needs (LayerNorm's statistics, in double); exp is a
// polynomial within 2 ulp of the exact value (std::exp for double, so the
// finite-difference checks stay exact).
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe::rl::model {

/// What a backward does with the input gradient buffer it is given: add to
/// it (the default: a gradient with several uses accumulates), or write it
/// (the buffer's only writer: it need not be zeroed first).
enum class Grad { add, write };

/// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
/// out (B,T,C), tokens (B,T) each < V, wte (V,C), wpe (>= T, C).
template <typename F>
void encoder_forward(F* out, const int32_t* tokens, const F* wte, const F* wpe, size_t B, size_t T, size_t C);
/// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:].
template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, size_t B, size_t T, size_t C);

/// Layer normalisation of each of N rows of C: out = (x - mean) * rstd *
/// weight + bias, with rstd = 1 / sqrt(var + 1e-5); mean and rstd (N) are
/// kept for the backward.
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias, size_t N, size_t C);
/// dinp (N,C) += (or = by `mode`), dweight (C) and dbias (C) += the
/// gradients for dout (N,C).
template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, const F* mean,
                        const F* rstd, size_t N, size_t C, Grad mode = Grad::add);

/// out (N,OC) = inp (N,C) x weight (OC,C)^T + bias (OC; may be null).
template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, size_t N, size_t C, size_t OC);
/// The same product, batch-invariant: each row's output has the same bits
/// whatever N and the other rows are (matmul_forward's do not: BLAS picks
/// its kernels by the product's shape, and OpenBLAS's rows differ from 8
/// rows up), so continuous batching (sequences joining and leaving a decode
/// step) never changes a sequence's log-probabilities. Each element's
/// operations are fixed (invariant_matmul.cc); not BLAS's speed.
void matmul_forward_invariant(float* out, const float* inp, const float* weight, const float* bias, size_t N, size_t C,
                              size_t OC);
/// Internal (tests): the same product by one ISA's code path (0: SSE2, 1:
/// AVX2, 2: AVX-512; every path gives the same bits). False, and nothing
/// written, when this machine lacks that ISA.
bool matmul_forward_invariant_on(int isa, float* out, const float* inp, const float* weight, const float* bias,
                                 size_t N, size_t C, size_t OC);
/// dinp (N,C) += (or = by `mode`) dout x weight; dweight (OC,C) += dout^T
/// x inp; dbias (OC) += column sums of dout (when not null).
template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, size_t N, size_t C,
                     size_t OC, Grad mode = Grad::add);

/// Causal multi-head self-attention. qkv (B,T,3C) holds q, k and v of
/// each position side by side; out (B,T,C). preatt and att (B,NH,T,T) keep
/// the scaled scores and their softmax (position t attends to 0..t) for
/// the backward; entries above the diagonal are left zero.
template <typename F>
void attention_forward(F* out, F* preatt, F* att, const F* qkv, size_t B, size_t T, size_t C, size_t NH);
/// dqkv (B,T,3C) += (or = by `mode`) the gradient for dout (B,T,C);
/// dpreatt and datt (B,NH,T,T) are scratch (overwritten; their contents
/// need not be zero).
template <typename F>
void attention_backward(F* dqkv, F* dpreatt, F* datt, const F* dout, const F* qkv, const F* att, size_t B, size_t T,
                        size_t C, size_t NH, Grad mode = Grad::add);

/// GELU, tanh approximation (GPT-2's), elementwise on n values.
template <typename F>
void gelu_forward(F* out, const F* inp, size_t n);
/// dinp += (or = by `mode`) gelu'(inp) * dout. With Grad::write, dinp may
/// be dout itself (the gradient in place).
template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n, Grad mode = Grad::add);

/// out = a + b, elementwise on n values.
template <typename F>
void residual_forward(F* out, const F* a, const F* b, size_t n);
/// da += dout; db += dout.
template <typename F>
void residual_backward(F* da, F* db, const F* dout, size_t n);

/// Row softmax of logits (N,V) into probs (N,V), numerically stable.
template <typename F>
void softmax_forward(F* probs, const F* logits, size_t N, size_t V);
/// losses[i] = -log probs[i, targets[i]] for each of N rows.
template <typename F>
void crossentropy_forward(F* losses, const F* probs, const int32_t* targets, size_t N, size_t V);
/// dlogits (N,V) += (or = by `mode`) (probs - onehot(targets)) *
/// dlosses[i]: the gradient of sum_i dlosses[i] * losses[i] through the
/// softmax.
template <typename F>
void crossentropy_softmax_backward(F* dlogits, const F* dlosses, const F* probs, const int32_t* targets, size_t N,
                                   size_t V, Grad mode = Grad::add);

/// The entropy of each of N rows' distribution, entropy[i] = -sum_v p log p
/// (N), from probs (N,V) = softmax(logits (N,V)); mean_logit[i] = sum_v p z
/// (N) is kept for the backward. Taken from the logits, never log p, so a
/// probability that underflowed to 0 costs nothing and gives no NaN.
template <typename F>
void entropy_forward(F* entropy, F* mean_logit, const F* probs, const F* logits, size_t N, size_t V);
/// dlogits (N,V) += (or = by `mode`) the gradient of sum_i dentropy[i] *
/// entropy[i] through the softmax: dH/dz = -p (log p + H) = -p (z -
/// mean_logit), scaled by dentropy[i] per row.
template <typename F>
void entropy_softmax_backward(F* dlogits, const F* dentropy, const F* probs, const F* logits, const F* mean_logit,
                              size_t N, size_t V, Grad mode = Grad::add);

}  // namespace troupe::rl::model
