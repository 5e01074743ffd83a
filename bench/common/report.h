// Benchmark output: one JSON object per line (see STYLE.md), and the small
// statistics every benchmark needs. Header-only so each bench stays one file.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace troupe::bench {

/// Prints one result line. `ratio` is value / baseline_value.
inline void emit(const std::string& bench, const std::string& metric, double value, const std::string& unit,
                 const std::string& baseline, double baseline_value, const std::string& target) {
  double ratio = baseline_value != 0 ? value / baseline_value : 0;
  std::printf(
      "{\"bench\": \"%s\", \"metric\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"baseline\": \"%s\", "
      "\"baseline_value\": %.6g, \"ratio\": %.4g, \"target\": \"%s\"}\n",
      bench.c_str(), metric.c_str(), value, unit.c_str(), baseline.c_str(), baseline_value, ratio, target.c_str());
  std::fflush(stdout);
}

/// The q-quantile (0..1) of `samples` (sorted in place).
inline double quantile(std::vector<double>& samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  size_t i = static_cast<size_t>(q * static_cast<double>(samples.size() - 1) + 0.5);
  return samples[std::min(i, samples.size() - 1)];
}

/// True when the program was started with --quick (a short smoke run).
inline bool quick(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) return true;
  }
  return false;
}

/// Whether the case named `name` runs: every case unless BENCH_ONLY is set,
/// then only those whose name contains it (one case under a profiler, say).
inline bool selected(const std::string& name) {
  const char* only = std::getenv("BENCH_ONLY");
  return only == nullptr || *only == '\0' || name.find(only) != std::string::npos;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline double us_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

/// memcpy bandwidth of this machine, bytes/s: the best of a few copies of
/// 256 MiB (the floor the CPU collectives benchmarks report against).
inline double memcpy_bandwidth() {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) / s);
    a[static_cast<size_t>(i)] = b[bytes - 1 - static_cast<size_t>(i)];  // keep the copies observable
  }
  return best;
}

}  // namespace troupe::bench
