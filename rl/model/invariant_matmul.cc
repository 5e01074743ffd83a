// matmul_forward_invariant (kernels.h): a product whose every output
// element is computed by the same operations in the same order whatever
// the number of rows and whatever rows share the call, so a decode row's
// logits do not depend on its batch.
//
// Each element is a 16-lane dot product over the inner dimension (lane i
// sums k = i, i+16, ...: a multiply, then an add, each rounded: this file
// is compiled with -ffp-contract=off, so that no instantiation fuses them
// and another does not), then the lanes are added by one fixed tree. Blocks
// of rows x outputs share their loads (their shape and register width per
// ISA, below); a block at an edge has fewer of either, and the same
// operations per element. So the bits are the same on any x86-64 too.
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
constexpr size_t kRows = 4;   // rows a thread takes at once
constexpr size_t kPanel = 4;  // outputs a thread takes at once (every ISA's block width divides it)

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

// R rows x J outputs. An element's 16 lanes live in 16/P-lane registers
// (VR; P parts each), as wide as the ISA has: lane for lane the same
// multiplies and adds in any shape and width.
template <size_t R, size_t J, typename VR>
[[gnu::always_inline]] inline void block(float* out, const float* inp, const float* weight, const float* bias,
                                         size_t C, size_t OC, size_t n0, size_t j0) {
  constexpr size_t P = sizeof(V16) / sizeof(VR), W = kLanes / P;
  VR acc[R][J][P] = {};
  size_t k = 0;
  for (; k + kLanes <= C; k += kLanes) {
    // Unrolled, so that the accumulators stay in registers.
#pragma GCC unroll 4
    for (size_t p = 0; p < P; ++p) {
      VR x[R], w[J];
#pragma GCC unroll 4
      for (size_t r = 0; r < R; ++r) std::memcpy(&x[r], inp + (n0 + r) * C + k + p * W, sizeof(VR));
#pragma GCC unroll 4
      for (size_t j = 0; j < J; ++j) std::memcpy(&w[j], weight + (j0 + j) * C + k + p * W, sizeof(VR));
#pragma GCC unroll 4
      for (size_t r = 0; r < R; ++r) {
#pragma GCC unroll 4
        for (size_t j = 0; j < J; ++j) acc[r][j][p] += x[r] * w[j];
      }
    }
  }
  if (k < C) {
    // A short last piece, zero-filled: its empty lanes add exact zeros.
    V16 x[R], w[J];
    for (size_t r = 0; r < R; ++r) load(x[r], inp + (n0 + r) * C + k, C - k);
    for (size_t j = 0; j < J; ++j) load(w[j], weight + (j0 + j) * C + k, C - k);
    for (size_t p = 0; p < P; ++p) {
      for (size_t r = 0; r < R; ++r) {
        for (size_t j = 0; j < J; ++j) {
          VR xp, wp;
          std::memcpy(&xp, reinterpret_cast<const float*>(&x[r]) + p * W, sizeof(VR));
          std::memcpy(&wp, reinterpret_cast<const float*>(&w[j]) + p * W, sizeof(VR));
          acc[r][j][p] += xp * wp;
        }
      }
    }
  }
  const V16 zero{};
  for (size_t r = 0; r < R; ++r) {
    V4 sums;
    if constexpr (P == 1) {
      lane_sums(sums, acc[r][0][0], J > 1 ? acc[r][J > 1 ? 1 : 0][0] : zero, J > 2 ? acc[r][J > 2 ? 2 : 0][0] : zero,
                J > 3 ? acc[r][J > 3 ? 3 : 0][0] : zero);
    } else {
      V16 whole[4] = {};
      for (size_t j = 0; j < J; ++j) std::memcpy(&whole[j], acc[r][j], sizeof(V16));
      lane_sums(sums, whole[0], whole[1], whole[2], whole[3]);
    }
    for (size_t j = 0; j < J; ++j) out[(n0 + r) * OC + j0 + j] = bias != nullptr ? bias[j0 + j] + sums[j] : sums[j];
  }
}

// Outputs [j_begin, j_end) of R rows from n0, in blocks of JB outputs (an
// edge block has fewer; each element's operations are the same in any).
template <size_t R, size_t JB, typename VR>
[[gnu::always_inline]] inline void row_block(float* out, const float* inp, const float* weight, const float* bias,
                                             size_t C, size_t OC, size_t n0, size_t j_begin, size_t j_end) {
  size_t j0 = j_begin;
  for (; j0 + JB <= j_end; j0 += JB) block<R, JB, VR>(out, inp, weight, bias, C, OC, n0, j0);
  if constexpr (JB > 1) {
    if (j_end - j0 == 1) block<R, 1, VR>(out, inp, weight, bias, C, OC, n0, j0);
  }
  if constexpr (JB > 2) {
    if (j_end - j0 == 2) block<R, 2, VR>(out, inp, weight, bias, C, OC, n0, j0);
  }
  if constexpr (JB > 3) {
    if (j_end - j0 == 3) block<R, 3, VR>(out, inp, weight, bias, C, OC, n0, j0);
  }
}

