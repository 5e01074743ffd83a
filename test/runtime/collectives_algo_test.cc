// The transport-free core of the CPU collectives: bfloat16 rounding, the
// reduction kernels, and the ring, tree and barrier schedules, run for all
// ranks of a mesh in one process by a lockstep simulator and checked against
// references computed directly from the inputs.
//
// How results are compared. Every collective is checked bit for bit against
// a "ring-order" reference that folds the ranks' inputs in the order the ring
// combines them (segment s: s+1, s+2, ..., s, rounding to the dtype after
// each combine): same order, so exactly the same bits. It is also checked
// against a "rank-order" reference computed in double over ranks 0..n-1 and
// rounded once:
//   - integers, and max/min of any dtype: exact (order does not matter);
//   - float32/bfloat16 sum and avg on small-integer inputs: exact, since all
//     partial sums are representable and the order cannot show;
//   - float32/bfloat16 sum and avg on general inputs: within the error bound
//     of n-1 roundings, n * 2u * sum|x| (u = 2^-24 for float32, 2^-9 for
//     bfloat16). A fixed "1 ulp" would be unsound: the ring rounds bf16 at
//     every hop, and n-1 roundings can drift further than one ulp.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "collectives/reduce.h"
#include "collectives/ring.h"
#include "troupe/collectives.h"

using troupe::DType;
using troupe::ReduceOp;
using namespace troupe::collectives;

namespace {

constexpr DType kDTypes[] = {DType::float32, DType::bfloat16, DType::int32, DType::int64};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
constexpr size_t kRanks[] = {1, 2, 3, 4, 7, 8};
constexpr size_t kCounts[] = {0, 1, 5, 7, 64, 1000, 1001};
constexpr size_t kMaxChunkElems[] = {1, 3, size_t{1} << 20};

bool is_float(DType dtype) { return dtype == DType::float32 || dtype == DType::bfloat16; }

size_t ceil_log2(size_t n) {
  size_t rounds = 0;
  while ((size_t{1} << rounds) < n) ++rounds;
  return rounds;
}

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

/// One rank's buffer of `count` elements. operator new aligns it for every
/// dtype, and as bytes it may hold elements of any.
class Buffer {
 public:
  Buffer(DType dtype, size_t count_elems)
      : dtype_(dtype), count_elems_(count_elems), bytes_(count_elems * dtype_size(dtype)) {}

  DType dtype() const { return dtype_; }
  size_t count_elems() const { return count_elems_; }
  std::byte* at(size_t elem) { return bytes_.data() + elem * dtype_size(dtype_); }
  const std::byte* at(size_t elem) const { return bytes_.data() + elem * dtype_size(dtype_); }
  /// The element as a double (exact for every dtype but large int64s, which
  /// only the messages use).
  double value(size_t elem) const {
    switch (dtype_) {
      case DType::float32:
        return load<float>(at(elem));
      case DType::bfloat16:
        return bf16_to_float(load<uint16_t>(at(elem)));
      case DType::int32:
        return load<int32_t>(at(elem));
      case DType::int64:
        return static_cast<double>(load<int64_t>(at(elem)));
    }
    return 0;
  }
  std::string show(size_t elem) const {
    std::string bits;
    for (size_t b = dtype_size(dtype_); b-- > 0;) {
      char hex[3];
      std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned>(at(elem)[b]));
      bits += hex;
    }
    return std::to_string(value(elem)) + " (0x" + bits + ")";
  }

 private:
  DType dtype_;
  size_t count_elems_;
  std::vector<std::byte> bytes_;
};

/// Inputs: `exact` keeps float values small integers (every partial sum
/// representable, so the order of a sum cannot show); `general` uses two
/// decimals in [-100, 100] for floats. Integers span their whole range, so
/// sums wrap.
enum class Data { exact, general };

Buffer make_input(DType dtype, size_t count_elems, Data data, std::mt19937_64& rng) {
  Buffer b(dtype, count_elems);
  for (size_t e = 0; e < count_elems; ++e) {
    uint64_t r = rng();
    float f = data == Data::exact ? static_cast<float>(static_cast<int64_t>(r % 33) - 16)
                                  : static_cast<float>(static_cast<int64_t>(r % 20001) - 10000) / 100.0f;
    switch (dtype) {
      case DType::float32:
        store(b.at(e), f);
        break;
      case DType::bfloat16:
        store(b.at(e), float_to_bf16(f));
        break;
      case DType::int32:
        store(b.at(e), static_cast<int32_t>(static_cast<uint32_t>(r)));
        break;
      case DType::int64:
        store(b.at(e), static_cast<int64_t>(r));
        break;
    }
  }
  return b;
}

std::vector<Buffer> make_inputs(DType dtype, size_t ranks, size_t count_elems, Data data, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Buffer> inputs;
  for (size_t r = 0; r < ranks; ++r) inputs.push_back(make_input(dtype, count_elems, data, rng));
  return inputs;
}

