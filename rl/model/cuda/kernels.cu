// The CUDA kernels of kernels.cuh. Every kernel loops grid-stride over its
// rows or elements, so a launch's grid is a performance choice only, capped
// well inside the hardware's limits, and no index is computed in 32 bits.
#include "kernels.cuh"
#include "warp_reduce.cuh"

#include <algorithm>
#include <cmath>

namespace troupe::rl::model::cuda {
namespace {

constexpr unsigned kThreads = 256;  // per block, a multiple of kWarp
constexpr size_t kMaxBlocks = size_t{1} << 16;
constexpr size_t kMaxGridY = 65535;  // the hardware's limit on gridDim.y
constexpr float kLayerNormEps = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// Column reductions: rows are split into at most kMaxChunks chunks of at
// least kMinChunkRows, one partial sum per (chunk, column), then summed.
constexpr size_t kMaxChunks = 128;
constexpr size_t kMinChunkRows = 32;
constexpr unsigned kReduceRowThreads = 8;  // threads along rows per 32 columns

constexpr unsigned kNormBlocks = 512;

unsigned blocks_for(size_t n, size_t per_block) {
  return static_cast<unsigned>(std::clamp<size_t>((n + per_block - 1) / per_block, 1, kMaxBlocks));
}

// Threads for a row of `cols`: a warp multiple, at most kThreads.
unsigned threads_for_cols(size_t cols) {
  size_t t = (cols + kWarp - 1) / kWarp * kWarp;
  return static_cast<unsigned>(std::clamp<size_t>(t, kWarp, kThreads));
}

// A grid for row_col kernels: x over columns, y over rows (grid-stride both).
dim3 row_col_grid(size_t rows, size_t cols, unsigned threads) {
  size_t x = std::clamp<size_t>((cols + threads - 1) / threads, 1, 1024);
  size_t y = std::clamp<size_t>(rows, 1, kMaxGridY);
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y));
}

size_t chunks_for(size_t rows) { return std::clamp<size_t>((rows + kMinChunkRows - 1) / kMinChunkRows, 1, kMaxChunks); }

// Sum (or max) over the block; every thread gets the result. REQUIRES:
// blockDim.x a multiple of kWarp, all threads of the block call it.
template <class T, bool kMax>
__device__ T block_reduce(T v) {
  __shared__ T partial[kWarp];
  const unsigned lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  if constexpr (kMax) {
    v = warp_max(v);
  } else {
    v = warp_sum(v);
  }
  __syncthreads();  // the previous call's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if constexpr (kMax) {
    T r = lane < warps ? partial[lane] : -INFINITY;
    return warp_max(r);
  } else {
    T r = lane < warps ? partial[lane] : T(0);
    return warp_sum(r);
  }
}

// One warp per row: the warp's first row and the stride between its rows.
struct WarpRows {
  size_t first, stride;
  unsigned lane;
};
__device__ WarpRows warp_rows() {
  const unsigned warps = blockDim.x / kWarp;
  return {static_cast<size_t>(blockIdx.x) * warps + threadIdx.x / kWarp, static_cast<size_t>(gridDim.x) * warps,
          threadIdx.x % kWarp};
}

__device__ float gelu(float x) {
  float cube = kGeluCubic * x * x * x;
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + cube)));
}

__device__ float gelu_grad(float x) {
  float cube = kGeluCubic * x * x * x;
  float th = tanhf(kGeluScale * (x + cube));
  float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

// -- kernels --------------------------------------------------------------------

__global__ void encoder_forward_kernel(float* out, const int32_t* tokens, const float* wte, const float* wpe, size_t N,
                                       size_t T, size_t C) {
  for (size_t n = blockIdx.y; n < N; n += gridDim.y) {
    const float* te = wte + static_cast<size_t>(tokens[n]) * C;
    const float* pe = wpe + (n % T) * C;
    for (size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C;
         c += static_cast<size_t>(gridDim.x) * blockDim.x) {
      out[n * C + c] = te[c] + pe[c];
    }
  }
}

__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int32_t* tokens, size_t N, size_t C) {
  for (size_t n = blockIdx.y; n < N; n += gridDim.y) {
    float* dte = dwte + static_cast<size_t>(tokens[n]) * C;
    for (size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C;
         c += static_cast<size_t>(gridDim.x) * blockDim.x) {
      atomicAdd(dte + c, dout[n * C + c]);
    }
  }
}

