// The fused causal attention of flash_attention.cuh.
//
// Each warp owns 16 rows of a 64-row tile: the rows of the scores it
// computes, softmaxes and multiplies on (queries forward; queries for the
// scores and keys for dK and dV backward). Shared memory holds the tiles
// in bf16 (the products' inputs, rows padded by 8 so that WMMA's loads
// spread over the banks) and the float32 scores and accumulators (padded
// by 4). Every WMMA pointer is 32-byte aligned: row pitches are multiples
// of 16 bytes and fragments start on 16-row, 16-column boundaries.
#include "flash_attention.cuh"
#include "warp_reduce.cuh"

#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace troupe::rl::model::cuda {
namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;

constexpr int kTile = 64;  // queries and keys per tile
constexpr int kFrag = 16;  // WMMA's m, n and k
constexpr int kWarps = kTile / kFrag;
constexpr int kBlockThreads = kWarps * kWarp;
constexpr int kPadH = 8;                  // bf16 row padding, elements
constexpr int kPadF = 4;                  // float row padding, elements
constexpr int kLdP = kTile + kPadH;       // a (64,64) bf16 tile's pitch
constexpr int kLdS = kTile + kPadF;       // a (64,64) float tile's pitch
constexpr size_t kMaxHeadSize = 128;
constexpr size_t kMaxGridY = 65535;

using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, bf16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

/// Shared memory of the forward: Q, K, V (bf16, 64 x ldh), P (bf16, 64 x
/// kLdP), S (float, 64 x kLdS), O (float, 64 x ldf), then the rows' running
/// max and sum.
size_t forward_shared_bytes(size_t D) {
  const size_t ldh = D + kPadH, ldf = D + kPadF;
  return 3 * kTile * ldh * sizeof(bf16) + kTile * kLdP * sizeof(bf16) + kTile * kLdS * sizeof(float) +
         kTile * ldf * sizeof(float) + 2 * kTile * sizeof(float);
}

/// Shared memory of the backward: K, V, Q, dO (bf16, 64 x ldh), P and dS
/// (bf16, 64 x kLdP), S (float, 64 x kLdS), dK and dV (float, 64 x ldf),
/// the rows' log-sum-exps and D, and one 16 x 16 float scratch per warp.
size_t backward_shared_bytes(size_t D) {
  const size_t ldh = D + kPadH, ldf = D + kPadF;
  return 4 * kTile * ldh * sizeof(bf16) + 2 * kTile * kLdP * sizeof(bf16) + kTile * kLdS * sizeof(float) +
         2 * kTile * ldf * sizeof(float) + 2 * kTile * sizeof(float) + kWarps * kFrag * kFrag * sizeof(float);
}

