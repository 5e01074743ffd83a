// A sandbox for untrusted programs (a policy's code, run to score it): one
// process tree per run, in namespaces of its own (PID, network, mount, IPC,
// UTS), as a uid of its own, under rlimits and a wall-clock timeout. What
// the program sees: the host's files read-only, a fresh writable directory
// (a tmpfs that dies with the run) as its working directory, no network,
// no other process, no unix socket, no new namespace (a seccomp filter:
// seccomp_filter.h). Run by root, the program gets a uid of its own; run by
// another user, the sandbox is in a user namespace of its own (see
// run_sandboxed).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/status.h"

namespace troupe::rl::reward {

/// The Python interpreter that sandboxed scripts run under (Debian package
/// python3-minimal).
inline constexpr std::string_view kPython = "/usr/bin/python3";

/// What a sandboxed program may use. Each bound is the kernel's (rlimits, a
/// tmpfs size, a memory cgroup) or the caller's (timeout, output), so a bad
/// program fails inside its sandbox, never on the host. Worst-case memory
/// of one run: total_memory_bytes under a memory cgroup, else
/// max_processes * memory_bytes + dir_bytes.
struct SandboxLimits {
  /// Wall-clock time after which the whole process tree is killed (SIGKILL)
  /// and the run reported as timed out.
  double timeout_s = 10.0;
  /// CPU seconds per process (RLIMIT_CPU): SIGKILL at the limit. Bounds a
  /// busy program even before the timeout.
  uint32_t cpu_s = 10;
  /// Address space per process (RLIMIT_AS): an allocation past it fails
  /// (Python raises MemoryError) instead of pressing on the host's memory.
  uint64_t memory_bytes = 256ull << 20;
  /// Memory of the whole run, every process and the files it writes
  /// together, in a memory cgroup of its own (memory_cgroup.h): past it the
  /// kernel kills the run's largest process (SandboxResult::memory_killed).
  /// Where no memory cgroup can be made (not root, cgroups off; see
  /// require_memory_cgroup) the run goes on under the per-process bounds
  /// alone. 0: no cgroup.
  uint64_t total_memory_bytes = 512ull << 20;
  /// True: a run that cannot have its memory cgroup is refused (an error
  /// saying why) instead of going on without it.
  bool require_memory_cgroup = false;
  /// Largest file the program may write (RLIMIT_FSIZE; Python gets EFBIG).
  uint64_t file_bytes = 1ull << 20;
  /// Size of the working directory, a tmpfs (ENOSPC past it): bounds the
  /// total written, which file_bytes alone does not.
  uint64_t dir_bytes = 8ull << 20;
  /// Open file descriptors per process (RLIMIT_NOFILE).
  uint32_t open_files = 64;
  /// Processes and threads the program may have at once, itself included
  /// (RLIMIT_NPROC of its uid, which no other process has): fork bombs stop
  /// here.
  uint32_t max_processes = 8;
  /// Bytes kept of stdout and of stderr, each; the rest is read and dropped
  /// (so the program never blocks on a full pipe) and reported truncated.
  uint64_t output_bytes = 64ull << 10;

  /// ok, or the first field out of range, named.
  Status validate() const;
};

/// One program to run.
struct SandboxRun {
  /// The command: argv[0] is an absolute path to the executable (no PATH
  /// search), e.g. {"/usr/bin/python3", "-I", "-S", "-B", "main.py"}.
  std::vector<std::string> argv;
  /// Files written into the working directory before the program starts,
  /// as (name, content); a name is a plain file name (no '/', not "." or
  /// ".."). The program may read, change and delete them.
  std::vector<std::pair<std::string, std::string>> files;
  /// The program's standard input (it reads EOF after it).
  std::string stdin_data;
};

/// How a sandboxed program ended and what it printed.
struct SandboxResult {
  /// The exit code when it exited, else -1.
  int exit_code = -1;
  /// The signal that killed it (SIGKILL at the timeout or the CPU limit,
  /// SIGSEGV, ...), else 0.
  int term_signal = 0;
  /// True when the wall-clock timeout killed it.
  bool timed_out = false;
  /// Its standard output and error, each cut at SandboxLimits::output_bytes.
  std::string out, err;
  /// True when more output came than was kept.
  bool out_truncated = false, err_truncated = false;
  /// From the start of the sandbox until everything in it was gone.
  double wall_seconds = 0;
  /// The uid the program ran as (no passwd entry; no other process has
  /// it). In a user namespace (below) that is its uid there; the host sees
  /// the caller's.
  uint32_t uid = 0;
  /// True when a memory cgroup bounded the run at total_memory_bytes.
  bool memory_cgroup = false;
  /// True when the kernel killed a process of the run at
  /// total_memory_bytes (that process ends with SIGKILL; when it is the
  /// program itself, term_signal says so).
  bool memory_killed = false;
  /// The most memory the run held at once, from its cgroup; 0 without one
  /// or where the kernel does not count it (cgroup v2 before Linux 5.19).
  uint64_t peak_memory_bytes = 0;
  /// True when the caller was not root: the sandbox had a user namespace
  /// of its own (the program is the caller's uid on the host, and keeps its
  /// supplementary groups).
  bool user_namespace = false;

  /// True when the program exited with code 0 within its limits.
  bool succeeded() const { return exit_code == 0 && term_signal == 0 && !timed_out; }
};

/// Runs `run` in a fresh sandbox under `limits` and returns how it ended
/// once every process of the sandbox is gone (by the timeout plus a second
/// at most, unless the kernel cannot kill a process). A program that fails
/// (crashes, times out, exceeds a limit) is a result; an error means the
/// sandbox could not be made (bad limits or run: invalid_argument; an
/// executable that does not exist: not_found; namespaces or mounts
/// refused: unsupported), with what to do. A caller that is not root needs
/// user namespaces (Debian allows them) and Linux 5.14+ for max_processes
/// to count the sandbox's processes alone; its limits are capped at its
/// own hard limits. Safe to call from many threads
/// at once; the caller's signal handlers and mask are not touched and its
/// memory is not copied (the sandbox starts like posix_spawn). Like any
/// child, the program sends SIGCHLD when it ends; a waitpid(-1) elsewhere
/// in the process, or SIGCHLD set to SIG_IGN, would take its exit status
/// (an error then).
Result<SandboxResult> run_sandboxed(const SandboxRun& run, const SandboxLimits& limits = {});

/// ok when sandboxes can be made on this machine (checked once, by running
/// /bin/true in one), else the error run_sandboxed would give, with what to
/// do. Thread-safe.
Status sandbox_available();

/// ok when sandbox runs get a memory cgroup here, else why not and what to
/// do (each run checks again: TROUPE_SANDBOX_CGROUP may change). Thread-safe.
Status sandbox_memory_cgroup_available();

/// The argv that runs `script` (a file of SandboxRun::files) under kPython,
/// isolated from the environment and user site (-I), without the site
/// module (-S: faster start) and writing no bytecode (-B).
std::vector<std::string> python_argv(std::string_view script);

}  // namespace troupe::rl::reward
