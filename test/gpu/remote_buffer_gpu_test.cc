// Remote buffers over CUDA device memory: the owner's region and the
// reader's destination may both be on the GPU; bytes are staged through
// pinned host memory (actors/src/remote/cuda_staging.h) on both transports.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "support/remote_actors.h"

using namespace troupe::test;

namespace {


/// Device memory, freed on scope exit.
struct DeviceBytes {
  void* ptr = nullptr;
  explicit DeviceBytes(size_t n) { REQUIRE(cudaMalloc(&ptr, n) == cudaSuccess); }
  ~DeviceBytes() { cudaFree(ptr); }
};

}  // namespace

TEST_CASE("gpu: a device-memory region reads and writes from another runtime, into host and device memory",
          "[gpu][remote][buffer]") {
  std::string transport = GENERATE("tcp", "ucx");
  INFO("transport " << transport);
  constexpr size_t kBytes = 24 << 20;  // several staging chunks
  std::vector<uint8_t> host(kBytes);
  for (size_t i = 0; i < host.size(); ++i) host[i] = pattern(i);
  DeviceBytes region(kBytes);
  REQUIRE(cudaMemcpy(region.ptr, host.data(), kBytes, cudaMemcpyHostToDevice) == cudaSuccess);

  troupe::Runtime owner(test_config(transport));
  troupe::Runtime user(test_config(transport));
  auto reg = owner.register_buffer(region.ptr, kBytes);
  REQUIRE(reg.has_value());
  CHECK(reg->handle().remote_key().empty());  // device memory goes by frames
  REQUIRE(owner.publish("buffers", owner.spawn<BufferKeeper>(reg->handle())).ok());
  auto handle = user.resolve<BufferKeeper>(owner.address() + "/buffers").value().ask(GetBuffer{}).get().value();

  // Into host memory.
  std::vector<uint8_t> local(kBytes);
  REQUIRE(handle.read_into(local.data(), kBytes).get().has_value());
  CHECK(local == host);

  // Into device memory.
  DeviceBytes dst(kBytes);
  REQUIRE(handle.read_into(dst.ptr, kBytes).get().has_value());
  std::vector<uint8_t> back(kBytes);
  REQUIRE(cudaMemcpy(back.data(), dst.ptr, kBytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back == host);

  // A write from device memory lands in the owner's device memory.
  std::vector<uint8_t> ones(1 << 20, 1);
  DeviceBytes src(ones.size());
  REQUIRE(cudaMemcpy(src.ptr, ones.data(), ones.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(handle.write_from(src.ptr, ones.size(), 4096).get().has_value());
  REQUIRE(cudaMemcpy(back.data(), region.ptr, kBytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  size_t wrong = 0;
  for (size_t i = 0; i < kBytes; ++i) wrong += back[i] != (i >= 4096 && i < 4096 + ones.size() ? 1 : pattern(i));
  CHECK(wrong == 0);
}