/// dst (64 x D, pitch D + kPadH) = rows first..first+63 of src (row
/// stride `stride` floats), rounded to bf16; rows at or past T are zeros.
/// D is a multiple of 16 and src 16-byte aligned, so rows load as float4s.
template <int D>
__device__ void load_tile(bf16* dst, const float* src, size_t stride, int first, int T) {
  constexpr int kQuads = D / 4, kLd = D + kPadH;
  for (int idx = threadIdx.x; idx < kTile * kQuads; idx += kBlockThreads) {
    const int row = idx / kQuads, col = (idx % kQuads) * 4;
    const int t = first + row;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < T) v = *reinterpret_cast<const float4*>(src + static_cast<size_t>(t) * stride + col);
    auto* out = reinterpret_cast<__nv_bfloat162*>(dst + row * kLd + col);
    out[0] = __floats2bfloat162_rn(v.x, v.y);
    out[1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

/// S (16 x 64 at s, pitch kLdS) = A (16 x D at a) x B^T, B the 64 x D tile
/// at b: one warp's rows of a tile's scores (bf16 operands of pitch D + kPadH).
template <int D>
__device__ void rows_times_tile_t(float* s, const bf16* a, const bf16* b) {
  constexpr int kLd = D + kPadH;
  FragA fa[D / kFrag];
#pragma unroll
  for (int k = 0; k < D / kFrag; ++k) wmma::load_matrix_sync(fa[k], a + k * kFrag, kLd);
#pragma unroll
  for (int n = 0; n < kTile / kFrag; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < D / kFrag; ++k) {
      FragBT fb;
      wmma::load_matrix_sync(fb, b + n * kFrag * kLd + k * kFrag, kLd);
      wmma::mma_sync(acc, fa[k], fb, acc);
    }
    wmma::store_matrix_sync(s + n * kFrag, acc, kLdS, wmma::mem_row_major);
  }
}

/// acc (16 x D at acc, float, pitch D + kPadF) += A^T x B: A the 64 x 16
/// columns at a (bf16, pitch kLdP), B the 64 x D tile at b (bf16, pitch
/// D + kPadH). A^T's fragments are loaded once for every column block.
template <int D>
__device__ void rows_t_times_tile(float* acc, const bf16* a, const bf16* b) {
  constexpr int kLdH = D + kPadH, kLdF = D + kPadF;
  FragAT fa[kTile / kFrag];
#pragma unroll
  for (int k = 0; k < kTile / kFrag; ++k) wmma::load_matrix_sync(fa[k], a + k * kFrag * kLdP, kLdP);
#pragma unroll
  for (int n = 0; n < D / kFrag; ++n) {
    FragC c;
    wmma::load_matrix_sync(c, acc + n * kFrag, kLdF, wmma::mem_row_major);
#pragma unroll
    for (int k = 0; k < kTile / kFrag; ++k) {
      FragB fb;
      wmma::load_matrix_sync(fb, b + k * kFrag * kLdH + n * kFrag, kLdH);
      wmma::mma_sync(c, fa[k], fb, c);
    }
    wmma::store_matrix_sync(acc + n * kFrag, c, kLdF, wmma::mem_row_major);
  }
}

/// A row-half of a warp's 16 rows of a (64,64) float tile: lane l takes row
/// l % 16 and columns (l / 16) * 32.. +32, so that a row's two halves are
/// lanes l and l ^ 16, and the eight lanes of each 16-byte load phase read
/// eight rows (banks 4 apart with kLdS's padding: no conflicts).
struct RowHalf {
  int row;  // in the warp's 16
  int col;  // the first of the lane's 32 columns
};
__device__ RowHalf row_half(int lane) { return {lane % kFrag, (lane / kFrag) * static_cast<int>(kWarp)}; }

/// v[0..32) = the lane's 32 floats at `src`, loaded as float4s.
__device__ void load_row_half(float (&v)[kWarp], const float* src) {
#pragma unroll
  for (int j = 0; j < kWarp; j += 4) {
    const float4 x = *reinterpret_cast<const float4*>(src + j);
    v[j] = x.x;
    v[j + 1] = x.y;
    v[j + 2] = x.z;
    v[j + 3] = x.w;
  }
}

/// dst[0..32) = v rounded to bf16, stored as pairs.
__device__ void store_row_half(bf16* dst, const float (&v)[kWarp]) {
#pragma unroll
  for (int j = 0; j < kWarp; j += 2) {
    *reinterpret_cast<__nv_bfloat162*>(dst + j) = __floats2bfloat162_rn(v[j], v[j + 1]);
  }
}

template <int D>
__global__ void __launch_bounds__(kBlockThreads)
    flash_forward_kernel(float* atty, float* lse, const float* qkv, int T, int NH, int C, float scale) {
  constexpr int kLdH = D + kPadH, kLdF = D + kPadF;
  extern __shared__ __align__(128) unsigned char shared[];
  bf16* q_tile = reinterpret_cast<bf16*>(shared);
  bf16* k_tile = q_tile + kTile * kLdH;
  bf16* v_tile = k_tile + kTile * kLdH;
  bf16* p_tile = v_tile + kTile * kLdH;
  float* s_tile = reinterpret_cast<float*>(p_tile + kTile * kLdP);
  float* o_tile = s_tile + kTile * kLdS;
  float* row_max = o_tile + kTile * kLdF;
  float* row_sum = row_max + kTile;

  // The last query tiles have the most key tiles: they start first, so
  // that the short ones fill the tail.
  const int qt = static_cast<int>(gridDim.x - 1 - blockIdx.x), bh = static_cast<int>(blockIdx.y);
  const int b = bh / NH, h = bh % NH;
  const int q0 = qt * kTile;
  const size_t stride = 3 * static_cast<size_t>(C);
  const float* base = qkv + static_cast<size_t>(b) * T * stride + static_cast<size_t>(h) * D;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const int r0 = warp * kFrag;
  const RowHalf mine = row_half(lane);
  const int r = r0 + mine.row, i = q0 + r;

  load_tile<D>(q_tile, base, stride, q0, T);
  for (int x = threadIdx.x; x < kTile * kLdF; x += kBlockThreads) o_tile[x] = 0.0f;
  if (threadIdx.x < kTile) {
    row_max[threadIdx.x] = -INFINITY;
    row_sum[threadIdx.x] = 0.0f;
  }
  // Key tiles up to the diagonal: past it every score is masked.
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the last tile's keys and values are read (and, first, Q is in)
    load_tile<D>(k_tile, base + C, stride, k0, T);
    load_tile<D>(v_tile, base + 2 * C, stride, k0, T);
    __syncthreads();
    rows_times_tile_t<D>(s_tile + r0 * kLdS, q_tile + r0 * kLdH, k_tile);
    __syncwarp();
    // The online softmax: a new running max rescales the sum and the
    // output so far. The diagonal tile holds key k0 <= every row's query,
    // so each row has an unmasked score and a finite max.
    float s[kWarp];
    load_row_half(s, s_tile + r * kLdS + mine.col);
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kWarp; ++j) {
      s[j] = k0 + mine.col + j <= i ? s[j] * scale : -INFINITY;
      mx = fmaxf(mx, s[j]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, kFrag));
    const float m_old = row_max[r];
    const float m_new = fmaxf(m_old, mx);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kWarp; ++j) {
      s[j] = __expf(s[j] - m_new);  // 0 where masked
      sum += s[j];
    }
    sum += __shfl_xor_sync(kFullMask, sum, kFrag);
    store_row_half(p_tile + r * kLdP + mine.col, s);
    const float alpha = __expf(m_old - m_new);  // 0 on the first tile
    float* o_row = o_tile + r * kLdF + (mine.col / kWarp) * (D / 2);