using ScheduleFn = RingSchedule (*)(size_t, size_t, size_t, size_t);

std::vector<RingSchedule> all_ranks(ScheduleFn fn, size_t ranks, size_t count_elems, size_t max_chunk_elems) {
  std::vector<RingSchedule> schedules;
  for (size_t r = 0; r < ranks; ++r) schedules.push_back(fn(ranks, r, count_elems, max_chunk_elems));
  return schedules;
}

/// Runs every rank's ring schedule against `buffers`, step i of all ranks at
/// once: first each rank's send range is copied out (what the network would
/// carry), then each rank's recv is applied from its predecessor's copy. So a
/// rank never sees a neighbour's step-i write before its own step-i send,
/// whatever order the ranks are visited in.
void run_ring(const std::vector<RingSchedule>& schedules, std::vector<Buffer>& buffers, ReduceOp op) {
  size_t ranks = schedules.size();
  DType dtype = buffers[0].dtype();
  size_t elem_bytes = dtype_size(dtype);
  size_t steps = schedules[0].steps.size();
  for (const auto& s : schedules) REQUIRE(s.steps.size() == steps);
  std::vector<std::vector<std::byte>> wire(ranks);
  for (size_t i = 0; i < steps; ++i) {
    for (size_t r = 0; r < ranks; ++r) {
      ElemRange send = schedules[r].steps[i].send;
      const std::byte* from = buffers[r].at(send.offset_elems);
      wire[r].assign(from, from + send.len_elems * elem_bytes);
    }
    for (size_t r = 0; r < ranks; ++r) {
      const RingStep& step = schedules[r].steps[i];
      size_t sender = schedules[r].recv_from;
      // The matched send carries exactly the range this recv expects.
      if (schedules[sender].send_to != r || !(schedules[sender].steps[i].send == step.recv)) {
        FAIL("step " << i << ": rank " << r << " receives a range that rank " << sender << " does not send");
      }
      if (step.recv.len_elems == 0) continue;
      std::byte* into = buffers[r].at(step.recv.offset_elems);
      if (step.recv_mode == RecvMode::copy) {
        std::memcpy(into, wire[sender].data(), wire[sender].size());
      } else {
        reduce_into(dtype, op, into, wire[sender].data(), step.recv.len_elems);
      }
    }
  }
}

/// Element `e` of segment `segment` reduced in the ring's order: starting
/// on rank segment+1, each next rank combines its own value with the partial
/// it receives (dst = own, src = partial), ending on rank `segment`. Uses
/// reduce_into one element at a time, so the kernel's order of operands is
/// the ring's too.
void ring_order_fold(const std::vector<Buffer>& inputs, ReduceOp op, size_t segment, size_t e, std::byte* out) {
  size_t ranks = inputs.size();
  DType dtype = inputs[0].dtype();
  size_t elem_bytes = dtype_size(dtype);
  alignas(8) std::byte partial[8];
  alignas(8) std::byte own[8];
  std::memcpy(partial, inputs[(segment + 1) % ranks].at(e), elem_bytes);
  for (size_t hop = 2; hop <= ranks; ++hop) {
    std::memcpy(own, inputs[(segment + hop) % ranks].at(e), elem_bytes);
    reduce_into(dtype, op, own, partial, 1);
    std::memcpy(partial, own, elem_bytes);
  }
  std::memcpy(out, partial, elem_bytes);
}

/// The allreduce result, folded in ring order (avg finished).
Buffer ring_order_reference(const std::vector<Buffer>& inputs, ReduceOp op) {
  size_t ranks = inputs.size();
  size_t count = inputs[0].count_elems();
  Buffer out(inputs[0].dtype(), count);
  for (size_t s = 0; s < ranks; ++s) {
    ElemRange seg = ring_segment(count, ranks, s);
    for (size_t e = seg.offset_elems; e < seg.offset_elems + seg.len_elems; ++e) {
      ring_order_fold(inputs, op, s, e, out.at(e));
    }
  }
  if (op == ReduceOp::avg) finish_avg(out.dtype(), out.at(0), count, ranks);
  return out;
}