__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, size_t B, size_t T, size_t C) {
  for (size_t t = blockIdx.y; t < T; t += gridDim.y) {
    for (size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C;
         c += static_cast<size_t>(gridDim.x) * blockDim.x) {
      float s = 0;
      for (size_t b = 0; b < B; ++b) s += dout[(b * T + t) * C + c];
      dwpe[t * C + c] += s;
    }
  }
}

// The statistics and the normalisation in double, the output rounded once,
// as the CPU model does (model/kernels.cc: the residual stream's values can
// be large against their spread, and float's x - mean then loses digits).
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                         const float* bias, size_t N, size_t C) {
  const WarpRows w = warp_rows();
  for (size_t row = w.first; row < N; row += w.stride) {
    const float* x = inp + row * C;
    double sum = 0;
    for (size_t i = w.lane; i < C; i += kWarp) sum += x[i];
    const double m = warp_sum(sum) / static_cast<double>(C);
    double var = 0;
    for (size_t i = w.lane; i < C; i += kWarp) {
      const double d = x[i] - m;
      var += d * d;
    }
    const double s = 1.0 / sqrt(warp_sum(var) / static_cast<double>(C) + kLayerNormEps);
    float* o = out + row * C;
    for (size_t i = w.lane; i < C; i += kWarp) o[i] = static_cast<float>((x[i] - m) * s * weight[i] + bias[i]);
    if (w.lane == 0) {
      mean[row] = static_cast<float>(m);
      rstd[row] = static_cast<float>(s);
    }
  }
}

__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                                const float* mean, const float* rstd, size_t N, size_t C) {
  const WarpRows w = warp_rows();
  for (size_t row = w.first; row < N; row += w.stride) {
    const float* d = dout + row * C;
    const float* x = inp + row * C;
    const float m = mean[row], s = rstd[row];
    float dnorm_mean = 0, dnorm_norm_mean = 0;
    for (size_t i = w.lane; i < C; i += kWarp) {
      float norm = (x[i] - m) * s;
      float dnorm = weight[i] * d[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean = warp_sum(dnorm_mean) / static_cast<float>(C);
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / static_cast<float>(C);
    float* dx = dinp + row * C;
    for (size_t i = w.lane; i < C; i += kWarp) {
      float norm = (x[i] - m) * s;
      float dnorm = weight[i] * d[i];
      dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

// Column partial sums: block (32, kReduceRowThreads), blockIdx.x a group of
// 32 columns, blockIdx.y a chunk of rows; partial (chunks, cols).
__global__ void bias_partial_kernel(float* partial, const float* dout, size_t N, size_t OC, size_t chunk_rows) {
  __shared__ float acc[kReduceRowThreads][kWarp + 1];
  const size_t col = static_cast<size_t>(blockIdx.x) * kWarp + threadIdx.x;
  const size_t r0 = static_cast<size_t>(blockIdx.y) * chunk_rows, r1 = r0 + chunk_rows < N ? r0 + chunk_rows : N;
  float s = 0;
  if (col < OC) {
    for (size_t r = r0 + threadIdx.y; r < r1; r += kReduceRowThreads) s += dout[r * OC + col];
  }
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < OC) {
    float total = 0;
    for (unsigned y = 0; y < kReduceRowThreads; ++y) total += acc[y][threadIdx.x];
    partial[blockIdx.y * OC + col] = total;
  }
}

__global__ void layernorm_partial_kernel(float* partial_w, float* partial_b, const float* dout, const float* inp,
                                         const float* mean, const float* rstd, size_t N, size_t C, size_t chunk_rows) {
  __shared__ float acc_w[kReduceRowThreads][kWarp + 1];
  __shared__ float acc_b[kReduceRowThreads][kWarp + 1];
  const size_t col = static_cast<size_t>(blockIdx.x) * kWarp + threadIdx.x;
  const size_t r0 = static_cast<size_t>(blockIdx.y) * chunk_rows, r1 = r0 + chunk_rows < N ? r0 + chunk_rows : N;
  float sw = 0, sb = 0;
  if (col < C) {
    for (size_t r = r0 + threadIdx.y; r < r1; r += kReduceRowThreads) {
      float d = dout[r * C + col];
      sw += (inp[r * C + col] - mean[r]) * rstd[r] * d;
      sb += d;
    }
  }
  acc_w[threadIdx.y][threadIdx.x] = sw;
  acc_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && col < C) {
    float tw = 0, tb = 0;
    for (unsigned y = 0; y < kReduceRowThreads; ++y) {
      tw += acc_w[y][threadIdx.x];
      tb += acc_b[y][threadIdx.x];
    }
    partial_w[blockIdx.y * C + col] = tw;
    partial_b[blockIdx.y * C + col] = tb;
  }
}

// out[col] += sum over chunks of partial[chunk, col].
__global__ void column_finish_kernel(float* out, const float* partial, size_t chunks, size_t cols) {
  for (size_t col = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < cols;
       col += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float s = 0;
    for (size_t c = 0; c < chunks; ++c) s += partial[c * cols + col];
    out[col] += s;
  }
}

__global__ void add_bias_kernel(float* out, const float* bias, size_t N, size_t OC) {
  for (size_t n = blockIdx.y; n < N; n += gridDim.y) {
    for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < OC;
         j += static_cast<size_t>(gridDim.x) * blockDim.x) {
      out[n * OC + j] += bias[j];
    }
  }
}

__global__ void add_bias_gelu_kernel(float* pre, float* out, const float* bias, size_t N, size_t OC) {
  for (size_t n = blockIdx.y; n < N; n += gridDim.y) {
    for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < OC;
         j += static_cast<size_t>(gridDim.x) * blockDim.x) {
      float x = pre[n * OC + j] + bias[j];
      pre[n * OC + j] = x;
      out[n * OC + j] = gelu(x);
    }
  }
}

__global__ void add_bias_residual_kernel(float* out, const float* residual, const float* x, const float* bias, size_t N,
                                         size_t C) {
  for (size_t n = blockIdx.y; n < N; n += gridDim.y) {
    for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < C;
         j += static_cast<size_t>(gridDim.x) * blockDim.x) {
      out[n * C + j] = residual[n * C + j] + (x[n * C + j] + bias[j]);
    }
  }
}

