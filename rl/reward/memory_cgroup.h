// A memory cgroup per sandbox run: one bound on the memory of the whole
// run (every process of it, and the files it writes to its tmpfs), where
// RLIMIT_AS bounds each process's address space alone. nsjail and
// systemd-run do the same: a directory under a cgroup this process may
// manage, a limit written into it, the run's first process moved in
// before it execs (its children follow), the counters read when it is
// gone, the directory removed.
//
// Both hierarchies: cgroup v1's memory controller (memory.limit_in_bytes,
// and memory.memsw.limit_in_bytes where swap is counted) and cgroup v2's
// (memory.max, memory.swap.max 0). Where the parent is found:
// TROUPE_SANDBOX_CGROUP names it (a directory of either hierarchy; "off"
// turns cgroups off), else it is this process's own memory cgroup. On v2
// the parent must have the memory controller on for its children, which
// a cgroup with processes of its own cannot turn on (the "no internal
// processes" rule): such machines need TROUPE_SANDBOX_CGROUP (the error
// says how).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "troupe/status.h"

namespace troupe::rl::reward {

/// The cgroup hierarchy that holds the memory controller.
enum class CgroupVersion { v1, v2 };

/// A directory under which runs' cgroups are made.
struct CgroupParent {
  /// Absolute path of the directory (in the cgroup file system).
  std::string dir;
  CgroupVersion version = CgroupVersion::v1;
};

/// Where this process's memory cgroup lies, from the texts of
/// /proc/self/mounts and /proc/self/cgroup: the v1 memory hierarchy's
/// mount plus this process's path in it, else the v2 mount (whose root
/// offers the memory controller) plus its v2 path. Reads nothing else; an
/// error says what was missing.
Result<CgroupParent> find_memory_cgroup(std::string_view mounts, std::string_view cgroups);

/// The parent for sandbox runs' cgroups on this machine, as the file's
/// comment says, checked to be usable (on v2, the memory controller turned
/// on for its children). An error (ErrorCode::unsupported) says why there
/// is none and what to do.
Result<CgroupParent> sandbox_cgroup_parent();

/// What the kernel counted for a run's cgroup.
struct CgroupUsage {
  /// The most memory the run held at once (v1 memory.max_usage_in_bytes,
  /// v2 memory.peak, Linux 5.19+); 0 where the kernel does not say.
  uint64_t peak_bytes = 0;
  /// Processes the kernel killed at the limit.
  uint64_t oom_kills = 0;
};

/// One run's cgroup: made with its limit, joined by the run's first
/// process (write "0" to procs_fd()), read, then removed when destroyed.
/// Move-only.
class MemoryCgroup {
 public:
  /// Makes a fresh cgroup under `parent` whose processes together may hold
  /// at most `limit_bytes` (swap included), or says why it could not.
  static Result<MemoryCgroup> make(const CgroupParent& parent, uint64_t limit_bytes);

  MemoryCgroup(MemoryCgroup&& other) noexcept;
  MemoryCgroup& operator=(MemoryCgroup&& other) noexcept;
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;
  /// Removes the directory. Every process of the run must be gone; one
  /// that is not (a kill the kernel has not finished) is retried at the
  /// next make() of this process, never waited for.
  ~MemoryCgroup();

  /// Its cgroup.procs, open for writing: a process that writes "0" to it
  /// joins (system calls only: usable from a vfork child).
  int procs_fd() const { return procs_fd_; }
  /// Its directory.
  const std::string& dir() const { return dir_; }
  /// What the kernel counted so far.
  CgroupUsage usage() const;

 private:
  MemoryCgroup(std::string dir, CgroupVersion version, int procs_fd)
      : dir_(std::move(dir)), version_(version), procs_fd_(procs_fd) {}
  void release();

  std::string dir_;
  CgroupVersion version_ = CgroupVersion::v1;
  int procs_fd_ = -1;
};

}  // namespace troupe::rl::reward