#pragma unroll
    for (int d = 0; d < D / 2; d += 4) {
      float4 x = *reinterpret_cast<float4*>(o_row + d);
      x.x *= alpha;
      x.y *= alpha;
      x.z *= alpha;
      x.w *= alpha;
      *reinterpret_cast<float4*>(o_row + d) = x;
    }
    __syncwarp();  // both halves read row_max[r] before it changes
    if (mine.col == 0) {
      row_max[r] = m_new;
      row_sum[r] = row_sum[r] * alpha + sum;
    }
    __syncwarp();
    // O (the warp's 16 rows) += P (16 x 64) x V (64 x D), P's fragments
    // loaded once for every column block.
    FragA pf[kTile / kFrag];
#pragma unroll
    for (int k = 0; k < kTile / kFrag; ++k) wmma::load_matrix_sync(pf[k], p_tile + r0 * kLdP + k * kFrag, kLdP);
#pragma unroll
    for (int n = 0; n < D / kFrag; ++n) {
      FragC acc;
      wmma::load_matrix_sync(acc, o_tile + r0 * kLdF + n * kFrag, kLdF, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < kTile / kFrag; ++k) {
        FragB fb;
        wmma::load_matrix_sync(fb, v_tile + k * kFrag * kLdH + n * kFrag, kLdH);
        wmma::mma_sync(acc, pf[k], fb, acc);
      }
      wmma::store_matrix_sync(o_tile + r0 * kLdF + n * kFrag, acc, kLdF, wmma::mem_row_major);
    }
  }
  __syncwarp();
  if (i < T) {
    const float inv = 1.0f / row_sum[r];
    const int d0 = (mine.col / kWarp) * (D / 2);
    float* out = atty + (static_cast<size_t>(b) * T + i) * C + static_cast<size_t>(h) * D + d0;
    const float* o_row = o_tile + r * kLdF + d0;
#pragma unroll
    for (int d = 0; d < D / 2; d += 4) {
      float4 x = *reinterpret_cast<const float4*>(o_row + d);
      x.x *= inv;
      x.y *= inv;
      x.z *= inv;
      x.w *= inv;
      *reinterpret_cast<float4*>(out + d) = x;
    }
    if (mine.col == 0) lse[static_cast<size_t>(bh) * T + i] = row_max[r] + logf(row_sum[r]);
  }
}

