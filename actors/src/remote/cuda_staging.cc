#include "cuda_staging.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "bulk_copy.h"

#if TROUPE_WITH_CUDA
#include <cuda_runtime_api.h>

#include <mutex>
#endif

namespace troupe::detail::cuda {

#if TROUPE_WITH_CUDA

namespace {

bool gpu_present() {
  static const bool present = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return present;
}

Status cuda_error(const char* what, cudaError_t e) {
  return Status(ErrorCode::invalid_argument, std::string("remote buffer: ") + what + ": " + cudaGetErrorString(e));
}

/// One pinned buffer per thread, allocated on first use and kept: pinning
/// costs milliseconds, a copy through it microseconds.
constexpr size_t kStagingBytes = size_t{8} << 20;
struct Staging {
  void* data = nullptr;
  ~Staging() {
    if (data) cudaFreeHost(data);
  }
};

Result<void*> staging() {
  static thread_local Staging s;
  if (s.data == nullptr) {
    if (cudaError_t e = cudaMallocHost(&s.data, kStagingBytes); e != cudaSuccess) {
      s.data = nullptr;
      return error(cuda_error("allocating the pinned staging buffer", e));
    }
  }
  return s.data;
}

}  // namespace

bool is_device(const void* p) {
  if (p == nullptr || !gpu_present()) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();  // plain host memory on older runtimes: not an error to keep
    return false;
  }
  return attr.type == cudaMemoryTypeDevice;
}

Status copy(void* dst, const void* src, size_t n) {
  bool dst_dev = is_device(dst), src_dev = is_device(src);
  if (!dst_dev && !src_dev) {
    bulk_copy(dst, src, n);
    return {};
  }
  if (dst_dev && src_dev) {
    if (cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice); e != cudaSuccess) {
      return cuda_error("device to device copy", e);
    }
    return {};
  }
  auto pinned = staging();
  if (!pinned) return pinned.error();
  auto* out = static_cast<char*>(dst);
  auto* in = static_cast<const char*>(src);
  for (size_t done = 0; done < n;) {
    size_t chunk = std::min(kStagingBytes, n - done);
    if (src_dev) {
      if (cudaError_t e = cudaMemcpy(*pinned, in + done, chunk, cudaMemcpyDeviceToHost); e != cudaSuccess) {
        return cuda_error("device to host copy", e);
      }
      std::memcpy(out + done, *pinned, chunk);
    } else {
      std::memcpy(*pinned, in + done, chunk);
      if (cudaError_t e = cudaMemcpy(out + done, *pinned, chunk, cudaMemcpyHostToDevice); e != cudaSuccess) {
        return cuda_error("host to device copy", e);
      }
    }
    done += chunk;
  }
  return {};
}

#else  // no CUDA in this build

bool is_device(const void*) { return false; }

Status copy(void* dst, const void* src, size_t n) {
  bulk_copy(dst, src, n);
  return {};
}

#endif

}  // namespace troupe::detail::cuda