/// The allreduce result over ranks 0..n-1, computed without the kernels:
/// integers wrap in uint64 and are truncated to the dtype, floats are summed
/// in double and rounded once (avg: round the sum, then divide in float and
/// round, as the kernels do). `abs_sum` gets sum|x| per element for the
/// error bound.
Buffer rank_order_reference(const std::vector<Buffer>& inputs, ReduceOp op, std::vector<double>* abs_sum) {
  size_t ranks = inputs.size();
  DType dtype = inputs[0].dtype();
  size_t count = inputs[0].count_elems();
  Buffer out(dtype, count);
  abs_sum->assign(count, 0.0);
  for (size_t e = 0; e < count; ++e) {
    if (is_float(dtype)) {
      double acc = inputs[0].value(e);
      for (size_t r = 0; r < ranks; ++r) {
        double x = inputs[r].value(e);
        (*abs_sum)[e] += std::fabs(x);
        if (r == 0) continue;
        if (op == ReduceOp::max) acc = std::max(acc, x);
        if (op == ReduceOp::min) acc = std::min(acc, x);
        if (op == ReduceOp::sum || op == ReduceOp::avg) acc += x;
      }
      float f = static_cast<float>(acc);
      if (dtype == DType::bfloat16) f = bf16_to_float(float_to_bf16(f));
      if (op == ReduceOp::avg) f /= static_cast<float>(ranks);
      if (dtype == DType::float32) store(out.at(e), f);
      if (dtype == DType::bfloat16) store(out.at(e), float_to_bf16(f));
    } else {
      bool wide = dtype == DType::int64;
      auto get = [&](size_t r) { return wide ? load<int64_t>(inputs[r].at(e)) : load<int32_t>(inputs[r].at(e)); };
      int64_t best = get(0);
      uint64_t sum = 0;
      for (size_t r = 0; r < ranks; ++r) {
        int64_t x = get(r);
        sum += static_cast<uint64_t>(x);
        if (op == ReduceOp::max) best = std::max(best, x);
        if (op == ReduceOp::min) best = std::min(best, x);
      }
      int64_t result = best;
      if (op == ReduceOp::sum || op == ReduceOp::avg) {
        // Truncating to the dtype's width gives the wrapped sum in that width.
        result = wide ? static_cast<int64_t>(sum) : static_cast<int32_t>(static_cast<uint32_t>(sum));
        if (op == ReduceOp::avg) result /= static_cast<int64_t>(ranks);
      }
      if (wide) store(out.at(e), result);
      if (!wide) store(out.at(e), static_cast<int32_t>(result));
    }
  }
  return out;
}

/// "" when `got` equals `want` bit for bit on [range), else the first difference.
std::string bitwise_diff(const Buffer& got, const Buffer& want, ElemRange range) {
  size_t elem_bytes = dtype_size(got.dtype());
  for (size_t e = range.offset_elems; e < range.offset_elems + range.len_elems; ++e) {
    if (std::memcmp(got.at(e), want.at(e), elem_bytes) != 0) {
      return "element " + std::to_string(e) + ": got " + got.show(e) + ", want " + want.show(e);
    }
  }
  return "";
}

std::string bitwise_diff(const Buffer& got, const Buffer& want) {
  return bitwise_diff(got, want, {0, got.count_elems()});
}

/// "" when every element of `got` is within the summation error bound of
/// `want` (see the top of the file), else the first one that is not.
std::string bound_diff(const Buffer& got, const Buffer& want, const std::vector<double>& abs_sum, size_t ranks,
                       ReduceOp op) {
  double u = got.dtype() == DType::float32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -9);
  for (size_t e = 0; e < got.count_elems(); ++e) {
    double bound = static_cast<double>(ranks) * 2 * u * abs_sum[e];
    if (op == ReduceOp::avg) bound /= static_cast<double>(ranks);
    if (std::fabs(got.value(e) - want.value(e)) > bound) {
      return "element " + std::to_string(e) + ": got " + got.show(e) + ", want " + want.show(e) + " within " +
             std::to_string(bound);
    }
  }
  return "";
}

}  // namespace

// --- bfloat16 ----------------------------------------------------------------

namespace {

uint16_t bf16_of_bits(uint32_t float_bits) { return float_to_bf16(std::bit_cast<float>(float_bits)); }

/// Round-to-nearest-even written the slow way: the two bf16 neighbours of
/// the magnitude, compared by distance in double (the one past the largest
/// finite bf16 counts as 2^128, where IEEE puts the overflow threshold).
uint16_t slow_bf16(uint32_t float_bits) {
  uint32_t sign = float_bits & 0x80000000u;
  uint32_t magnitude = float_bits & 0x7fffffffu;
  double x = std::bit_cast<float>(magnitude);
  auto lo = static_cast<uint16_t>(magnitude >> 16);
  auto hi = static_cast<uint16_t>(lo + 1);
  double lo_v = bf16_to_float(lo);
  double hi_v = hi == 0x7f80 ? std::ldexp(1.0, 128) : static_cast<double>(bf16_to_float(hi));
  uint16_t pick;
  if (x - lo_v < hi_v - x) {
    pick = lo;
  } else if (x - lo_v > hi_v - x) {
    pick = hi;
  } else {
    pick = (lo & 1) ? hi : lo;
  }
  return static_cast<uint16_t>(pick | (sign >> 16));
}

}  // namespace