/// delta[(b*NH + h)*T + t] = sum over the head's columns of dout * atty:
/// the softmax backward's row term (FlashAttention-2's D). One warp a row.
__global__ void flash_delta_kernel(float* delta, const float* dout, const float* atty, size_t rows, int T, int NH,
                                   int C, int D) {
  const size_t warps = static_cast<size_t>(gridDim.x) * (blockDim.x / kWarp);
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  for (size_t w = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp; w < rows; w += warps) {
    const size_t bt = w / NH;  // the row of dout and atty
    const int h = static_cast<int>(w % NH);
    const size_t off = bt * C + static_cast<size_t>(h) * D;
    float sum = 0.0f;
    for (int d = lane; d < D; d += kWarp) sum += dout[off + d] * atty[off + d];
    sum = warp_sum(sum);
    const size_t b = bt / T, t = bt % T;
    if (lane == 0) delta[(b * NH + h) * T + t] = sum;
  }
}

template <int D>
__global__ void __launch_bounds__(kBlockThreads)
    flash_backward_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta,
                          int T, int NH, int C, float scale) {
  constexpr int kLdH = D + kPadH, kLdF = D + kPadF;
  extern __shared__ __align__(128) unsigned char shared[];
  bf16* k_tile = reinterpret_cast<bf16*>(shared);
  bf16* v_tile = k_tile + kTile * kLdH;
  bf16* q_tile = v_tile + kTile * kLdH;
  bf16* do_tile = q_tile + kTile * kLdH;
  bf16* p_tile = do_tile + kTile * kLdH;
  bf16* ds_tile = p_tile + kTile * kLdP;
  float* s_tile = reinterpret_cast<float*>(ds_tile + kTile * kLdP);
  float* dk_acc = s_tile + kTile * kLdS;
  float* dv_acc = dk_acc + kTile * kLdF;
  float* row_lse = dv_acc + kTile * kLdF;
  float* row_delta = row_lse + kTile;
  float* scratch_all = row_delta + kTile;

  // The first key tiles have the most query tiles, and start first.
  const int kt = static_cast<int>(blockIdx.x), bh = static_cast<int>(blockIdx.y);
  const int b = bh / NH, h = bh % NH;
  const int k0 = kt * kTile;
  const size_t stride = 3 * static_cast<size_t>(C);
  const float* base = qkv + static_cast<size_t>(b) * T * stride + static_cast<size_t>(h) * D;
  const float* dout_base = dout + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * D;
  float* dq_base = dqkv + static_cast<size_t>(b) * T * stride + static_cast<size_t>(h) * D;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const int r0 = warp * kFrag;
  const RowHalf mine = row_half(lane);
  const int r = r0 + mine.row;
  float* scratch = scratch_all + warp * kFrag * kFrag;

  load_tile<D>(k_tile, base + C, stride, k0, T);
  load_tile<D>(v_tile, base + 2 * C, stride, k0, T);
  for (int x = threadIdx.x; x < kTile * kLdF; x += kBlockThreads) dk_acc[x] = dv_acc[x] = 0.0f;

  const int tiles = (T + kTile - 1) / kTile;
  // Query tiles from the diagonal on: before it every score is masked.
  for (int qt = kt; qt < tiles; ++qt) {
    const int q0 = qt * kTile, i = q0 + r;
    __syncthreads();  // the last tile's queries, dO, P and dS are read
    load_tile<D>(q_tile, base, stride, q0, T);
    load_tile<D>(do_tile, dout_base, C, q0, T);
    if (threadIdx.x < kTile) {
      const int t = q0 + static_cast<int>(threadIdx.x);
      row_lse[threadIdx.x] = t < T ? lse[static_cast<size_t>(bh) * T + t] : 0.0f;
      row_delta[threadIdx.x] = t < T ? delta[static_cast<size_t>(bh) * T + t] : 0.0f;
    }
    __syncthreads();

    // P (the warp's query rows) = exp(scale * Q K^T - lse), the forward's
    // probabilities; zero where masked and on rows past T.
    rows_times_tile_t<D>(s_tile + r0 * kLdS, q_tile + r0 * kLdH, k_tile);
    __syncwarp();
    float p[kWarp];
    load_row_half(p, s_tile + r * kLdS + mine.col);
    const float row_l = row_lse[r];
#pragma unroll
    for (int j = 0; j < kWarp; ++j) {
      p[j] = i < T && k0 + mine.col + j <= i ? __expf(p[j] * scale - row_l) : 0.0f;
    }
    store_row_half(p_tile + r * kLdP + mine.col, p);
    __syncwarp();
    // dP = dO V^T over the same rows, then dS = P * (dP - delta).
    rows_times_tile_t<D>(s_tile + r0 * kLdS, do_tile + r0 * kLdH, v_tile);
    __syncwarp();
    float dp[kWarp];
    load_row_half(dp, s_tile + r * kLdS + mine.col);
    const float row_d = row_delta[r];
#pragma unroll
    for (int j = 0; j < kWarp; ++j) dp[j] = p[j] * (dp[j] - row_d);
    store_row_half(ds_tile + r * kLdP + mine.col, dp);
    __syncthreads();  // every row's P and dS

    // dV (the warp's key rows) += P^T dO and dK += dS^T Q: P^T's 16-row
    // blocks are P's columns, read column-major.
    rows_t_times_tile<D>(dv_acc + r0 * kLdF, p_tile + r0, do_tile);
    rows_t_times_tile<D>(dk_acc + r0 * kLdF, ds_tile + r0, q_tile);
    // dQ (the warp's query rows) += scale * dS K: other key tiles' blocks
    // add to the same rows, so through atomics.
    FragA fds[kTile / kFrag];
#pragma unroll
    for (int k = 0; k < kTile / kFrag; ++k) wmma::load_matrix_sync(fds[k], ds_tile + r0 * kLdP + k * kFrag, kLdP);
#pragma unroll
    for (int n = 0; n < D / kFrag; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int k = 0; k < kTile / kFrag; ++k) {
        FragB fb;
        wmma::load_matrix_sync(fb, k_tile + k * kFrag * kLdH + n * kFrag, kLdH);
        wmma::mma_sync(acc, fds[k], fb, acc);
      }
      wmma::store_matrix_sync(scratch, acc, kFrag, wmma::mem_row_major);
      __syncwarp();
#pragma unroll
      for (int e = lane; e < kFrag * kFrag; e += kWarp) {
        const int t = q0 + r0 + e / kFrag;
        if (t < T) atomicAdd(dq_base + static_cast<size_t>(t) * stride + n * kFrag + e % kFrag, scale * scratch[e]);
      }
      __syncwarp();
    }
  }
  __syncthreads();
  for (int x = threadIdx.x; x < kTile * D; x += kBlockThreads) {
    const int row = x / D, d = x % D, j = k0 + row;
    if (j >= T) continue;
    float* out = dq_base + static_cast<size_t>(j) * stride + d;
    out[C] = dk_acc[row * kLdF + d] * scale;
    out[2 * C] = dv_acc[row * kLdF + d];
  }
}

