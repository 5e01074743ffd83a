// Causal self-attention as one fused kernel each way (FlashAttention-2's
// tiling and online softmax): the (T,T) scores never reach device memory.
// The unfused path (gpt_cuda.cc) writes them, softmaxes them in place and
// reads them back, forward and backward: at GPT-2 small's shape that is
// 400 MB a layer each time, half of a bf16 training step's time on an H100,
// and B*NH*T*T floats of activations a layer.
//
// Products on bf16 tensor cores (WMMA, float32 accumulation); q, k, v and
// the softmax's probabilities are rounded to bf16 for them, as bf16
// training rounds every other product's inputs. The softmax itself, its
// statistics and every output are float32.
//
// Tiles of 64 queries by 64 keys, one block of 4 warps per (query tile,
// sequence, head) forward and per (key tile, sequence, head) backward;
// the backward recomputes each tile's probabilities from the forward's
// log-sum-exps and adds the queries' gradient with float atomics (so its
// last bits depend on the order the blocks ran in).
//
// Shapes as in kernels.cuh: B sequences of T positions, C channels in NH
// heads of hs = C / NH; qkv (B*T, 3C) holds q, k and v in its column
// thirds, row-major. Plain C++ may include this header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace troupe::rl::model::cuda {

/// Whether the fused kernels take heads of `head_size` on `device`: a
/// multiple of 16 up to 128, with the tiles fitting its shared memory.
bool flash_attention_supported(size_t head_size, int device);

/// atty (B*T, C) = the causal attention of qkv's queries over its keys and
/// values, head by head (scale 1/sqrt(hs)); lse (B*NH*T, index
/// (b*NH + h)*T + t) = each query's log-sum-exp of its scaled scores, for
/// the backward. invalid value for a head size not supported or B*NH past
/// 65535.
cudaError_t flash_attention_forward(float* atty, float* lse, const float* qkv, size_t B, size_t T, size_t NH,
                                    size_t C, cudaStream_t stream);

/// dqkv (B*T, 3C) = the gradient of qkv for dout (B*T, C) = d atty, from
/// the forward's qkv, atty and lse (written, =, all three column thirds).
/// scratch: B*NH*T floats.
cudaError_t flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* atty,
                                     const float* lse, float* scratch, size_t B, size_t T, size_t NH, size_t C,
                                     cudaStream_t stream);

}  // namespace troupe::rl::model::cuda
