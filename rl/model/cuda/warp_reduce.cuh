// Reductions across the 32 lanes of a warp, for the model's CUDA kernels
// (kernels.cu, flash_attention.cu). Every lane gets the result; all 32
// lanes must call.
#pragma once

namespace troupe::rl::model::cuda {

inline constexpr unsigned kWarp = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

template <class T>
__device__ inline T warp_sum(T v) {
  for (unsigned o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ inline float warp_max(float v) {
  for (unsigned o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

}  // namespace troupe::rl::model::cuda