TEST_CASE("bf16: conversion rounds to nearest, ties to even", "[collectives]") {
  CHECK(bf16_of_bits(0x3f800000) == 0x3f80);  // 1.0 exactly
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  // Halfway between 0x3f80 and 0x3f81: the even one.
  CHECK(bf16_of_bits(0x3f808000) == 0x3f80);
  // Halfway between 0x3f81 and 0x3f82: the even one is above.
  CHECK(bf16_of_bits(0x3f818000) == 0x3f82);
  CHECK(bf16_of_bits(0x3f808001) == 0x3f81);  // just past halfway
  CHECK(bf16_of_bits(0x3f807fff) == 0x3f80);  // just short of halfway
  CHECK(bf16_of_bits(0xbf808000) == 0xbf80);  // negative tie
  CHECK(bf16_of_bits(0xbf818000) == 0xbf82);
  CHECK(bf16_of_bits(0x3fff8000) == 0x4000);  // carry into the exponent
  CHECK(bf16_of_bits(0x00018000) == 0x0002);  // subnormal tie, up to even
  CHECK(bf16_of_bits(0x00008000) == 0x0000);  // subnormal tie, down to zero
  CHECK(bf16_of_bits(0x80000000) == 0x8000);  // -0 keeps its sign
}

TEST_CASE("bf16: infinities stay infinite and overflow rounds to infinity", "[collectives]") {
  float inf = std::numeric_limits<float>::infinity();
  CHECK(float_to_bf16(inf) == 0x7f80);
  CHECK(float_to_bf16(-inf) == 0xff80);
  CHECK(bf16_to_float(0x7f80) == inf);
  CHECK(bf16_to_float(0xff80) == -inf);
  CHECK(bf16_of_bits(0x7f7f7fff) == 0x7f7f);  // below the threshold: largest finite bf16
  CHECK(bf16_of_bits(0x7f7f8000) == 0x7f80);  // the threshold is a tie, and 0x7f7f is odd
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(float_to_bf16(-std::numeric_limits<float>::max()) == 0xff80);
}

TEST_CASE("bf16: a NaN stays a NaN, with its sign, even when its payload is cut", "[collectives]") {
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fffffffu, 0xffc00000u}) {
    CAPTURE(bits);
    uint16_t b = bf16_of_bits(bits);
    CHECK(std::isnan(bf16_to_float(b)));
    CHECK((b & 0x8000) == ((bits >> 16) & 0x8000));
  }
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("bf16: every bf16 survives a round trip through float", "[collectives]") {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    float f = bf16_to_float(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      CHECK(std::isnan(bf16_to_float(float_to_bf16(f))));
    } else if (float_to_bf16(f) != b) {
      FAIL("bf16 0x" << std::hex << b << " came back as 0x" << float_to_bf16(f));
    }
  }
}

TEST_CASE("bf16: conversion matches a slow nearest-even reference on many floats", "[collectives]") {
  std::mt19937_64 rng(7);
  size_t mismatches = 0;
  for (int i = 0; i < 1'000'000; ++i) {
    auto bits = static_cast<uint32_t>(rng());
    // Half of them near a tie, where rounding goes wrong.
    if (i % 2 == 0) bits = (bits & 0xffff0000u) | 0x8000u | (bits & 1u);
    if ((bits & 0x7fffffffu) > 0x7f800000u) continue;  // NaN: its own test
    if (bf16_of_bits(bits) != slow_bf16(bits)) {
      if (++mismatches <= 5) WARN("bits 0x" << std::hex << bits);
    }
  }
  CHECK(mismatches == 0);
}

// --- reduction kernels ---------------------------------------------------------

TEST_CASE("reduce: every length, blocked or tail, matches an element at a time", "[collectives]") {
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (size_t count = 0; count <= 40; ++count) {
        CAPTURE(std::string(dtype_name(dtype)), std::string(op_name(op)), count);
        auto in = make_inputs(dtype, 2, count, Data::general, count);
        Buffer whole = in[0];
        reduce_into(dtype, op, whole.at(0), in[1].at(0), count);
        Buffer one_by_one = in[0];
        for (size_t e = 0; e < count; ++e) reduce_into(dtype, op, one_by_one.at(e), in[1].at(e), 1);
        std::string diff = bitwise_diff(whole, one_by_one);
        INFO(diff);
        CHECK(diff.empty());
      }
    }
  }
}

TEST_CASE("reduce: reduce_to writes, bit for bit, what reduce_into leaves in place", "[collectives]") {
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{1001}}) {
        CAPTURE(std::string(dtype_name(dtype)), std::string(op_name(op)), count);
        auto in = make_inputs(dtype, 2, count, Data::general, count + 7);
        Buffer in_place = in[0];
        reduce_into(dtype, op, in_place.at(0), in[1].at(0), count);
        Buffer elsewhere(dtype, count);
        reduce_to(dtype, op, elsewhere.at(0), in[0].at(0), in[1].at(0), count);
        std::string diff = bitwise_diff(elsewhere, in_place);
        INFO(diff);
        CHECK(diff.empty());
      }
    }
  }
}

