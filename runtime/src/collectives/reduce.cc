#include "collectives/reduce.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

namespace troupe::collectives {
namespace {

// The callers are the schedules and the transport, not users: a bad
// argument is a bug in troupe, so it aborts rather than returning a Status.
[[noreturn]] void contract_broken(const char* what, DType dtype) {
  std::fprintf(stderr, "troupe: collectives reduce (%.*s): %s\n", static_cast<int>(dtype_name(dtype).size()),
               dtype_name(dtype).data(), what);
  std::abort();
}

void check_aligned(const void* p, DType dtype) {
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(dtype) != 0) {
    contract_broken("buffer not aligned to its element size", dtype);
  }
}

// Elements per block of the combine loops. At -O2 GCC's vectorizer uses its
// "very-cheap" cost model, which only vectorizes loops whose trip count is a
// known multiple of the vector width: a plain `for (i < n)` stays scalar,
// while a fixed block of 16 becomes straight SIMD (4 x SSE for float32). The
// tail (< 16 elements) runs scalar.
constexpr size_t kBlockElems = 16;

// dst[i] = f(dst[i], src[i]); __restrict on the parameters tells the
// vectorizer that the buffers do not overlap (reduce_into checks it).
template <typename T, typename F>
inline void combine(T* __restrict dst, const T* __restrict src, size_t count_elems, F f) {
  size_t i = 0;
  for (; i + kBlockElems <= count_elems; i += kBlockElems) {
    for (size_t j = 0; j < kBlockElems; ++j) dst[i + j] = f(dst[i + j], src[i + j]);
  }
  for (; i < count_elems; ++i) dst[i] = f(dst[i], src[i]);
}

// dst[i] = f(a[i], b[i]), blocked the same way; three buffers that do not
// overlap (reduce_to checks it).
template <typename T, typename F>
inline void combine_to(T* __restrict dst, const T* __restrict a, const T* __restrict b, size_t count_elems, F f) {
  size_t i = 0;
  for (; i + kBlockElems <= count_elems; i += kBlockElems) {
    for (size_t j = 0; j < kBlockElems; ++j) dst[i + j] = f(a[i + j], b[i + j]);
  }
  for (; i < count_elems; ++i) dst[i] = f(a[i], b[i]);
}

// data[i] = f(data[i]), blocked for the same reason as combine.
template <typename T, typename F>
inline void transform(T* __restrict data, size_t count_elems, F f) {
  size_t i = 0;
  for (; i + kBlockElems <= count_elems; i += kBlockElems) {
    for (size_t j = 0; j < kBlockElems; ++j) data[i + j] = f(data[i + j]);
  }
  for (; i < count_elems; ++i) data[i] = f(data[i]);
}

// NaN-propagating max and min (`b != b` is the branch-free isnan): a NaN in
// either operand gives a NaN, whichever side it is on.
inline float max_nan(float a, float b) { return (b > a || b != b) ? b : a; }
inline float min_nan(float a, float b) { return (b < a || b != b) ? b : a; }

// The element functions, by type and op: `run(f)` is called with the one
// that `op` names, so reduce_into and reduce_to combine with the same
// functions (and so round bfloat16 the same way).
template <typename Run>
void with_float32_op(ReduceOp op, Run run) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: run([](float a, float b) { return a + b; }); return;
    case ReduceOp::max: run(max_nan); return;
    case ReduceOp::min: run(min_nan); return;
  }
}

// bf16 in float, one rounding per combine: what a bf16 GPU kernel does.
template <typename Run>
void with_bfloat16_op(ReduceOp op, Run run) {
  auto in_float = [](auto f) {
    return [f](uint16_t a, uint16_t b) { return float_to_bf16(f(bf16_to_float(a), bf16_to_float(b))); };
  };
  with_float32_op(op, [&](auto f) { run(in_float(f)); });
}

// Signed overflow is undefined; the sum wraps in the unsigned type instead
// (two's complement, like the GPU collectives).
template <typename T, typename Run>
void with_int_op(ReduceOp op, Run run) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: run([](T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); }); return;
    case ReduceOp::max: run([](T a, T b) { return b > a ? b : a; }); return;
    case ReduceOp::min: run([](T a, T b) { return b < a ? b : a; }); return;
  }
}

// Calls `run(T{}, f)` with the element type and function of (dtype, op).
template <typename Run>
void with_op(DType dtype, ReduceOp op, Run run) {
  switch (dtype) {
    case DType::float32: with_float32_op(op, [&](auto f) { run(float{}, f); }); return;
    case DType::bfloat16: with_bfloat16_op(op, [&](auto f) { run(uint16_t{}, f); }); return;
    case DType::int32: with_int_op<int32_t>(op, [&](auto f) { run(int32_t{}, f); }); return;
    case DType::int64: with_int_op<int64_t>(op, [&](auto f) { run(int64_t{}, f); }); return;
  }
}

