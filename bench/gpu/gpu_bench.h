// What every GPU benchmark does the same way: its one "skipped" line where
// the process sees no GPU (so bench/run goes on), and its failures.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "../common/report.h"

namespace troupe::bench {

/// True, after printing `bench`'s "skipped" line, where this process sees
/// no CUDA device.
inline bool skipped_without_gpu(const char* bench, const char* program) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) return false;
  (void)cudaGetLastError();
  std::fprintf(stderr, "%s: skipped: no GPU\n", program);
  emit(bench, "skipped", 0, "none", "none", 0, "skipped: no GPU");
  return true;
}

/// Says why `program` stops; its exit status.
inline int fail(const char* program, const std::string& why) {
  std::fprintf(stderr, "%s: %s\n", program, why.c_str());
  return 1;
}

}  // namespace troupe::bench