TEST_CASE("reduce: integer sums wrap and integer averages truncate toward zero", "[collectives]") {
  int32_t a[] = {INT32_MAX, -7, 7, INT32_MIN};
  int32_t b[] = {1, 0, 0, -1};
  reduce_into(DType::int32, ReduceOp::sum, reinterpret_cast<std::byte*>(a), reinterpret_cast<std::byte*>(b), 4);
  CHECK(a[0] == INT32_MIN);
  CHECK(a[3] == INT32_MAX);
  finish_avg(DType::int32, reinterpret_cast<std::byte*>(a), 4, 2);
  CHECK(a[1] == -3);
  CHECK(a[2] == 3);

  int64_t c[] = {INT64_MAX, 10};
  int64_t d[] = {1, -5};
  reduce_into(DType::int64, ReduceOp::sum, reinterpret_cast<std::byte*>(c), reinterpret_cast<std::byte*>(d), 2);
  CHECK(c[0] == INT64_MIN);
  CHECK(c[1] == 5);
}

TEST_CASE("reduce: max and min of floats give NaN when either side is NaN", "[collectives]") {
  float nan = std::numeric_limits<float>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::max, ReduceOp::min}) {
    CAPTURE(std::string(op_name(op)));
    float dst[] = {nan, 1.0f, 1.0f, -2.0f};
    float src[] = {1.0f, nan, 3.0f, 5.0f};
    reduce_into(DType::float32, op, reinterpret_cast<std::byte*>(dst), reinterpret_cast<std::byte*>(src), 4);
    CHECK(std::isnan(dst[0]));
    CHECK(std::isnan(dst[1]));
    CHECK(dst[2] == (op == ReduceOp::max ? 3.0f : 1.0f));
    CHECK(dst[3] == (op == ReduceOp::max ? 5.0f : -2.0f));

    uint16_t bdst[] = {float_to_bf16(nan), float_to_bf16(1.0f), float_to_bf16(1.0f)};
    uint16_t bsrc[] = {float_to_bf16(1.0f), float_to_bf16(nan), float_to_bf16(3.0f)};
    reduce_into(DType::bfloat16, op, reinterpret_cast<std::byte*>(bdst), reinterpret_cast<std::byte*>(bsrc), 3);
    CHECK(std::isnan(bf16_to_float(bdst[0])));
    CHECK(std::isnan(bf16_to_float(bdst[1])));
    CHECK(bf16_to_float(bdst[2]) == (op == ReduceOp::max ? 3.0f : 1.0f));
  }
}

TEST_CASE("reduce: bf16 sums round once per combine, in float", "[collectives]") {
  // 256 + 1 is a tie in bf16 (8 significant bits): it rounds to even, 256.
  uint16_t dst[] = {float_to_bf16(256.0f), float_to_bf16(256.0f)};
  uint16_t src[] = {float_to_bf16(1.0f), float_to_bf16(3.0f)};
  reduce_into(DType::bfloat16, ReduceOp::sum, reinterpret_cast<std::byte*>(dst), reinterpret_cast<std::byte*>(src), 2);
  CHECK(bf16_to_float(dst[0]) == 256.0f);
  CHECK(bf16_to_float(dst[1]) == 260.0f);  // 259 is a tie between 258 and 260: 260 is even
  finish_avg(DType::bfloat16, reinterpret_cast<std::byte*>(dst), 2, 3);
  CHECK(dst[1] == float_to_bf16(260.0f / 3.0f));
}

// --- ring schedules --------------------------------------------------------------

TEST_CASE("ring: segments tile the buffer, longer ones first, sizes within one", "[collectives]") {
  for (size_t ranks : {1, 2, 3, 4, 7, 8, 13}) {
    for (size_t count : {0, 1, 5, 7, 12, 64, 1001}) {
      CAPTURE(ranks, count);
      size_t next = 0;
      for (size_t s = 0; s < ranks; ++s) {
        ElemRange seg = ring_segment(count, ranks, s);
        CHECK(seg.offset_elems == next);
        CHECK(seg.len_elems == count / ranks + (s < count % ranks ? 1 : 0));
        next = seg.offset_elems + seg.len_elems;
      }
      CHECK(next == count);
    }
  }
}

