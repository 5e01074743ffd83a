// Random draws that are the same under every standard library (the
// std::uniform_*_distribution's are not), so that the tasks' problem
// streams and weak teachers are reproducible on every machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>

namespace troupe::rl::tasks {

/// Uniform over [lo, hi] (REQUIRES: lo <= hi), by rejection.
inline int64_t uniform_int(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  uint64_t x;
  do x = rng();
  while (x >= limit);
  return lo + static_cast<int64_t>(x % span);
}

/// splitmix64's finaliser: spreads seeds and indices (seed ^ index) over
/// independent streams.
inline uint64_t mix_seed(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// FNV-1a over `n` bytes: a checksum of a parameter buffer (replicas and
/// engines that agree have the same).
inline uint64_t fnv1a(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/// Uniform in [0, 1): 53 random bits, as the sampler's.
inline double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace troupe::rl::tasks
