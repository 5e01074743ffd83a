// NCCL communicators on one GPU: a single-rank group (NCCL refuses two ranks
// on one device), so every collective's result is the input itself; what is
// checked is that init and collectives complete through polls within a
// deadline, that the in-place calls reach NCCL with valid arguments, and
// that misuse is a clear error. Layouts for several ranks are checked without
// a GPU in test/runtime/nccl_layout_test.cc.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "collectives/nccl_comm.h"

using troupe::CollectiveKind;
using troupe::DType;
using troupe::ErrorCode;
using troupe::ReduceOp;
using troupe::collectives::NcclComm;
using troupe::collectives::Poll;

namespace {

// Init loads NCCL's kernels and makes a CUDA context on first use: seconds,
// not minutes.
constexpr auto kDeadline = std::chrono::seconds(60);

/// Device memory, freed on scope exit.
struct DeviceBytes {
  void* ptr = nullptr;
  explicit DeviceBytes(size_t n) { REQUIRE(cudaMalloc(&ptr, n) == cudaSuccess); }
  ~DeviceBytes() { cudaFree(ptr); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

/// Polls `poll` until it is no longer pending or the deadline passes (then
/// the last, pending, answer). NcclComm is poll-only by design: this is the
/// wait on its events, with a timeout.
template <class F>
Poll wait_for(F&& poll) {
  auto deadline = std::chrono::steady_clock::now() + kDeadline;
  Poll p = poll();
  while (p.pending() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
    p = poll();
  }
  return p;
}

/// A ready single-rank communicator on device 0.
std::unique_ptr<NcclComm> single_rank_comm() {
  auto id = troupe::collectives::nccl_unique_id();
  REQUIRE(id.has_value());
  auto comm = NcclComm::start(*id, 0, 1, 0);
  INFO((comm ? std::string() : comm.error().to_string()));
  REQUIRE(comm.has_value());
  Poll init = wait_for([&] { return (*comm)->init_state(); });
  INFO(init.status.to_string());
  REQUIRE(init.done());
  return std::move(*comm);
}

/// `n` bytes with a pattern every dtype can hold bit for bit (no NaN, no
/// bfloat16 or float32 whose bits change when passed through a reduction
/// with itself alone).
std::vector<uint8_t> pattern_bytes(DType dtype, size_t count) {
  std::vector<uint8_t> bytes(count * troupe::dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::float32: {
        float v = static_cast<float>(i % 1000) * 0.25f - 100.0f;
        std::memcpy(bytes.data() + 4 * i, &v, 4);
        break;
      }
      case DType::bfloat16: {
        float v = static_cast<float>(i % 200) - 100.0f;  // small integers are exact in bfloat16
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        auto top = static_cast<uint16_t>(bits >> 16);
        std::memcpy(bytes.data() + 2 * i, &top, 2);
        break;
      }
      case DType::int32: {
        auto v = static_cast<int32_t>(i * 7919) - 1'000'000;
        std::memcpy(bytes.data() + 4 * i, &v, 4);
        break;
      }
      case DType::int64: {
        auto v = static_cast<int64_t>(i) * 1'000'000'007 - (int64_t{1} << 40);
        std::memcpy(bytes.data() + 8 * i, &v, 8);
        break;
      }
    }
  }
  return bytes;
}

/// Runs one collective on a device copy of `host`, waits for it, and returns
/// the device bytes afterwards.
std::vector<uint8_t> run_on_device(NcclComm& comm, CollectiveKind kind, const std::vector<uint8_t>& host, DType dtype,
                                   ReduceOp op) {
  DeviceBytes dev(host.size());
  REQUIRE(cudaMemcpy(dev.ptr, host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  troupe::Status s = comm.enqueue(kind, dev.ptr, host.size() / troupe::dtype_size(dtype), dtype, op, 0);
  INFO(s.to_string());
  REQUIRE(s.ok());
  Poll done = wait_for([&] { return comm.done_state(); });
  INFO(done.status.to_string());
  REQUIRE(done.done());
  std::vector<uint8_t> back(host.size());
  REQUIRE(cudaMemcpy(back.data(), dev.ptr, back.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  return back;
}

}  // namespace

TEST_CASE("nccl: a unique id is 128 bytes and a new one differs from the last", "[gpu][nccl]") {
  auto a = troupe::collectives::nccl_unique_id();
  auto b = troupe::collectives::nccl_unique_id();
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK(a->size() == 128);
  CHECK(b->size() == 128);
  CHECK(*a != *b);
}

TEST_CASE("nccl: a single-rank communicator's init completes within a deadline by polling", "[gpu][nccl]") {
  auto comm = single_rank_comm();
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);
  CHECK(comm->device() == 0);
  CHECK(comm->init_state().done());  // done stays done
  CHECK(comm->done_state().done());  // nothing enqueued yet
}

TEST_CASE("nccl: allreduce of every dtype and op on device memory gives the input on one rank", "[gpu][nccl]") {
  auto comm = single_rank_comm();  // one for all cases: an init costs far more than a collective
  for (DType dtype : {DType::float32, DType::bfloat16, DType::int32, DType::int64}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      for (size_t count : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
        INFO(troupe::dtype_name(dtype) << " " << troupe::op_name(op) << " count " << count);
        auto host = pattern_bytes(dtype, count);
        // One rank: sum, max and min of one value are the value, and avg divides by 1.
        CHECK(run_on_device(*comm, CollectiveKind::allreduce, host, dtype, op) == host);
      }
    }
  }
}

TEST_CASE("nccl: broadcast, allgather, reduce_scatter and barrier complete in place", "[gpu][nccl]") {
  auto comm = single_rank_comm();
  auto host = pattern_bytes(DType::float32, 4096);
  for (CollectiveKind kind : {CollectiveKind::broadcast, CollectiveKind::allgather, CollectiveKind::reduce_scatter}) {
    INFO("kind " << static_cast<int>(kind));
    CHECK(run_on_device(*comm, kind, host, DType::float32, ReduceOp::sum) == host);
  }
  REQUIRE(comm->enqueue(CollectiveKind::barrier, nullptr, 0, DType::float32, ReduceOp::sum, 0).ok());
  Poll done = wait_for([&] { return comm->done_state(); });
  INFO(done.status.to_string());
  CHECK(done.done());
}

TEST_CASE("nccl: many collectives enqueued back to back are all done when done_state says so", "[gpu][nccl]") {
  auto comm = single_rank_comm();
  auto host = pattern_bytes(DType::int32, 1 << 16);
  DeviceBytes dev(host.size());
  REQUIRE(cudaMemcpy(dev.ptr, host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  for (int i = 0; i < 50; ++i) {
    REQUIRE(comm->enqueue(CollectiveKind::allreduce, dev.ptr, host.size() / 4, DType::int32, ReduceOp::sum, 0).ok());
  }
  Poll done = wait_for([&] { return comm->done_state(); });
  INFO(done.status.to_string());
  REQUIRE(done.done());
  std::vector<uint8_t> back(host.size());
  REQUIRE(cudaMemcpy(back.data(), dev.ptr, back.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back == host);
}

TEST_CASE("nccl: collectives enqueued back to back are told finished one by one, oldest first, each exactly once",
          "[gpu][nccl]") {
  auto comm = single_rank_comm();
  auto host = pattern_bytes(DType::float32, 1 << 20);
  DeviceBytes dev(host.size());
  REQUIRE(cudaMemcpy(dev.ptr, host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  size_t told = 0;
  // Finished ones are taken while more are enqueued (with one event
  // re-recorded after every enqueue, none would be told done before the
  // enqueueing stopped).
  for (int i = 0; i < 200; ++i) {
    REQUIRE(comm->enqueue(CollectiveKind::allreduce, dev.ptr, host.size() / 4, DType::float32, ReduceOp::sum, 0).ok());
    auto finished = comm->take_finished();
    REQUIRE(finished.has_value());
    told += *finished;
    CHECK(told <= static_cast<size_t>(i) + 1);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (told < 200 && std::chrono::steady_clock::now() < deadline) {
    auto finished = comm->take_finished();
    REQUIRE(finished.has_value());
    told += *finished;
    std::this_thread::yield();
  }
  CHECK(told == 200);
  CHECK(comm->take_finished() == size_t{0});
  CHECK(comm->done_state().done());
}

TEST_CASE("nccl: a moved communicator keeps working", "[gpu][nccl]") {
  auto comm = single_rank_comm();
  NcclComm moved = std::move(*comm);
  auto host = pattern_bytes(DType::float32, 256);
  CHECK(run_on_device(moved, CollectiveKind::allreduce, host, DType::float32, ReduceOp::max) == host);
}

TEST_CASE("nccl: a unique id of the wrong length, a bad rank or a missing device is invalid_argument", "[gpu][nccl]") {
  auto short_id = NcclComm::start("not an id", 0, 1, 0);
  REQUIRE_FALSE(short_id.has_value());
  CHECK(short_id.error().code() == ErrorCode::invalid_argument);
  CHECK_THAT(short_id.error().message(), Catch::Contains("unique id is 9 bytes, not 128"));

  auto id = troupe::collectives::nccl_unique_id();
  REQUIRE(id.has_value());
  auto bad_rank = NcclComm::start(*id, 1, 1, 0);
  REQUIRE_FALSE(bad_rank.has_value());
  CHECK(bad_rank.error().code() == ErrorCode::invalid_argument);
  auto bad_device = NcclComm::start(*id, 0, 1, 4096);
  REQUIRE_FALSE(bad_device.has_value());
  CHECK(bad_device.error().code() == ErrorCode::invalid_argument);
  CHECK_THAT(bad_device.error().message(), Catch::Contains("device 4096 does not exist"));
}

TEST_CASE("nccl: a host buffer is refused before it reaches NCCL", "[gpu][nccl]") {
  auto comm = single_rank_comm();
  std::vector<float> host(1024, 1.0f);
  troupe::Status s =
      comm->enqueue(CollectiveKind::allreduce, host.data(), host.size(), DType::float32, ReduceOp::sum, 0);
  CHECK(s.code() == ErrorCode::invalid_argument);
  CHECK_THAT(s.message(), Catch::Contains("is not device memory"));
  CHECK(comm->done_state().done());  // the communicator is still fine
  CHECK(NcclComm::is_device_pointer(host.data()) == false);
}

TEST_CASE("nccl: device and managed memory are device pointers, host memory is not", "[gpu][nccl]") {
  DeviceBytes dev(4096);
  CHECK(NcclComm::is_device_pointer(dev.ptr) == true);
  void* managed = nullptr;
  REQUIRE(cudaMallocManaged(&managed, 4096) == cudaSuccess);
  CHECK(NcclComm::is_device_pointer(managed) == true);
  cudaFree(managed);
  int on_stack = 0;
  CHECK(NcclComm::is_device_pointer(&on_stack) == false);
  CHECK(NcclComm::is_device_pointer(nullptr) == false);
}

TEST_CASE("nccl: after abort every call fails with communicator aborted", "[gpu][nccl]") {
  auto comm = single_rank_comm();
  DeviceBytes dev(4096);
  comm->abort();
  comm->abort();  // a second abort does nothing
  troupe::Status s = comm->enqueue(CollectiveKind::allreduce, dev.ptr, 1024, DType::float32, ReduceOp::sum, 0);
  CHECK_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("communicator aborted"));
  Poll init = comm->init_state();
  CHECK(init.failed());
  CHECK_THAT(init.status.message(), Catch::Contains("communicator aborted"));
  Poll done = comm->done_state();
  CHECK(done.failed());
  CHECK_THAT(done.status.message(), Catch::Contains("communicator aborted"));
}

TEST_CASE("nccl: a communicator aborted while its init may still run is released cleanly", "[gpu][nccl]") {
  auto id = troupe::collectives::nccl_unique_id();
  REQUIRE(id.has_value());
  auto comm = NcclComm::start(*id, 0, 1, 0);
  REQUIRE(comm.has_value());
  (*comm)->abort();  // no wait for init: the caller's deadline may pass at once
  CHECK((*comm)->init_state().failed());
}

TEST_CASE("nccl: a broadcast root outside the group is invalid_argument", "[gpu][nccl]") {
  auto comm = single_rank_comm();
  DeviceBytes dev(4096);
  troupe::Status s = comm->enqueue(CollectiveKind::broadcast, dev.ptr, 1024, DType::float32, ReduceOp::sum, 1);
  CHECK(s.code() == ErrorCode::invalid_argument);
  CHECK_THAT(s.message(), Catch::Contains("root 1 is not a rank"));
}