TEST_CASE("ring: schedules have (n-1) steps per phase, chunks within the bound, matched sends", "[collectives]") {
  for (size_t ranks : kRanks) {
    for (size_t count : kCounts) {
      for (size_t max_chunk : kMaxChunkElems) {
        CAPTURE(ranks, count, max_chunk);
        size_t longest = (count + ranks - 1) / ranks;
        size_t chunks = (longest + max_chunk - 1) / max_chunk;
        size_t phase_steps = count == 0 ? 0 : (ranks - 1) * chunks;
        auto allreduce = all_ranks(ring_allreduce_schedule, ranks, count, max_chunk);
        auto reduce_scatter = all_ranks(ring_reduce_scatter_schedule, ranks, count, max_chunk);
        auto allgather = all_ranks(ring_allgather_schedule, ranks, count, max_chunk);
        for (size_t r = 0; r < ranks; ++r) {
          CHECK(allreduce[r].chunks_per_step == chunks);
          CHECK(allreduce[r].send_to == (r + 1) % ranks);
          CHECK(allreduce[r].recv_from == (r + ranks - 1) % ranks);
          REQUIRE(allreduce[r].steps.size() == 2 * phase_steps);
          REQUIRE(reduce_scatter[r].steps.size() == phase_steps);
          REQUIRE(allgather[r].steps.size() == phase_steps);
          for (size_t i = 0; i < allreduce[r].steps.size(); ++i) {
            const RingStep& step = allreduce[r].steps[i];
            CHECK(step.send.len_elems <= max_chunk);
            CHECK(step.recv.len_elems <= max_chunk);
            CHECK(step.recv_mode == (i < phase_steps ? RecvMode::reduce : RecvMode::copy));
            // Allreduce is reduce_scatter followed by allgather, step for step.
            const RingStep& alone = i < phase_steps ? reduce_scatter[r].steps[i] : allgather[r].steps[i - phase_steps];
            CHECK(step.send == alone.send);
            CHECK(step.recv == alone.recv);
            CHECK(step.recv_mode == alone.recv_mode);
            // What this rank sends, the next receives at the same index.
            CHECK(allreduce[(r + 1) % ranks].steps[i].recv == step.send);
          }
        }
      }
    }
  }
}

TEST_CASE("ring: C steps may be in flight: conflicting accesses are at least C steps apart", "[collectives]") {
  // A step reads its send range and writes its recv range. Running steps in
  // order with step i done before step i + C starts (ring.h) is correct iff
  // two steps closer than C never touch the same element with a write; and
  // the send of step i is what step i - C received (the pipeline).
  auto overlap = [](ElemRange a, ElemRange b) {
    return a.len_elems > 0 && b.len_elems > 0 && a.offset_elems < b.offset_elems + b.len_elems &&
           b.offset_elems < a.offset_elems + a.len_elems;
  };
  for (size_t ranks : kRanks) {
    for (size_t count : kCounts) {
      for (size_t max_chunk : kMaxChunkElems) {
        CAPTURE(ranks, count, max_chunk);
        for (size_t r = 0; r < ranks; ++r) {
          RingSchedule s = ring_allreduce_schedule(ranks, r, count, max_chunk);
          size_t c = s.chunks_per_step;
          size_t conflicts = 0;
          for (size_t i = 0; i < s.steps.size(); ++i) {
            const RingStep& a = s.steps[i];
            if (overlap(a.send, a.recv)) ++conflicts;
            if (i >= c && !(a.send == s.steps[i - c].recv)) ++conflicts;
            for (size_t j = i + 1; j < std::min(i + c, s.steps.size()); ++j) {
              const RingStep& b = s.steps[j];
              if (overlap(a.recv, b.recv) || overlap(a.recv, b.send) || overlap(a.send, b.recv)) ++conflicts;
            }
          }
          CHECK(conflicts == 0);
        }
      }
    }
  }
}