// Rows [n0, n0 + rows) x outputs [j_begin, j_end), in blocks of RB rows x
// JB outputs.
template <size_t RB, size_t JB, typename VR>
[[gnu::always_inline]] inline void rows_shaped(float* out, const float* inp, const float* weight, const float* bias,
                                               size_t C, size_t OC, size_t n0, size_t rows, size_t j_begin,
                                               size_t j_end) {
  for (size_t n = n0; n < n0 + rows; n += RB) {
    switch (std::min(RB, n0 + rows - n)) {
      case 1: row_block<1, JB, VR>(out, inp, weight, bias, C, OC, n, j_begin, j_end); break;
      case 2: if constexpr (RB >= 2) row_block<2, JB, VR>(out, inp, weight, bias, C, OC, n, j_begin, j_end); break;
      case 3: if constexpr (RB >= 3) row_block<3, JB, VR>(out, inp, weight, bias, C, OC, n, j_begin, j_end); break;
      default: if constexpr (RB >= 4) row_block<4, JB, VR>(out, inp, weight, bias, C, OC, n, j_begin, j_end); break;
    }
  }
}

// One compilation per vector ISA, each with the registers and the block
// that fit it: AVX-512, 16-lane registers, 4 rows x 4 outputs; AVX2, 8-lane
// registers, 2 x 2; SSE2, 4-lane, 1 x 2 (AVX-512's block on AVX2 spilled:
// 25 GFLOP/s against 141 on a 64x256x1024 product). Neither changes any
// element's operations: every ISA gives the same bits (checked).
using RowsFn = void (*)(float*, const float*, const float*, const float*, size_t, size_t, size_t, size_t, size_t,
                        size_t);
__attribute__((target("arch=x86-64-v4"))) void rows_v4(float* out, const float* inp, const float* weight,
                                                       const float* bias, size_t C, size_t OC, size_t n0,
                                                       size_t rows, size_t j_begin, size_t j_end) {
  rows_shaped<4, 4, V16>(out, inp, weight, bias, C, OC, n0, rows, j_begin, j_end);
}
__attribute__((target("arch=x86-64-v3"))) void rows_v3(float* out, const float* inp, const float* weight,
                                                       const float* bias, size_t C, size_t OC, size_t n0,
                                                       size_t rows, size_t j_begin, size_t j_end) {
  rows_shaped<2, 2, V8>(out, inp, weight, bias, C, OC, n0, rows, j_begin, j_end);
}
void rows_baseline(float* out, const float* inp, const float* weight, const float* bias, size_t C, size_t OC,
                   size_t n0, size_t rows, size_t j_begin, size_t j_end) {
  rows_shaped<1, 2, V4>(out, inp, weight, bias, C, OC, n0, rows, j_begin, j_end);
}
RowsFn pick_rows() {
  if (__builtin_cpu_supports("x86-64-v4")) return rows_v4;
  if (__builtin_cpu_supports("x86-64-v3")) return rows_v3;
  return rows_baseline;
}

}  // namespace

namespace {
void product(RowsFn rows, float* out, const float* inp, const float* weight, const float* bias, size_t N, size_t C,
             size_t OC) {
  // Threads take whole row blocks, or, when there are fewer blocks than
  // threads (a decode of a few rows), whole panels of outputs of every row:
  // each element's operations are the same in any range. A range is worth
  // a thread from ~128K multiply-adds.
  const size_t blocks = (N + kRows - 1) / kRows;
  if (blocks >= compute_threads()) {
    const size_t grain = std::max<size_t>(1, (size_t{1} << 17) / std::max<size_t>(1, kRows * C * OC));
    parallel_for(blocks, grain, [&](size_t b0, size_t b1) {
      for (size_t b = b0; b < b1; ++b) {
        const size_t n0 = b * kRows;
        rows(out, inp, weight, bias, C, OC, n0, std::min(kRows, N - n0), 0, OC);
      }
    });
    return;
  }
  const size_t panels = (OC + kPanel - 1) / kPanel;
  const size_t grain = std::max<size_t>(1, (size_t{1} << 17) / std::max<size_t>(1, kPanel * C * N));
  parallel_for(panels, grain, [&](size_t p0, size_t p1) {
    rows(out, inp, weight, bias, C, OC, 0, N, p0 * kPanel, std::min(OC, p1 * kPanel));
  });
}
}  // namespace

void matmul_forward_invariant(float* out, const float* inp, const float* weight, const float* bias, size_t N, size_t C,
                              size_t OC) {
  static const RowsFn rows = pick_rows();
  product(rows, out, inp, weight, bias, N, C, OC);
}

bool matmul_forward_invariant_on(int isa, float* out, const float* inp, const float* weight, const float* bias,
                                 size_t N, size_t C, size_t OC) {
  RowsFn rows = nullptr;
  if (isa == 0) rows = rows_baseline;
  if (isa == 1 && __builtin_cpu_supports("x86-64-v3")) rows = rows_v3;
  if (isa == 2 && __builtin_cpu_supports("x86-64-v4")) rows = rows_v4;
  if (rows == nullptr) return false;
  product(rows, out, inp, weight, bias, N, C, OC);
  return true;
}

}  // namespace troupe::rl::model