__global__ void gelu_backward_kernel(float* d, const float* inp, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    d[i] = gelu_grad(inp[i]) * d[i];
  }
}

// One warp per row of att; each element is read and written by one lane.
__global__ void causal_softmax_forward_kernel(float* att, size_t rows, size_t T) {
  const WarpRows w = warp_rows();
  for (size_t row = w.first; row < rows; row += w.stride) {
    float* a = att + row * T;
    const size_t t = row % T;
    float mx = -INFINITY;
    for (size_t t2 = w.lane; t2 <= t; t2 += kWarp) mx = fmaxf(mx, a[t2]);
    mx = warp_max(mx);
    float sum = 0;
    for (size_t t2 = w.lane; t2 <= t; t2 += kWarp) sum += expf(a[t2] - mx);
    sum = warp_sum(sum);
    for (size_t t2 = w.lane; t2 < T; t2 += kWarp) a[t2] = t2 <= t ? expf(a[t2] - mx) / sum : 0.0f;
  }
}

// dpre[t3] = att[t3] * (datt[t3] - sum_t2 att[t2] datt[t2]), in place.
__global__ void causal_softmax_backward_kernel(float* datt, const float* att, size_t rows, size_t T) {
  const WarpRows w = warp_rows();
  for (size_t row = w.first; row < rows; row += w.stride) {
    const float* a = att + row * T;
    float* d = datt + row * T;
    const size_t t = row % T;
    float weighted = 0;
    for (size_t t2 = w.lane; t2 <= t; t2 += kWarp) weighted += a[t2] * d[t2];
    weighted = warp_sum(weighted);
    for (size_t t2 = w.lane; t2 < T; t2 += kWarp) d[t2] = t2 <= t ? a[t2] * (d[t2] - weighted) : 0.0f;
  }
}

// One block per row.
__global__ void crossentropy_forward_kernel(float* losses, float* lse, const float* logits, const int32_t* targets,
                                            size_t N, size_t V) {
  for (size_t row = blockIdx.x; row < N; row += gridDim.x) {
    const float* l = logits + row * V;
    float mx = -INFINITY;
    for (size_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, l[v]);
    mx = block_reduce<float, true>(mx);
    float sum = 0;
    for (size_t v = threadIdx.x; v < V; v += blockDim.x) sum += expf(l[v] - mx);
    sum = block_reduce<float, false>(sum);
    if (threadIdx.x == 0) {
      const float z = mx + logf(sum);
      lse[row] = z;
      losses[row] = z - l[static_cast<size_t>(targets[row])];
    }
  }
}

