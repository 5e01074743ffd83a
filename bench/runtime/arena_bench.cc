// The host arena alone (collectives/host_arena.h), without the runtime
// around it: n forked processes, each mapping the arena and running
// HostArena::run as one rank, float32 allreduce sum of 64 and 256 MiB per
// rank, through the slots (ordinary buffers) and in place (every rank's
// buffer a CollectiveBuffer). What the collectives benchmark measures minus
// the engines, the actors and the other processes of a cluster: the arena's
// own ceiling on this machine. Reported as nccl-tests does, busbw = bytes /
// time x 2(n-1)/n, against the machine's memcpy bandwidth measured in the
// same run (median of 5 allreduces, each between two barriers, after one
// that maps and touches everything).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../common/report.h"
#include "collectives/host_arena.h"
#include "troupe/collective_buffer.h"

using troupe::bench::emit;
using Clock = std::chrono::steady_clock;
using namespace troupe::collectives;

namespace {

/// The median seconds of an allreduce of `mib` MiB on `n` forked ranks, or
/// a negative number when a rank failed.
double measure(uint32_t n, size_t mib, bool in_place, int iters) {
  const size_t count = mib << 18;  // floats
  auto made = HostArena::create(n, size_t{4} << 20);
  if (!made) return -1;
  // Rank 0's times, in memory the children share with this process.
  auto* times = static_cast<double*>(
      ::mmap(nullptr, sizeof(double) * static_cast<size_t>(iters), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (times == MAP_FAILED) return -1;
  std::vector<pid_t> children;
  for (uint32_t r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid != 0) {
      children.push_back(pid);
      continue;
    }
    auto arena = HostArena::open(made->offer(), n);
    if (!arena) ::_exit(1);
    ArenaRank me{r};
    troupe::CollectiveBuffer shared;
    std::vector<float> plain;
    float* data = nullptr;
    if (in_place) {
      auto b = troupe::CollectiveBuffer::allocate(count * sizeof(float));
      if (!b) ::_exit(1);
      shared = std::move(*b);
      data = shared.as<float>().data();
    } else {
      plain.resize(count);
      data = plain.data();
    }
    std::fill(data, data + count, 1.0f);
    uint64_t signature = 1;
    auto run = [&](troupe::CollectiveKind kind, size_t elems) {
      ArenaCall call{kind, reinterpret_cast<std::byte*>(data), elems, troupe::DType::float32, troupe::ReduceOp::sum,
                     0, ++signature, "bench", {}};
      return arena->run(me, call, Clock::now() + std::chrono::minutes(2));
    };
    for (int i = -1; i < iters; ++i) {  // -1: the warm-up
      if (!run(troupe::CollectiveKind::barrier, 0)) ::_exit(1);
      auto t0 = Clock::now();
      if (!run(troupe::CollectiveKind::allreduce, count)) ::_exit(1);
      if (!run(troupe::CollectiveKind::barrier, 0)) ::_exit(1);
      if (r == 0 && i >= 0) times[i] = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    ::_exit(0);
  }
  bool ok = true;
  for (pid_t pid : children) {
    int status = 0;
    ok = ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0 && ok;
  }
  std::vector<double> t(times, times + iters);
  ::munmap(times, sizeof(double) * static_cast<size_t>(iters));
  if (!ok) return -1;
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = troupe::bench::quick(argc, argv);
  const double memcpy_bps = troupe::bench::memcpy_bandwidth();
  const std::vector<size_t> sizes_mib = quick ? std::vector<size_t>{16} : std::vector<size_t>{64, 256};
  const int iters = quick ? 2 : 5;
  for (uint32_t n : {4u, 8u}) {
    for (size_t mib : sizes_mib) {
      for (bool in_place : {false, true}) {
        double s = measure(n, mib, in_place, iters);
        if (s < 0) {
          std::fprintf(stderr, "arena_bench: a rank failed (%u ranks, %zu MiB)\n", n, mib);
          return 1;
        }
        double busbw = static_cast<double>(mib << 20) / s * 2.0 * (n - 1) / n;
        emit("collectives.arena_alone", "busbw_" + std::to_string(mib) + "MiB_n" + std::to_string(n) +
                                            (in_place ? "_in_place" : "_slots"),
             busbw / 1e9, "GB/s", "memcpy bandwidth of this machine (this run)", memcpy_bps / 1e9, "report");
      }
    }
  }
  return 0;
}
