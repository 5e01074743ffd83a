#include "collectives/reduce.h"

#include <bit>
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

void reduce_float32(ReduceOp op, float* dst, const float* src, size_t count_elems) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: combine(dst, src, count_elems, [](float a, float b) { return a + b; }); return;
    case ReduceOp::max: combine(dst, src, count_elems, max_nan); return;
    case ReduceOp::min: combine(dst, src, count_elems, min_nan); return;
  }
}

// bf16 in float, one rounding per combine: what a bf16 GPU kernel does.
void reduce_bfloat16(ReduceOp op, uint16_t* dst, const uint16_t* src, size_t count_elems) {
  auto in_float = [](auto f) {
    return [f](uint16_t a, uint16_t b) { return float_to_bf16(f(bf16_to_float(a), bf16_to_float(b))); };
  };
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: combine(dst, src, count_elems, in_float([](float a, float b) { return a + b; })); return;
    case ReduceOp::max: combine(dst, src, count_elems, in_float(max_nan)); return;
    case ReduceOp::min: combine(dst, src, count_elems, in_float(min_nan)); return;
  }
}

template <typename T>
void reduce_int(ReduceOp op, T* dst, const T* src, size_t count_elems) {
  // Signed overflow is undefined; the sum wraps in the unsigned type instead
  // (two's complement, like the GPU collectives).
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      combine(dst, src, count_elems, [](T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); });
      return;
    case ReduceOp::max: combine(dst, src, count_elems, [](T a, T b) { return b > a ? b : a; }); return;
    case ReduceOp::min: combine(dst, src, count_elems, [](T a, T b) { return b < a ? b : a; }); return;
  }
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
  size_t size_bytes = count_elems * dtype_size(dtype);
  if (dst < src + size_bytes && src < dst + size_bytes) contract_broken("dst and src overlap", dtype);
  switch (dtype) {
    case DType::float32:
      reduce_float32(op, reinterpret_cast<float*>(dst), reinterpret_cast<const float*>(src), count_elems);
      return;
    case DType::bfloat16:
      reduce_bfloat16(op, reinterpret_cast<uint16_t*>(dst), reinterpret_cast<const uint16_t*>(src), count_elems);
      return;
    case DType::int32:
      reduce_int(op, reinterpret_cast<int32_t*>(dst), reinterpret_cast<const int32_t*>(src), count_elems);
      return;
    case DType::int64:
      reduce_int(op, reinterpret_cast<int64_t*>(dst), reinterpret_cast<const int64_t*>(src), count_elems);
      return;
  }
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