__global__ void crossentropy_backward_kernel(float* dlogits, const float* logits, const float* lse,
                                             const int32_t* targets, const float* dlosses, size_t N, size_t V) {
  for (size_t row = blockIdx.x; row < N; row += gridDim.x) {
    const float* l = logits + row * V;
    float* dl = dlogits + row * V;
    const float z = lse[row], dloss = dlosses[row];
    const size_t target = static_cast<size_t>(targets[row]);
    for (size_t v = threadIdx.x; v < V; v += blockDim.x) {
      float p = expf(l[v] - z);
      dl[v] = (p - (v == target ? 1.0f : 0.0f)) * dloss;
    }
  }
}

__global__ void to_bf16_kernel(__nv_bfloat16* out, const float* in, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

__global__ void sum_of_squares_partial_kernel(double* partial, const float* x, size_t n) {
  double acc = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    double g = x[i];
    acc += g * g;
  }
  acc = block_reduce<double, false>(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sum_of_squares_finish_kernel(double* out, const double* partial, size_t count) {
  double acc = 0;
  for (size_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_reduce<double, false>(acc);
  if (threadIdx.x == 0) *out = acc;
}

// The same float operations, in the same order, as model/adamw.cc; nvcc
// fuses multiply-adds (--fmad), so the last bits may differ from the CPU's.
__global__ void adamw_kernel(float* params, float* grads, float* m, float* v, const uint8_t* decay, size_t n,
                             AdamWScalars s) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float g = grads[i];
    if (s.clip) {
      g *= s.grad_scale;
      grads[i] = g;
    }
    float mi = s.beta1 * m[i] + (1 - s.beta1) * g;
    float vi = s.beta2 * v[i] + (1 - s.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / s.correction1, vhat = vi / s.correction2;
    float p = params[i];
    params[i] = p - s.learning_rate * (mhat / (sqrtf(vhat) + s.eps) + (decay[i] != 0 ? s.weight_decay * p : 0.0f));
  }
}

// -- the inference path -----------------------------------------------------------

constexpr unsigned kDecodeThreads = 128;          // per (row, head) block of decode_attention
constexpr size_t kDecodeSharedBytes = 48 * 1024;  // a block's static + dynamic shared memory without opting in
// The static part: block_reduce's `partial` for the max and for the sum.
constexpr size_t kDecodeStaticShared = 2 * kWarp * sizeof(float);

__global__ void decode_encoder_kernel(float* out, const int32_t* rows, const float* wte, const float* wpe, size_t n,
                                      size_t C) {
  for (size_t i = blockIdx.y; i < n; i += gridDim.y) {
    const float* te = wte + static_cast<size_t>(rows[2 * n + i]) * C;
    const float* pe = wpe + static_cast<size_t>(rows[n + i]) * C;
    for (size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C;
         c += static_cast<size_t>(gridDim.x) * blockDim.x) {
      out[i * C + c] = te[c] + pe[c];
    }
  }
}

__global__ void kv_store_kernel(float* keys, float* values, const float* qkv, const int32_t* rows, size_t n, size_t C,
                                size_t Tmax) {
  for (size_t i = blockIdx.y; i < n; i += gridDim.y) {
    const size_t at = (static_cast<size_t>(rows[i]) * Tmax + static_cast<size_t>(rows[n + i])) * C;
    const float* src = qkv + i * 3 * C;
    for (size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C;
         c += static_cast<size_t>(gridDim.x) * blockDim.x) {
      keys[at + c] = src[C + c];
      values[at + c] = src[2 * C + c];
    }
  }
}

// One block per (row, head), grid-stride over them: the scores of the
// row's positions in shared memory, their softmax, then one thread per
// output channel of the head sums over the positions.
__global__ void decode_attention_kernel(float* atty, const float* qkv, const float* keys, const float* values,
                                        const int32_t* rows, size_t n, size_t NH, size_t C, size_t Tmax, float scale) {
  extern __shared__ float scores[];
  const size_t hs = C / NH;
  for (size_t pair = blockIdx.x; pair < n * NH; pair += gridDim.x) {
    const size_t i = pair / NH, h = pair % NH;
    const size_t len = static_cast<size_t>(rows[n + i]) + 1;
    const size_t base = static_cast<size_t>(rows[i]) * Tmax * C + h * hs;
    const float* q = qkv + i * 3 * C + h * hs;
    float local_max = -INFINITY;
    for (size_t t = threadIdx.x; t < len; t += blockDim.x) {
      const float* k = keys + base + t * C;
      float dot = 0;
      for (size_t d = 0; d < hs; ++d) dot += q[d] * k[d];
      dot *= scale;
      scores[t] = dot;
      local_max = fmaxf(local_max, dot);
    }
    const float mx = block_reduce<float, true>(local_max);
    float local_sum = 0;
    for (size_t t = threadIdx.x; t < len; t += blockDim.x) {
      const float e = expf(scores[t] - mx);
      scores[t] = e;
      local_sum += e;
    }
    const float inv = 1.0f / block_reduce<float, false>(local_sum);  // its barriers publish `scores`
    for (size_t d = threadIdx.x; d < hs; d += blockDim.x) {
      const float* v = values + base + d;
      float acc = 0;
      for (size_t t = 0; t < len; ++t) acc += scores[t] * v[t * C];
      atty[i * C + h * hs + d] = acc * inv;
    }
    __syncthreads();  // every reader is done with `scores` before the next pair writes them
  }
}

}  // namespace

// -- launchers --------------------------------------------------------------------

cudaError_t encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, size_t B, size_t T,
                            size_t C, cudaStream_t stream) {
  unsigned threads = threads_for_cols(C);
  encoder_forward_kernel<<<row_col_grid(B * T, C, threads), threads, 0, stream>>>(out, tokens, wte, wpe, B * T, T, C);
  return cudaGetLastError();
}

