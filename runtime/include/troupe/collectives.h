// CPU collectives over an actor mesh: the element types and reductions they
// work on. Every collective runs on one contiguous buffer of `count_elems`
// elements of a single DType per rank; allreduce, reduce_scatter and
// allgather split it into one segment per rank and move it round a ring
// (bandwidth-optimal), broadcast goes down a binomial tree and the barrier
// uses dissemination rounds (both latency-optimal, O(log n) rounds).
//
// This header is the vocabulary shared by the schedules, the reduction
// kernels and (later) the transport; it holds no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace troupe {

/// The element type of a collective's buffer. Fixed-width so that a
/// buffer's bytes mean the same on every rank of a mesh.
enum class DType : uint8_t {
  float32,   ///< IEEE-754 binary32.
  bfloat16,  ///< The top 16 bits of a binary32; reduced in float, rounded to nearest even.
  int32,     ///< Two's complement; sums wrap on overflow, as on a GPU.
  int64,     ///< Two's complement; sums wrap on overflow, as on a GPU.
};

/// Bytes per element of `dtype`, for turning element counts into byte sizes.
constexpr size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::float32: return 4;
    case DType::bfloat16: return 2;
    case DType::int32: return 4;
    case DType::int64: return 8;
  }
  return 0;  // unreachable for a valid enumerator; -Wswitch flags a new one
}

/// The dtype's name as PyTorch spells it ("float32", "bfloat16"), for logs
/// and error messages.
constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::bfloat16: return "bfloat16";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
  }
  return "unknown";
}

/// How allreduce and reduce_scatter combine the ranks' elements. The result
/// of sum and avg on floating types depends on the order of the additions,
/// which the algorithm (ring, tree) fixes; max and min do not.
enum class ReduceOp : uint8_t {
  sum,
  avg,  ///< Sum, then one division by the number of ranks (truncating for integers).
  max,  ///< NaN wins: a NaN on any rank gives NaN, so a diverged value is never hidden.
  min,  ///< NaN wins, as for max.
};

/// The op's name ("sum", "avg", "max", "min"), for logs and error messages.
constexpr std::string_view op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "unknown";
}

}  // namespace troupe