TEST_CASE("ring: allreduce gives every rank the reduction, for every op, dtype and shape", "[collectives]") {
  uint64_t seed = 1;
  for (DType dtype : kDTypes) {
    for (Data data : {Data::exact, Data::general}) {
      if (!is_float(dtype) && data == Data::exact) continue;  // integers are exact anyway
      for (ReduceOp op : kOps) {
        for (size_t ranks : kRanks) {
          for (size_t count : kCounts) {
            auto inputs = make_inputs(dtype, ranks, count, data, ++seed);
            Buffer ring_order = ring_order_reference(inputs, op);
            std::vector<double> abs_sum;
            Buffer rank_order = rank_order_reference(inputs, op, &abs_sum);
            bool order_free = !is_float(dtype) || data == Data::exact || op == ReduceOp::max || op == ReduceOp::min;
            for (size_t max_chunk : kMaxChunkElems) {
              CAPTURE(std::string(dtype_name(dtype)), data == Data::exact, std::string(op_name(op)), ranks, count,
                      max_chunk);
              auto schedules = all_ranks(ring_allreduce_schedule, ranks, count, max_chunk);
              std::vector<Buffer> buffers = inputs;
              run_ring(schedules, buffers, op);
              for (size_t r = 0; r < ranks; ++r) {
                CAPTURE(r);
                if (op == ReduceOp::avg) finish_avg(dtype, buffers[r].at(0), count, ranks);
                std::string diff = bitwise_diff(buffers[r], ring_order);
                INFO("ring order: " << diff);
                CHECK(diff.empty());
                diff = order_free ? bitwise_diff(buffers[r], rank_order)
                                  : bound_diff(buffers[r], rank_order, abs_sum, ranks, op);
                INFO("rank order: " << diff);
                CHECK(diff.empty());
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("ring: reduce_scatter leaves rank r with segment r reduced", "[collectives]") {
  uint64_t seed = 1000;
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (size_t ranks : kRanks) {
        for (size_t count : kCounts) {
          auto inputs = make_inputs(dtype, ranks, count, Data::general, ++seed);
          Buffer want = ring_order_reference(inputs, op);
          for (size_t max_chunk : kMaxChunkElems) {
            CAPTURE(std::string(dtype_name(dtype)), std::string(op_name(op)), ranks, count, max_chunk);
            auto schedules = all_ranks(ring_reduce_scatter_schedule, ranks, count, max_chunk);
            std::vector<Buffer> buffers = inputs;
            run_ring(schedules, buffers, op);
            for (size_t r = 0; r < ranks; ++r) {
              CAPTURE(r);
              ElemRange mine = ring_segment(count, ranks, r);
              if (op == ReduceOp::avg) finish_avg(dtype, buffers[r].at(mine.offset_elems), mine.len_elems, ranks);
              std::string diff = bitwise_diff(buffers[r], want, mine);
              INFO(diff);
              CHECK(diff.empty());
            }
          }
        }
      }
    }
  }
}

TEST_CASE("ring: allgather gives every rank every rank's segment", "[collectives]") {
  uint64_t seed = 2000;
  for (DType dtype : kDTypes) {
    for (size_t ranks : kRanks) {
      for (size_t count : kCounts) {
        // Rank r contributes segment r of its own input; the rest of its
        // buffer starts as another rank's data, which must all be overwritten.
        auto inputs = make_inputs(dtype, ranks, count, Data::general, ++seed);
        Buffer want(dtype, count);
        for (size_t r = 0; r < ranks; ++r) {
          ElemRange seg = ring_segment(count, ranks, r);
          if (seg.len_elems > 0)
            std::memcpy(want.at(seg.offset_elems), inputs[r].at(seg.offset_elems), seg.len_elems * dtype_size(dtype));
        }
        for (size_t max_chunk : kMaxChunkElems) {
          CAPTURE(std::string(dtype_name(dtype)), ranks, count, max_chunk);
          auto schedules = all_ranks(ring_allgather_schedule, ranks, count, max_chunk);
          std::vector<Buffer> buffers = inputs;
          // The op is unused: allgather only copies.
          run_ring(schedules, buffers, ReduceOp::sum);
          for (size_t r = 0; r < ranks; ++r) {
            CAPTURE(r);
            std::string diff = bitwise_diff(buffers[r], want);
            INFO(diff);
            CHECK(diff.empty());
          }
        }
      }
    }
  }
}

// --- tree broadcast and barrier ------------------------------------------------------

TEST_CASE("tree: broadcast reaches every rank from any root in ceil(log2 n) rounds", "[collectives]") {
  for (size_t ranks : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17}) {
    std::set<size_t> roots = {0, 1 % ranks, ranks / 2, ranks - 1};
    for (size_t root : roots) {
      CAPTURE(ranks, root);
      std::vector<std::vector<TreeStep>> schedules;
      for (size_t r = 0; r < ranks; ++r) schedules.push_back(tree_broadcast_schedule(ranks, root, r));
      size_t sends = 0;
      for (size_t r = 0; r < ranks; ++r) {
        const auto& s = schedules[r];
        size_t recvs = std::count_if(s.begin(), s.end(), [](const TreeStep& t) { return t.op == TreeOp::recv; });
        sends += s.size() - recvs;
        CHECK(recvs == (r == root ? 0 : 1));
        if (r != root) CHECK((!s.empty() && s.front().op == TreeOp::recv));
      }
      CHECK(sends == ranks - 1);

      // Rounds of rendezvous: a send completes with its peer's matching
      // recv, and each rank does at most one of its steps per round.
      std::vector<size_t> next(ranks, 0);
      std::vector<int> value(ranks, -1);
      value[root] = 42;
      size_t rounds = 0;
      auto done = [&] {
        for (size_t r = 0; r < ranks; ++r) {
          if (next[r] < schedules[r].size()) return false;
        }
        return true;
      };
      while (!done()) {
        std::vector<bool> busy(ranks, false);
        bool progressed = false;
        for (size_t r = 0; r < ranks; ++r) {
          if (busy[r] || next[r] == schedules[r].size() || schedules[r][next[r]].op != TreeOp::send) continue;
          size_t peer = schedules[r][next[r]].peer;
          if (busy[peer] || next[peer] == schedules[peer].size()) continue;
          if (!(schedules[peer][next[peer]] == TreeStep{r, TreeOp::recv})) continue;
          REQUIRE(value[r] == 42);  // a rank forwards only what it has
          value[peer] = value[r];
          busy[r] = busy[peer] = true;
          ++next[r];
          ++next[peer];
          progressed = true;
        }
        REQUIRE(progressed);  // otherwise the schedules deadlock
        ++rounds;
      }
      CHECK(rounds <= ceil_log2(ranks));
      CHECK(std::count(value.begin(), value.end(), 42) == static_cast<long>(ranks));
    }
  }
}

/// Rounds a pipelined broadcast of `chunks` chunks takes over `trees` (one
/// BroadcastTree a rank, root `root`) when each rank's link sends one chunk
/// a round, chunk by chunk and child by child within a chunk, and a chunk
/// goes on the round after it came. (The engine sends child by child, as
/// far as each one's window goes; on a link shared by the children that
/// comes to the same rounds.) Checks on the way
/// that every rank gets every chunk once, in order, from its parent, and
/// only what its sender had.
size_t pipelined_rounds(const std::vector<BroadcastTree>& trees, size_t root, size_t chunks) {
  size_t ranks = trees.size();
  std::vector<size_t> have(ranks, 0);
  have[root] = chunks;
  std::vector<size_t> next(ranks, 0);  // index into (chunk, child) order
  size_t rounds = 0;
  auto all_home = [&] { return std::all_of(have.begin(), have.end(), [&](size_t h) { return h == chunks; }); };
  while (!all_home()) {
    std::vector<std::pair<size_t, size_t>> arrivals;  // (rank, chunk)
    for (size_t r = 0; r < ranks; ++r) {
      const auto& kids = trees[r].children;
      if (kids.empty() || next[r] == chunks * kids.size()) continue;
      size_t chunk = next[r] / kids.size();
      if (chunk >= have[r]) continue;  // not here yet
      arrivals.emplace_back(kids[next[r] % kids.size()], chunk);
      ++next[r];
    }
    REQUIRE(!arrivals.empty());  // otherwise the tree deadlocks
    for (auto [r, chunk] : arrivals) {
      REQUIRE(have[r] == chunk);  // in order, once each
      ++have[r];
    }
    ++rounds;
  }
  return rounds;
}

TEST_CASE("broadcast tree: chunks go down the faster of the binomial tree and the chain, every rank getting each once "
          "in order",
          "[collectives]") {
  for (size_t ranks : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17}) {
    std::set<size_t> roots = {0, 1 % ranks, ranks - 1};
    for (size_t root : roots) {
      for (size_t chunks : {1, 2, 3, 4, 5, 8, 64}) {
        CAPTURE(ranks, root, chunks);
        std::vector<BroadcastTree> trees;
        for (size_t r = 0; r < ranks; ++r) trees.push_back(broadcast_tree(ranks, root, r, chunks));
        // A tree: the root has no parent, every other rank one, which lists
        // it among its children; n - 1 edges in all.
        size_t edges = 0;
        for (size_t r = 0; r < ranks; ++r) {
          CHECK(trees[r].parent.has_value() == (r != root));
          if (trees[r].parent) {
            const auto& siblings = trees[*trees[r].parent].children;
            CHECK(std::count(siblings.begin(), siblings.end(), r) == 1);
          }
          edges += trees[r].children.size();
        }
        CHECK(edges == ranks - 1);
        // The binomial tree's root sends every chunk ceil(log2 n) times;
        // the chain fills its pipeline in n - 2 chunk times and then moves
        // one chunk a round. The shape taken is the faster one.
        size_t depth = ceil_log2(ranks);
        size_t binomial = chunks * depth, chain = ranks < 2 ? 0 : chunks + ranks - 2;
        size_t rounds = pipelined_rounds(trees, root, chunks);
        CHECK(rounds == std::min(binomial, chain));
        CHECK(broadcast_uses_chain(ranks, chunks) == (chain < binomial));
      }
    }
  }
}

TEST_CASE("barrier: after ceil(log2 n) rounds every rank has heard from every other", "[collectives]") {
  for (size_t ranks : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 100}) {
    CAPTURE(ranks);
    std::vector<std::vector<BarrierRound>> schedules;
    for (size_t r = 0; r < ranks; ++r) schedules.push_back(barrier_schedule(ranks, r));
    size_t rounds = ceil_log2(ranks);
    // Who each rank has heard from, directly or through a chain; a round's
    // token carries what its sender knew before the round.
    std::vector<std::vector<bool>> heard(ranks, std::vector<bool>(ranks, false));
    for (size_t r = 0; r < ranks; ++r) heard[r][r] = true;
    for (size_t k = 0; k < rounds; ++k) {
      auto before = heard;
      for (size_t r = 0; r < ranks; ++r) {
        REQUIRE(schedules[r].size() == rounds);
        const BarrierRound& round = schedules[r][k];
        CHECK(schedules[round.send_to][k].recv_from == r);  // every token is awaited
        for (size_t x = 0; x < ranks; ++x) heard[r][x] = heard[r][x] || before[round.recv_from][x];
      }
    }
    for (size_t r = 0; r < ranks; ++r) {
      CAPTURE(r);
      CHECK(std::count(heard[r].begin(), heard[r].end(), true) == static_cast<long>(ranks));
    }
  }
}