cudaError_t encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, size_t B, size_t T,
                             size_t C, cudaStream_t stream) {
  unsigned threads = threads_for_cols(C);
  encoder_backward_wte_kernel<<<row_col_grid(B * T, C, threads), threads, 0, stream>>>(dwte, dout, tokens, B * T, C);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  encoder_backward_wpe_kernel<<<row_col_grid(T, C, threads), threads, 0, stream>>>(dwpe, dout, B, T, C);
  return cudaGetLastError();
}

cudaError_t layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                              const float* bias, size_t N, size_t C, cudaStream_t stream) {
  layernorm_forward_kernel<<<blocks_for(N, kThreads / kWarp), kThreads, 0, stream>>>(out, mean, rstd, inp, weight, bias,
                                                                                     N, C);
  return cudaGetLastError();
}

size_t column_reduce_scratch_floats(size_t cols) { return 2 * kMaxChunks * cols; }

cudaError_t layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* weight, const float* mean, const float* rstd, size_t N, size_t C,
                               float* scratch, cudaStream_t stream) {
  layernorm_backward_input_kernel<<<blocks_for(N, kThreads / kWarp), kThreads, 0, stream>>>(dinp, dout, inp, weight,
                                                                                            mean, rstd, N, C);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const size_t chunks = chunks_for(N), chunk_rows = (N + chunks - 1) / chunks;
  float* partial_w = scratch;
  float* partial_b = scratch + chunks * C;
  dim3 grid(static_cast<unsigned>((C + kWarp - 1) / kWarp), static_cast<unsigned>(chunks));
  layernorm_partial_kernel<<<grid, dim3(kWarp, kReduceRowThreads), 0, stream>>>(partial_w, partial_b, dout, inp, mean,
                                                                                rstd, N, C, chunk_rows);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  column_finish_kernel<<<blocks_for(C, kThreads), kThreads, 0, stream>>>(dweight, partial_w, chunks, C);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  column_finish_kernel<<<blocks_for(C, kThreads), kThreads, 0, stream>>>(dbias, partial_b, chunks, C);
  return cudaGetLastError();
}

cudaError_t bias_backward(float* dbias, const float* dout, size_t N, size_t OC, float* scratch, cudaStream_t stream) {
  const size_t chunks = chunks_for(N), chunk_rows = (N + chunks - 1) / chunks;
  dim3 grid(static_cast<unsigned>((OC + kWarp - 1) / kWarp), static_cast<unsigned>(chunks));
  bias_partial_kernel<<<grid, dim3(kWarp, kReduceRowThreads), 0, stream>>>(scratch, dout, N, OC, chunk_rows);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  column_finish_kernel<<<blocks_for(OC, kThreads), kThreads, 0, stream>>>(dbias, scratch, chunks, OC);
  return cudaGetLastError();
}

cudaError_t add_bias(float* out, const float* bias, size_t N, size_t OC, cudaStream_t stream) {
  unsigned threads = threads_for_cols(OC);
  add_bias_kernel<<<row_col_grid(N, OC, threads), threads, 0, stream>>>(out, bias, N, OC);
  return cudaGetLastError();
}

