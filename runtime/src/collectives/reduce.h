// The elementwise reductions of the CPU collectives: combine a received
// chunk into the local one, and finish an average. Plain loops over plain
// buffers, no I/O, so that the transport only moves bytes and every kernel is
// checked against a reference in test/runtime/collectives_algo_test.cc.
//
// bfloat16 is reduced in float and rounded back after every combine, so a
// ring of n ranks rounds n - 1 times per element: the order of the
// combines is part of the result (ring.h fixes it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "troupe/collectives.h"

namespace troupe::collectives {

/// The float that the bfloat16 `bits` denote (exact: bf16 is a truncated float).
float bf16_to_float(uint16_t bits);

/// `value` rounded to the nearest bfloat16, ties to even; infinities stay
/// infinite, finite values past the largest bf16 round to infinity, and a NaN
/// stays a NaN (quiet, same sign) even when its payload sits only in the low
/// 16 bits that are cut.
uint16_t float_to_bf16(float value);

/// dst[i] = op(dst[i], src[i]) for i < count_elems; avg accumulates as sum
/// (finish_avg divides once at the end).
/// REQUIRES: dst and src hold `count_elems` elements of `dtype`, each aligned
/// to dtype_size(dtype), and do not overlap.
void reduce_into(DType dtype, ReduceOp op, std::byte* dst, const std::byte* src, size_t count_elems);

/// dst[i] = op(a[i], b[i]) for i < count_elems: reduce_into with the result
/// written elsewhere (the same element functions, the same rounding), for a
/// combine whose result goes straight on (into the next rank's slot).
/// REQUIRES: as reduce_into, for three buffers none of which overlap.
void reduce_to(DType dtype, ReduceOp op, std::byte* dst, const std::byte* a, const std::byte* b, size_t count_elems);

/// dst[i] = op(...op(op(srcs[0][i], srcs[1][i]), srcs[2][i])..., srcs[n-1][i])
/// for i < count_elems: `n_srcs` buffers folded in that order with
/// reduce_into's element functions (so bfloat16 rounds after every combine,
/// as along a ring). The host arena's reduce: position r of every rank's slot.
/// REQUIRES: n_srcs >= 1; every buffer aligned to dtype_size(dtype); dst is
/// one of srcs or overlaps none of them, and the srcs do not overlap dst.
void reduce_many(DType dtype, ReduceOp op, std::byte* dst, const std::byte* const* srcs, size_t n_srcs,
                 size_t count_elems);

/// data[i] /= ranks for i < count_elems: turns the sum an avg accumulated
/// into the mean (integers truncate toward zero; bfloat16 divides in float
/// and rounds once).
/// REQUIRES: ranks >= 1; data aligned to dtype_size(dtype).
void finish_avg(DType dtype, std::byte* data, size_t count_elems, size_t ranks);

}  // namespace troupe::collectives