bool overlap(const std::byte* a, const std::byte* b, size_t size_bytes) {
  return a < b + size_bytes && b < a + size_bytes;
}

}  // namespace

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: rounding could carry into the exponent or cut the whole payload
    // (giving infinity), so keep sign and top payload and set the quiet bit.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest, ties to even: add just under half an ulp of bf16, plus
  // one when the kept part is odd, then cut. A carry into the exponent is
  // the right answer (up to the next binade, or to infinity past the largest
  // finite bf16); no finite input can carry out of 32 bits.
  uint32_t odd = (bits >> 16) & 1u;
  bits += 0x7fffu + odd;
  return static_cast<uint16_t>(bits >> 16);
}

void reduce_into(DType dtype, ReduceOp op, std::byte* dst, const std::byte* src, size_t count_elems) {
  if (count_elems == 0) return;
  check_aligned(dst, dtype);
  check_aligned(src, dtype);
  if (overlap(dst, src, count_elems * dtype_size(dtype))) contract_broken("dst and src overlap", dtype);
  with_op(dtype, op, [&](auto type, auto f) {
    using T = decltype(type);
    combine(reinterpret_cast<T*>(dst), reinterpret_cast<const T*>(src), count_elems, f);
  });
}

void reduce_to(DType dtype, ReduceOp op, std::byte* dst, const std::byte* a, const std::byte* b,
               size_t count_elems) {
  if (count_elems == 0) return;
  check_aligned(dst, dtype);
  check_aligned(a, dtype);
  check_aligned(b, dtype);
  size_t size_bytes = count_elems * dtype_size(dtype);
  if (overlap(dst, a, size_bytes) || overlap(dst, b, size_bytes) || overlap(a, b, size_bytes)) {
    contract_broken("reduce_to's buffers overlap", dtype);
  }
  with_op(dtype, op, [&](auto type, auto f) {
    using T = decltype(type);
    combine_to(reinterpret_cast<T*>(dst), reinterpret_cast<const T*>(a), reinterpret_cast<const T*>(b), count_elems,
               f);
  });
}

void reduce_many(DType dtype, ReduceOp op, std::byte* dst, const std::byte* const* srcs, size_t n_srcs,
                 size_t count_elems) {
  if (count_elems == 0) return;
  if (n_srcs == 0) contract_broken("reduce_many of no buffers", dtype);
  check_aligned(dst, dtype);
  size_t size_bytes = count_elems * dtype_size(dtype);
  for (size_t q = 0; q < n_srcs; ++q) {
    check_aligned(srcs[q], dtype);
    if (srcs[q] != dst && overlap(dst, srcs[q], size_bytes)) contract_broken("reduce_many's dst overlaps a src", dtype);
  }
  with_op(dtype, op, [&](auto type, auto f) {
    using T = decltype(type);
    // A block at a time through a buffer on the stack: every src of the
    // block is read before dst is written, so dst may be one of them.
    constexpr size_t kFoldElems = 1024 / sizeof(T) * 4;
    T acc[kFoldElems];
    for (size_t i = 0; i < count_elems; i += kFoldElems) {
      size_t len = std::min(kFoldElems, count_elems - i);
      std::memcpy(acc, srcs[0] + i * sizeof(T), len * sizeof(T));
      for (size_t q = 1; q < n_srcs; ++q) combine(acc, reinterpret_cast<const T*>(srcs[q]) + i, len, f);
      std::memcpy(dst + i * sizeof(T), acc, len * sizeof(T));
    }
  });
}

void finish_avg(DType dtype, std::byte* data, size_t count_elems, size_t ranks) {
  if (ranks == 0) contract_broken("finish_avg over 0 ranks", dtype);
  if (count_elems == 0 || ranks == 1) return;
  check_aligned(data, dtype);
  // Exact as a float up to 2^24 ranks, far beyond any mesh.
  float ranks_f = static_cast<float>(ranks);
  switch (dtype) {
    case DType::float32:
      transform(reinterpret_cast<float*>(data), count_elems, [ranks_f](float x) { return x / ranks_f; });
      return;
    case DType::bfloat16:
      transform(reinterpret_cast<uint16_t*>(data), count_elems,
                [ranks_f](uint16_t x) { return float_to_bf16(bf16_to_float(x) / ranks_f); });
      return;
    case DType::int32: {
      auto n = static_cast<int32_t>(ranks);
      transform(reinterpret_cast<int32_t*>(data), count_elems, [n](int32_t x) { return static_cast<int32_t>(x / n); });
      return;
    }
    case DType::int64: {
      auto n = static_cast<int64_t>(ranks);
      transform(reinterpret_cast<int64_t*>(data), count_elems, [n](int64_t x) { return x / n; });
      return;
    }
  }
}

}  // namespace troupe::collectives
