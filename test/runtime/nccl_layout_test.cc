// The part of the NCCL communicator that needs no GPU: where NCCL's in-place
// reduce_scatter and allgather put each rank's segment, checked against the
// ring layout that CollectiveKind promises (ring_segment), and the counts
// NCCL cannot lay out that way. The communicator itself is in
// test/gpu/nccl_comm_gpu_test.cc; here, builds without NCCL answer
// unsupported.
#include <cstddef>
#include <string>

#include <catch2/catch.hpp>

#include "collectives/nccl_comm.h"
#include "collectives/ring.h"

using troupe::CollectiveKind;
using troupe::ErrorCode;
using troupe::collectives::ElemRange;
using troupe::collectives::nccl_in_place_segment;
using troupe::collectives::ring_segment;

namespace {
int a_host_int = 0;  // host memory
}  // namespace

TEST_CASE("nccl layout: with a count the group size divides, every rank's segment is the ring segment",
          "[collectives][nccl]") {
  for (CollectiveKind kind : {CollectiveKind::reduce_scatter, CollectiveKind::allgather}) {
    for (size_t ranks = 1; ranks <= 9; ++ranks) {
      for (size_t count : {size_t{0}, ranks, 7 * ranks, 1024 * ranks}) {
        size_t covered = 0;
        for (size_t rank = 0; rank < ranks; ++rank) {
          auto seg = nccl_in_place_segment(kind, count, ranks, rank);
          INFO("ranks " << ranks << " count " << count << " rank " << rank);
          REQUIRE(seg.has_value());
          // NCCL's in-place rule: recvbuff = sendbuff + rank * recvcount.
          CHECK(*seg == ElemRange{rank * (count / ranks), count / ranks});
          CHECK(*seg == ring_segment(count, ranks, rank));
          covered += seg->len_elems;
        }
        CHECK(covered == count);
      }
    }
  }
}

TEST_CASE("nccl layout: reduce_scatter and allgather of a count the group size does not divide are refused",
          "[collectives][nccl]") {
  for (CollectiveKind kind : {CollectiveKind::reduce_scatter, CollectiveKind::allgather}) {
    auto seg = nccl_in_place_segment(kind, 10, 4, 1);
    REQUIRE_FALSE(seg.has_value());
    CHECK(seg.error().code() == ErrorCode::invalid_argument);
    // Says what is wrong and what to do.
    CHECK_THAT(seg.error().message(), Catch::Contains("multiple of the group size"));
    CHECK_THAT(seg.error().message(), Catch::Contains("pad the buffer to 12 elements"));
  }
  CHECK_FALSE(nccl_in_place_segment(CollectiveKind::reduce_scatter, 3, 4, 0).has_value());  // fewer than ranks
}

TEST_CASE("nccl layout: allreduce, broadcast and barrier use the whole buffer, whatever the count",
          "[collectives][nccl]") {
  for (CollectiveKind kind : {CollectiveKind::allreduce, CollectiveKind::broadcast, CollectiveKind::barrier}) {
    auto seg = nccl_in_place_segment(kind, 10, 4, 3);
    REQUIRE(seg.has_value());
    CHECK(*seg == ElemRange{0, 10});
  }
}

TEST_CASE("nccl: without a GPU or without NCCL, starting a communicator is a clear error, not a crash",
          "[collectives][nccl]") {
  using troupe::collectives::NcclComm;
  CHECK(NcclComm::is_device_pointer(nullptr) == false);
  CHECK(NcclComm::is_device_pointer(&a_host_int) == false);
  auto id = troupe::collectives::nccl_unique_id();
  if (!id) {  // a build without NCCL
    CHECK(id.error().code() == ErrorCode::unsupported);
    CHECK_THAT(id.error().message(), Catch::StartsWith("nccl: "));
    return;
  }
  CHECK(id->size() == troupe::collectives::kNcclUniqueIdBytes);
  auto comm = NcclComm::start(*id, 0, 1, 0);
  if (comm) {  // a GPU is here: test/gpu covers the communicator
    (*comm)->abort();
    return;
  }
  CHECK(comm.error().code() == ErrorCode::unsupported);
  CHECK_THAT(comm.error().message(), Catch::Contains("no CUDA device here"));
}