cudaError_t add_bias_gelu(float* pre, float* out, const float* bias, size_t N, size_t OC, cudaStream_t stream) {
  unsigned threads = threads_for_cols(OC);
  add_bias_gelu_kernel<<<row_col_grid(N, OC, threads), threads, 0, stream>>>(pre, out, bias, N, OC);
  return cudaGetLastError();
}

cudaError_t add_bias_residual(float* out, const float* residual, const float* x, const float* bias, size_t N, size_t C,
                              cudaStream_t stream) {
  unsigned threads = threads_for_cols(C);
  add_bias_residual_kernel<<<row_col_grid(N, C, threads), threads, 0, stream>>>(out, residual, x, bias, N, C);
  return cudaGetLastError();
}

cudaError_t gelu_backward_inplace(float* d, const float* inp, size_t n, cudaStream_t stream) {
  gelu_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(d, inp, n);
  return cudaGetLastError();
}

cudaError_t causal_softmax_forward(float* att, size_t rows, size_t T, cudaStream_t stream) {
  causal_softmax_forward_kernel<<<blocks_for(rows, kThreads / kWarp), kThreads, 0, stream>>>(att, rows, T);
  return cudaGetLastError();
}

cudaError_t causal_softmax_backward(float* datt, const float* att, size_t rows, size_t T, cudaStream_t stream) {
  causal_softmax_backward_kernel<<<blocks_for(rows, kThreads / kWarp), kThreads, 0, stream>>>(datt, att, rows, T);
  return cudaGetLastError();
}

cudaError_t crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, size_t N,
                                 size_t V, cudaStream_t stream) {
  crossentropy_forward_kernel<<<blocks_for(N, 1), kThreads, 0, stream>>>(losses, lse, logits, targets, N, V);
  return cudaGetLastError();
}

cudaError_t crossentropy_backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets,
                                  const float* dlosses, size_t N, size_t V, cudaStream_t stream) {
  crossentropy_backward_kernel<<<blocks_for(N, 1), kThreads, 0, stream>>>(dlogits, logits, lse, targets, dlosses, N, V);
  return cudaGetLastError();
}

cudaError_t decode_encoder(float* out, const int32_t* rows, const float* wte, const float* wpe, size_t n, size_t C,
                           cudaStream_t stream) {
  const unsigned threads = threads_for_cols(C);
  decode_encoder_kernel<<<row_col_grid(n, C, threads), threads, 0, stream>>>(out, rows, wte, wpe, n, C);
  return cudaGetLastError();
}

cudaError_t kv_store(float* keys, float* values, const float* qkv, const int32_t* rows, size_t n, size_t C, size_t Tmax,
                     cudaStream_t stream) {
  const unsigned threads = threads_for_cols(C);
  kv_store_kernel<<<row_col_grid(n, C, threads), threads, 0, stream>>>(keys, values, qkv, rows, n, C, Tmax);
  return cudaGetLastError();
}

size_t decode_attention_max_positions() { return (kDecodeSharedBytes - kDecodeStaticShared) / sizeof(float); }

cudaError_t decode_attention(float* atty, const float* qkv, const float* keys, const float* values,
                             const int32_t* rows, size_t n, size_t NH, size_t C, size_t Tmax, cudaStream_t stream) {
  if (Tmax > decode_attention_max_positions() || NH == 0) return cudaErrorInvalidValue;
  const float scale = 1.0f / sqrtf(static_cast<float>(C / NH));
  decode_attention_kernel<<<blocks_for(n * NH, 1), kDecodeThreads, Tmax * sizeof(float), stream>>>(
      atty, qkv, keys, values, rows, n, NH, C, Tmax, scale);
  return cudaGetLastError();
}

cudaError_t to_bf16(__nv_bfloat16* out, const float* in, size_t n, cudaStream_t stream) {
  to_bf16_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  return cudaGetLastError();
}

size_t sum_of_squares_scratch_doubles() { return kNormBlocks; }

cudaError_t sum_of_squares(double* out, const float* x, size_t n, double* scratch, cudaStream_t stream) {
  sum_of_squares_partial_kernel<<<kNormBlocks, kThreads, 0, stream>>>(scratch, x, n);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  sum_of_squares_finish_kernel<<<1, kThreads, 0, stream>>>(out, scratch, kNormBlocks);
  return cudaGetLastError();
}

cudaError_t adamw_update(float* params, float* grads, float* m, float* v, const uint8_t* decay, size_t n,
                         const AdamWScalars& s, cudaStream_t stream) {
  adamw_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(params, grads, m, v, decay, n, s);
  return cudaGetLastError();
}

}  // namespace troupe::rl::model::cuda
