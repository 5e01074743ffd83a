// matmul_forward_invariant (kernels.h): a product whose every output
// element is computed by the same operations in the same order whatever
// the number of rows and whatever rows share the call, so a decode row's
// logits do not depend on its batch.
//
// Each element is a 16-lane dot product over the inner dimension (lane i
// sums k = i, i+16, ...: a multiply, then an add, each rounded: this file
// is compiled with -ffp-contract=off, so that no instantiation fuses them
// and another does not), then the lanes are added by one fixed tree. Blocks
// of 4 rows x 4 outputs share their loads; a block at an edge has fewer of
// either, and the same operations per element.
#include <algorithm>
#include <cstring>

#include "model/kernels.h"
#include "model/threads.h"

namespace troupe::rl::model {
namespace {

using V16 = float __attribute__((vector_size(64)));
using V8 = float __attribute__((vector_size(32)));
using V4 = float __attribute__((vector_size(16)));
constexpr size_t kLanes = 16;
constexpr size_t kRows = 4, kOuts = 4;

// Vectors go by reference: passing 64-byte vectors by value is
// ABI-dependent on the target.
[[gnu::always_inline]] inline void load(V16& v, const float* p, size_t n) {
  if (n == kLanes) {
    std::memcpy(&v, p, sizeof v);
  } else {
    v = V16{};
    for (size_t i = 0; i < n; ++i) v[i] = p[i];
  }
}

// The lane sums of four accumulators (one output each), every one by the
// same tree: halves, then quarters, then (0 + 2) + (1 + 3). Four at a time,
// so that the tree is a few vector operations, not sixteen scalar ones per
// output; an output's sum does not depend on the other three.
[[gnu::always_inline]] inline void lane_sums(V4& out, const V16& v0, const V16& v1, const V16& v2, const V16& v3) {
  const V16 p01 = __builtin_shufflevector(v0, v1, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                  __builtin_shufflevector(v0, v1, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const V16 p23 = __builtin_shufflevector(v2, v3, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                  __builtin_shufflevector(v2, v3, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const V16 q = __builtin_shufflevector(p01, p23, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
                __builtin_shufflevector(p01, p23, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const V8 c = __builtin_shufflevector(q, q, 0, 1, 4, 5, 8, 9, 12, 13) +
               __builtin_shufflevector(q, q, 2, 3, 6, 7, 10, 11, 14, 15);
  out = __builtin_shufflevector(c, c, 0, 2, 4, 6) + __builtin_shufflevector(c, c, 1, 3, 5, 7);
}

template <size_t R, size_t J>
[[gnu::always_inline]] inline void block(float* out, const float* inp, const float* weight, const float* bias,
                                         size_t C, size_t OC, size_t n0, size_t j0) {
  V16 acc[R][J] = {};
  size_t k = 0;
  for (; k + kLanes <= C; k += kLanes) {
    V16 x[R], w[J];
    // Unrolled, so that the accumulators stay in registers.
#pragma GCC unroll 4
    for (size_t r = 0; r < R; ++r) std::memcpy(&x[r], inp + (n0 + r) * C + k, sizeof(V16));
#pragma GCC unroll 4
    for (size_t j = 0; j < J; ++j) std::memcpy(&w[j], weight + (j0 + j) * C + k, sizeof(V16));
#pragma GCC unroll 4
    for (size_t r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (size_t j = 0; j < J; ++j) acc[r][j] += x[r] * w[j];
    }
  }
  if (k < C) {
    // A short last piece, zero-filled: its empty lanes add exact zeros.
    V16 x[R], w[J];
    for (size_t r = 0; r < R; ++r) load(x[r], inp + (n0 + r) * C + k, C - k);
    for (size_t j = 0; j < J; ++j) load(w[j], weight + (j0 + j) * C + k, C - k);
    for (size_t r = 0; r < R; ++r) {
      for (size_t j = 0; j < J; ++j) acc[r][j] += x[r] * w[j];
    }
  }
  const V16 zero{};
  for (size_t r = 0; r < R; ++r) {
    V4 sums;
    lane_sums(sums, acc[r][0], J > 1 ? acc[r][J > 1 ? 1 : 0] : zero, J > 2 ? acc[r][J > 2 ? 2 : 0] : zero,
              J > 3 ? acc[r][J > 3 ? 3 : 0] : zero);
    for (size_t j = 0; j < J; ++j) out[(n0 + r) * OC + j0 + j] = bias != nullptr ? bias[j0 + j] + sums[j] : sums[j];
  }
}

template <size_t R>
[[gnu::always_inline]] inline void row_block(float* out, const float* inp, const float* weight, const float* bias,
                                             size_t C, size_t OC, size_t n0) {
  size_t j0 = 0;
  for (; j0 + kOuts <= OC; j0 += kOuts) block<R, kOuts>(out, inp, weight, bias, C, OC, n0, j0);
  switch (OC - j0) {
    case 1: block<R, 1>(out, inp, weight, bias, C, OC, n0, j0); break;
    case 2: block<R, 2>(out, inp, weight, bias, C, OC, n0, j0); break;
    case 3: block<R, 3>(out, inp, weight, bias, C, OC, n0, j0); break;
    default: break;
  }
}

// Rows [n0, n0 + rows), rows <= kRows. Compiled for each vector ISA (the
// loader picks the machine's; kernels.cc does the same): the hot loops are
// here, inlined, not in the caller.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void rows_block(
    float* out, const float* inp, const float* weight, const float* bias, size_t C, size_t OC, size_t n0,
    size_t rows) {
  switch (rows) {
    case 1: row_block<1>(out, inp, weight, bias, C, OC, n0); break;
    case 2: row_block<2>(out, inp, weight, bias, C, OC, n0); break;
    case 3: row_block<3>(out, inp, weight, bias, C, OC, n0); break;
    default: row_block<4>(out, inp, weight, bias, C, OC, n0); break;
  }
}

}  // namespace

void matmul_forward_invariant(float* out, const float* inp, const float* weight, const float* bias, size_t N, size_t C,
                              size_t OC) {
  const size_t blocks = (N + kRows - 1) / kRows;
  // Threads take whole row blocks (each element's operations are the same
  // in any block); a block is worth a thread from ~128K multiply-adds.
  const size_t grain = std::max<size_t>(1, (size_t{1} << 17) / std::max<size_t>(1, kRows * C * OC));
  parallel_for(blocks, grain, [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) {
      const size_t n0 = b * kRows;
      rows_block(out, inp, weight, bias, C, OC, n0, std::min(kRows, N - n0));
    }
  });
}

}  // namespace troupe::rl::model
