// CUDA device memory in remote buffers, staged through pinned host memory.
//
// Debian's UCX has no CUDA transport, so device memory never goes to the
// wire directly: the owner of a device region copies between the device and
// a pinned host buffer (DMA at PCIe speed) and serves the bytes by frames;
// a reader whose destination is device memory lands the bytes in host memory
// first and copies them up the same way. The cost is one extra
// device<->host copy per access on each side that holds device memory. A
// CUDA-aware UCX (or GPUDirect RDMA) would register device memory with the
// transport instead; the RemoteBuffer API does not change (pointers are
// classified here, not by the caller).
#pragma once

#include <cstddef>

#include "troupe/status.h"

namespace troupe::detail::cuda {

/// True when `p` is CUDA device memory. Always false in builds without CUDA
/// and on machines without a GPU.
bool is_device(const void* p);

/// Copies `n` bytes where either side may be device memory (host to host is
/// a memcpy). Device copies go through a pinned staging buffer in chunks.
/// Errors name the CUDA failure.
Status copy(void* dst, const void* src, size_t n);

}  // namespace troupe::detail::cuda