/// Calls f(std::integral_constant<int, D>) for the head size D: the kernels
/// are compiled for each multiple of 16 up to kMaxHeadSize.
template <class F>
cudaError_t with_head_size(size_t D, F&& f) {
  switch (D) {
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    case 48: return f(std::integral_constant<int, 48>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 80: return f(std::integral_constant<int, 80>{});
    case 96: return f(std::integral_constant<int, 96>{});
    case 112: return f(std::integral_constant<int, 112>{});
    case 128: return f(std::integral_constant<int, 128>{});
    default: return cudaErrorInvalidValue;
  }
}

/// The launch's grid, or false when the shape is outside the kernels'.
bool flash_grid(size_t B, size_t T, size_t NH, size_t C, dim3* grid) {
  if (B == 0 || T == 0 || NH == 0 || C % NH != 0 || B * NH > kMaxGridY || 3 * C * B * T > (size_t{1} << 62)) {
    return false;
  }
  const size_t D = C / NH;
  if (D == 0 || D % kFrag != 0 || D > kMaxHeadSize || T > static_cast<size_t>(1) << 30) return false;
  *grid = dim3(static_cast<unsigned>((T + kTile - 1) / kTile), static_cast<unsigned>(B * NH));
  return true;
}

}  // namespace

bool flash_attention_supported(size_t head_size, int device) {
  if (head_size == 0 || head_size % kFrag != 0 || head_size > kMaxHeadSize) return false;
  int optin = 0;
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const size_t limit = static_cast<size_t>(optin);
  return forward_shared_bytes(head_size) <= limit && backward_shared_bytes(head_size) <= limit;
}

