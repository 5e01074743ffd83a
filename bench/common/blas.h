// The CPU roofline the RL model's benchmarks measure themselves against:
// OpenBLAS sgemm at a given shape, in the same run. Header-only, like
// report.h; the benchmark links OpenBLAS.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "report.h"

namespace troupe::bench {

/// Best-of-`reps` GFLOP/s of sgemm (M x K) x (N x K)^T, row-major: the
/// model's matmul_forward shape.
/// OpenBLAS gets every core for it (the model's kernels may have left it at
/// one: rl/model/threads.h).
inline double sgemm_gflops(size_t M, size_t N, size_t K, int reps) {
  openblas_set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::vector<float> a(M * K, 0.5f), b(K * N, 0.25f), c(M * N);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), 1.0f, a.data(), static_cast<int>(K), b.data(), static_cast<int>(K), 0.0f,
                c.data(), static_cast<int>(N));
    best = std::max(best, 2.0 * static_cast<double>(M * N * K) / seconds_since(t0) / 1e9);
  }
  return best;
}

}  // namespace troupe::bench