cudaError_t flash_attention_forward(float* atty, float* lse, const float* qkv, size_t B, size_t T, size_t NH,
                                    size_t C, cudaStream_t stream) {
  dim3 grid;
  if (!flash_grid(B, T, NH, C, &grid)) return cudaErrorInvalidValue;
  const size_t D = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  return with_head_size(D, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    const size_t bytes = forward_shared_bytes(kD);
    cudaError_t e = cudaFuncSetAttribute(flash_forward_kernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes));
    if (e != cudaSuccess) return e;
    flash_forward_kernel<kD><<<grid, kBlockThreads, bytes, stream>>>(atty, lse, qkv, static_cast<int>(T),
                                                                     static_cast<int>(NH), static_cast<int>(C), scale);
    return cudaGetLastError();
  });
}

cudaError_t flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* atty,
                                     const float* lse, float* scratch, size_t B, size_t T, size_t NH, size_t C,
                                     cudaStream_t stream) {
  dim3 grid;
  if (!flash_grid(B, T, NH, C, &grid)) return cudaErrorInvalidValue;
  const size_t D = C / NH;
  // The queries' third is a sum of atomics: it starts at zero. (The keys'
  // and values' thirds are written whole by their tiles' blocks.)
  cudaError_t e = cudaMemset2DAsync(dqkv, 3 * C * sizeof(float), 0, C * sizeof(float), B * T, stream);
  if (e != cudaSuccess) return e;
  const size_t rows = B * T * NH;
  constexpr unsigned kDeltaThreads = 256;
  const size_t warps_per_block = kDeltaThreads / kWarp;
  const auto delta_blocks =
      static_cast<unsigned>(std::min<size_t>((rows + warps_per_block - 1) / warps_per_block, 65536));
  flash_delta_kernel<<<delta_blocks, kDeltaThreads, 0, stream>>>(scratch, dout, atty, rows, static_cast<int>(T),
                                                                 static_cast<int>(NH), static_cast<int>(C),
                                                                 static_cast<int>(D));
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  return with_head_size(D, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    const size_t bytes = backward_shared_bytes(kD);
    cudaError_t err = cudaFuncSetAttribute(flash_backward_kernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes));
    if (err != cudaSuccess) return err;
    flash_backward_kernel<kD><<<grid, kBlockThreads, bytes, stream>>>(dqkv, dout, qkv, lse, scratch,
                                                                      static_cast<int>(T), static_cast<int>(NH),
                                                                      static_cast<int>(C), scale);
    return cudaGetLastError();
  });
}

}  // namespace troupe::rl::model::cuda
