#include "reward/sandbox.h"

#include <linux/seccomp.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "reward/memory_cgroup.h"
#include "reward/seccomp_filter.h"

#ifndef P_PIDFD
#define P_PIDFD 3  // waitid on a pidfd (Linux 5.4+), missing from glibc 2.36's headers
#endif

namespace troupe::rl::reward {

namespace {

// The program's uid: one per sandbox from a range no distribution assigns
// (below 2^31, as some tools read uids as signed), so RLIMIT_NPROC counts
// this sandbox's processes alone. pid (mod 2^15) times 4096 plus a counter:
// unique within a process for 4096 runs at once, and across processes
// unless their pids agree mod 2^15.
constexpr uint32_t kUidBase = 2'000'000'000;
constexpr uint32_t kUidsPerProcess = 4096;
constexpr uint32_t kProcessSlots = 32768;
std::atomic<uint32_t> next_uid_slot{0};

// Inside the sandbox: /tmp is a fresh tmpfs (read-only) and work/ in it the
// program's writable working directory.
constexpr const char* kTmp = "/tmp";
constexpr const char* kWorkDir = "/tmp/work";

// The sandbox's /dev: character devices of major 1, and the usual links.
constexpr std::pair<const char*, unsigned> kDevices[] = {
    {"/dev/null", 3}, {"/dev/zero", 5}, {"/dev/full", 7}, {"/dev/random", 8}, {"/dev/urandom", 9}};
constexpr std::pair<const char*, const char*> kDevLinks[] = {{"/proc/self/fd", "/dev/fd"},
                                                             {"/proc/self/fd/0", "/dev/stdin"},
                                                             {"/proc/self/fd/1", "/dev/stdout"},
                                                             {"/proc/self/fd/2", "/dev/stderr"}};
// Covered by an empty read-only tmpfs where they are directories (not
// links: /var/run is one to /run on Debian).
constexpr const char* kHiddenDirs[] = {"/run", "/var/run", "/var/tmp", "/var/lock"};

// After the timeout's SIGKILL, how long the kernel gets to take the tree
// down before the parent stops reading and just reaps.
constexpr double kKillGrace_s = 1.0;
// The setup child's stack (it runs a few system call wrappers), above a
// guard page.
constexpr size_t kChildStackBytes = 256 << 10;
constexpr size_t kGuardBytes = 4096;

/// Where the sandbox's setup failed.
enum class Stage : int32_t {
  kCgroup,
  kUserMaps,
  kFds,
  kMountPrivate,
  kMountReadOnly,
  kMountTmpfs,
  kWorkDir,
  kBindWork,
  kRemountTmp,
  kMountProc,
  kMountDev,
  kHideDirs,
  kWriteFiles,
  kSession,
  kRlimits,
  kDropGroups,
  kSetGid,
  kSetUid,
  kNoNewPrivs,
  kParentDeath,
  kChdir,
  kSeccomp,
  kExec,
};

/// The setup child's one message, on failure: a stage and its errno.
struct Report {
  Stage stage;
  int32_t error;
};

/// A file to write into the working directory, as the child sees it.
struct FilePlan {
  const char* name;
  const char* data;
  size_t size;
};

/// Everything the setup child needs, built by the parent before the
/// clone: the child shares the parent's memory (CLONE_VM) while the
/// calling thread waits, so it may not allocate or take locks that the
/// parent's other threads hold; it runs system calls only.
struct ChildPlan {
  char* const* argv;
  char* const* envp;
  const FilePlan* files;
  size_t file_count;
  const char* tmpfs_options;
  int stdin_fd, out_fd, err_fd, report_fd, parent_pidfd;
  /// The run's memory cgroup's cgroup.procs (memory_cgroup.h), or -1.
  int cgroup_procs_fd;
  uint32_t uid;
  /// A caller that is not root: the sandbox is in a user namespace of its
  /// own, where `uid` (and the same gid) is the caller's, mapped by these
  /// lines ("uid outside 1\n"); its /dev binds the host's device nodes
  /// (no mknod there) and it keeps the caller's supplementary groups (no
  /// setgroups there).
  bool user_namespace;
  const char* uid_map;
  const char* gid_map;
  /// The system-call filter (seccomp_filter.h), or null.
  const sock_fprog* seccomp;
  /// user_namespace: the caller's private directories to cover (homes, its
  /// $HOME and $TROUPE_HOME).
  const char* const* private_dirs;
  size_t private_dir_count;
  struct Limit {
    __rlimit_resource_t resource;
    rlimit value;
  } limits[6];
};

/// A file descriptor closed when it goes out of scope.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// --- the setup child: system calls only ----------------------------------------

[[noreturn]] void fail(int report_fd, Stage stage) {
  Report r{stage, errno};
  [[maybe_unused]] ssize_t n = write(report_fd, &r, sizeof r);  // <= PIPE_BUF: atomic
  _exit(127);
}

void write_files(const ChildPlan& plan, int report_fd) {
  int dir = open(kWorkDir, O_DIRECTORY | O_RDONLY | O_CLOEXEC);
  if (dir < 0) fail(report_fd, Stage::kWriteFiles);
  for (size_t i = 0; i < plan.file_count; ++i) {
    const FilePlan& f = plan.files[i];
    int fd = openat(dir, f.name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) fail(report_fd, Stage::kWriteFiles);
    for (size_t done = 0; done < f.size;) {
      ssize_t n = write(fd, f.data + done, f.size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail(report_fd, Stage::kWriteFiles);
      done += static_cast<size_t>(n);
    }
    if (fchown(fd, plan.uid, plan.uid) != 0) fail(report_fd, Stage::kWriteFiles);
    close(fd);
  }
  close(dir);
}

/// Writes `text` to the file at `path` (a /proc/self map), false on failure.
bool write_text(const char* path, const char* text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const size_t n = strlen(text);
  const bool ok = write(fd, text, n) == static_cast<ssize_t>(n);
  close(fd);
  return ok;
}

/// The sandbox's one process until the program forks: PID 1 of a fresh
/// PID namespace, root in fresh mount, network, IPC and UTS namespaces
/// (and, for a caller that is not root, of a user namespace that owns
/// them, with every capability there and none outside). It
/// builds the filesystem view, drops to the sandbox's uid under its
/// limits, and becomes the program (exec). When it ends, the kernel kills
/// everything left in the namespace.
int sandbox_child(void* arg) {
  const ChildPlan& plan = *static_cast<const ChildPlan*>(arg);
  int report_fd = plan.report_fd;
  // The parent's handlers must never run here (signals are blocked since
  // before the clone), and ignored signals would stay ignored across exec.
  // Handlers are this process's own table (no CLONE_SIGHAND).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);  // glibc's own are refused: fine

  // Into the run's memory cgroup first, so that all it makes is counted
  // there (the files included) and every process it starts is born there.
  // "0" is the writer, whatever its pid in its own namespace.
  if (plan.cgroup_procs_fd >= 0 && write(plan.cgroup_procs_fd, "0", 1) != 1) fail(report_fd, Stage::kCgroup);

  // In a user namespace of its own, this process is the caller's uid as
  // `plan.uid`; until the maps are written it is nobody there.
  if (plan.user_namespace) {
    if (!write_text("/proc/self/setgroups", "deny") || !write_text("/proc/self/uid_map", plan.uid_map) ||
        !write_text("/proc/self/gid_map", plan.gid_map)) {
      fail(report_fd, Stage::kUserMaps);
    }
  }

  // stdin, stdout, stderr at 0-2, the report pipe at 3 and the parent's
  // pidfd at 4 (both close-on-exec), nothing else from the parent, whose
  // other threads may open descriptors without O_CLOEXEC at any time. Via
  // fds >= 16 first, in case the parent's 0-4 were closed and a source
  // sits there.
  constexpr int kKept = 5;
  const int sources[kKept] = {plan.stdin_fd, plan.out_fd, plan.err_fd, plan.report_fd, plan.parent_pidfd};
  int moved[kKept];
  for (int i = 0; i < kKept; ++i) {
    moved[i] = fcntl(sources[i], F_DUPFD, 16 + kKept);
    if (moved[i] < 0) fail(report_fd, Stage::kFds);
  }
  for (int i = 0; i < kKept; ++i) {
    if (dup2(moved[i], i) != i) fail(report_fd, Stage::kFds);
  }
  report_fd = 3;
  const int parent_pidfd = 4;
  if (fcntl(report_fd, F_SETFD, FD_CLOEXEC) != 0 || fcntl(parent_pidfd, F_SETFD, FD_CLOEXEC) != 0 ||
      syscall(SYS_close_range, kKept, ~0u, 0u) != 0) {
    fail(report_fd, Stage::kFds);
  }

  // No mount event crosses back to the host; then every mount read-only
  // and nosuid at once (mount_setattr, Linux 5.12+: no list of mounts to
  // walk, none missed), a fresh /tmp with the one writable directory, and
  // a /proc of this PID namespace (the host's lists the host's processes).
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail(report_fd, Stage::kMountPrivate);
  mount_attr read_only{};
  read_only.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID;
  if (syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE, &read_only, sizeof read_only) != 0) {
    fail(report_fd, Stage::kMountReadOnly);
  }
  if (mount("tmpfs", kTmp, "tmpfs", MS_NOSUID | MS_NODEV, plan.tmpfs_options) != 0) {
    fail(report_fd, Stage::kMountTmpfs);
  }
  if (mkdir(kWorkDir, 0700) != 0 || chown(kWorkDir, plan.uid, plan.uid) != 0) fail(report_fd, Stage::kWorkDir);
  if (mount(kWorkDir, kWorkDir, nullptr, MS_BIND, nullptr) != 0) fail(report_fd, Stage::kBindWork);
  if (mount(nullptr, kTmp, nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0) {
    fail(report_fd, Stage::kRemountTmp);
  }
  if (mount("proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    fail(report_fd, Stage::kMountProc);
  }
  // A /dev of the harmless devices only: the host's holds sockets (/dev/log),
  // ptys and shared memory.
  // In a user namespace no device node can be made: the host's are
  // taken (detached copies of their mounts) before the tmpfs covers them,
  // and bound onto empty files there.
  constexpr size_t kDeviceCount = sizeof kDevices / sizeof kDevices[0];
  int host_devices[kDeviceCount];
  if (plan.user_namespace) {
    for (size_t i = 0; i < kDeviceCount; ++i) {
      host_devices[i] =
          static_cast<int>(syscall(SYS_open_tree, AT_FDCWD, kDevices[i].first, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
      if (host_devices[i] < 0) fail(report_fd, Stage::kMountDev);
    }
  }
  if (mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755") != 0) {
    fail(report_fd, Stage::kMountDev);
  }
  for (size_t i = 0; i < kDeviceCount; ++i) {
    const auto& [path, minor] = kDevices[i];
    if (plan.user_namespace) {
      const int placeholder = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (placeholder < 0) fail(report_fd, Stage::kMountDev);
      close(placeholder);
      if (syscall(SYS_move_mount, host_devices[i], "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH) != 0) {
        fail(report_fd, Stage::kMountDev);
      }
      close(host_devices[i]);
    } else if (mknod(path, S_IFCHR, makedev(1, minor)) != 0 || chmod(path, 0666) != 0) {
      fail(report_fd, Stage::kMountDev);
    }
  }
  for (const auto& [target, path] : kDevLinks) {
    if (symlink(target, path) != 0) fail(report_fd, Stage::kMountDev);
  }
  if (mount(nullptr, "/dev", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC, nullptr) != 0) {
    fail(report_fd, Stage::kMountDev);
  }
  // The other places where host services keep unix sockets (connect
  // ignores read-only mounts) or anyone may write: empty. In a user
  // namespace the program is the caller's uid, which may read the caller's
  // own files: the home directories (keys, the cluster token) go too.
  auto hide = [&](const char* dir) {
    struct stat st {};
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return;  // absent, covered, or a link to one covered
    if (mount("tmpfs", dir, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,nr_inodes=4,mode=0755") !=
        0) {
      fail(report_fd, Stage::kHideDirs);
    }
  };
  for (const char* dir : kHiddenDirs) hide(dir);
  if (plan.user_namespace) {
    for (size_t i = 0; i < plan.private_dir_count; ++i) hide(plan.private_dirs[i]);
  }
  write_files(plan, report_fd);
  // A session of its own: no controlling terminal to read, write or
  // inject into, and the terminal's signals (^C) stay with the caller.
  if (setsid() < 0) fail(report_fd, Stage::kSession);
  [[maybe_unused]] int rc = sethostname("sandbox", 7);

  // Limits, then the unprivileged uid. Raw set*id system calls: glibc's
  // wrappers would make the parent's other threads change uid too.
  for (const auto& limit : plan.limits) {
    if (setrlimit(limit.resource, &limit.value) != 0) fail(report_fd, Stage::kRlimits);
  }
  if (!plan.user_namespace && syscall(SYS_setgroups, 0, nullptr) != 0) fail(report_fd, Stage::kDropGroups);
  if (syscall(SYS_setresgid, plan.uid, plan.uid, plan.uid) != 0) fail(report_fd, Stage::kSetGid);
  if (syscall(SYS_setresuid, plan.uid, plan.uid, plan.uid) != 0) fail(report_fd, Stage::kSetUid);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail(report_fd, Stage::kNoNewPrivs);
  // The caller dies: so does the sandbox (PID 1's death takes the
  // namespace). Set after the uid change, which clears it; the pidfd
  // covers a death before it was set.
  pollfd parent{parent_pidfd, POLLIN, 0};
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || poll(&parent, 1, 0) != 0) {
    fail(report_fd, Stage::kParentDeath);
  }
  if (chdir(kWorkDir) != 0) fail(report_fd, Stage::kChdir);
  umask(022);  // this process's own (no CLONE_FS), not the caller's
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // Last: the filter is this process's alone (the caller, whose memory it
  // shares, is another task), and nothing after it but exec needs a call
  // it refuses.
  if (plan.seccomp != nullptr && syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, plan.seccomp) != 0) {
    fail(report_fd, Stage::kSeccomp);
  }
  execve(plan.argv[0], plan.argv, plan.envp);
  fail(report_fd, Stage::kExec);
}

// --- the parent side ---------------------------------------------------------

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }

std::string errno_text(int err) { return std::strerror(err); }

/// Why a stage fails, and what to do about it.
std::string stage_error(Stage stage, int err, const SandboxRun& run, uint32_t uid, bool user_namespace) {
  const std::string why = errno_text(err);
  const std::string root = user_namespace
                               ? "; this kernel refuses it in a user namespace: run as root, or on Linux 5.12+"
                               : "; the sandbox needs root with CAP_SYS_ADMIN (in a container: --privileged)";
  const std::string unmapped = err == EINVAL ? "; uid " + std::to_string(uid) +
                                                   " is not mapped: this process runs in a user namespace; run it as "
                                                   "the host's root"
                                             : "";
  switch (stage) {
    case Stage::kCgroup:
      return "sandbox: joining the run's memory cgroup failed: " + why +
             "; set TROUPE_SANDBOX_CGROUP to a cgroup this process may manage, or to off for the rlimits alone";
    case Stage::kUserMaps:
      return "sandbox: mapping this user into the sandbox's user namespace failed: " + why +
             (err == EACCES || err == EPERM
                  ? "; a process that changed its uid is not dumpable: prctl(PR_SET_DUMPABLE, 1) first, or run as root"
                  : "");
    case Stage::kFds:
      return "sandbox: arranging the program's descriptors failed: " + why + "; close_range needs Linux 5.9+";
    case Stage::kMountPrivate:
      return "sandbox: making the mount namespace private failed: " + why + root;
    case Stage::kMountReadOnly:
      return "sandbox: remounting the filesystem read-only failed: " + why +
             (err == ENOSYS || err == EINVAL ? "; mount_setattr needs Linux 5.12+" : root);
    case Stage::kMountTmpfs:
      return "sandbox: mounting a tmpfs on /tmp failed: " + why + root;
    case Stage::kWorkDir:
      return "sandbox: creating the working directory failed: " + why + unmapped;
    case Stage::kBindWork:
    case Stage::kRemountTmp:
      return "sandbox: making only the working directory writable failed: " + why + root;
    case Stage::kMountProc:
      return "sandbox: mounting /proc for the sandbox's PID namespace failed: " + why + root;
    case Stage::kMountDev:
      return "sandbox: making the sandbox's /dev failed: " + why + root;
    case Stage::kHideDirs:
      return "sandbox: hiding /run, /var/tmp" + std::string(user_namespace ? " and the home directories" : "") +
             " failed: " + why + root;
    case Stage::kWriteFiles:
      return "sandbox: writing the program's files failed: " + why +
             (err == ENOSPC ? "; raise dir_bytes" : err == EINVAL ? unmapped : "; check the file names");
    case Stage::kSession:
      return "sandbox: starting a session failed: " + why;
    case Stage::kRlimits:
      return "sandbox: setting the program's rlimits failed: " + why;
    case Stage::kDropGroups:
    case Stage::kSetGid:
    case Stage::kSetUid:
      return "sandbox: switching to uid " + std::to_string(uid) + " failed: " + why +
             (err == EINVAL ? unmapped
              : user_namespace ? "; the sandbox's user namespace refused it (a security module may restrict user "
                                 "namespaces: kernel.apparmor_restrict_unprivileged_userns)"
                               : "; the sandbox needs root (CAP_SETUID, CAP_SETGID)");
    case Stage::kNoNewPrivs:
      return "sandbox: PR_SET_NO_NEW_PRIVS failed: " + why;
    case Stage::kParentDeath:
      return "sandbox: tying the sandbox to this process's life failed (PR_SET_PDEATHSIG, or this process is exiting)";
    case Stage::kChdir:
      return "sandbox: entering the working directory failed: " + why;
    case Stage::kSeccomp:
      return "sandbox: installing the system-call filter failed: " + why +
             "; the kernel needs seccomp filters (CONFIG_SECCOMP_FILTER)";
    case Stage::kExec:
      return "sandbox: cannot run " + run.argv[0] + ": " + why +
             (err == EACCES ? "; the program runs as an unprivileged uid: make it executable by others"
                            : "; check that it and its interpreter and libraries are installed");
  }
  return "sandbox: setup failed at stage " + std::to_string(static_cast<int>(stage)) + ": " + why;
}

/// The Debian package that provides a well-known interpreter, for the
/// error message.
std::string package_hint(const std::string& path) {
  if (path.find("python3") != std::string::npos) return "install Debian package python3-minimal (apt-get install python3-minimal)";
  return "install the package that provides it, or give the absolute path of an installed executable";
}

Status check_run(const SandboxRun& run, const SandboxLimits& limits) {
  if (run.argv.empty() || run.argv[0].empty() || run.argv[0][0] != '/') {
    return Status(ErrorCode::invalid_argument,
                  "sandbox: argv[0] must be the absolute path of the executable (no PATH search), got '" +
                      (run.argv.empty() ? std::string() : run.argv[0]) + "'");
  }
  for (const std::string& arg : run.argv) {
    if (arg.find('\0') != std::string::npos) {
      return Status(ErrorCode::invalid_argument, "sandbox: an argument contains a NUL byte");
    }
  }
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < run.files.size(); ++i) {
    const std::string& name = run.files[i].first;
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos || name.size() > 255) {
      return Status(ErrorCode::invalid_argument,
                    "sandbox: file name '" + name + "' is not a plain file name (no '/', not '.' or '..')");
    }
    for (size_t j = 0; j < i; ++j) {
      if (run.files[j].first == name) {
        return Status(ErrorCode::invalid_argument, "sandbox: file '" + name + "' is given twice");
      }
    }
    total_bytes += run.files[i].second.size();
  }
  // The tmpfs rounds every file up to whole pages.
  if (total_bytes + 4096 * (run.files.size() + 1) > limits.dir_bytes) {
    return Status(ErrorCode::invalid_argument, "sandbox: the files take " + std::to_string(total_bytes) +
                                                   " bytes, more than dir_bytes " + std::to_string(limits.dir_bytes) +
                                                   " allows; raise dir_bytes");
  }
  struct stat st {};
  if (stat(run.argv[0].c_str(), &st) != 0) {
    return Status(ErrorCode::not_found,
                  "sandbox: " + run.argv[0] + " does not exist (" + errno_text(errno) + "); " + package_hint(run.argv[0]));
  }
  if (!S_ISREG(st.st_mode) || (st.st_mode & S_IXOTH) == 0) {
    return Status(ErrorCode::invalid_argument, "sandbox: " + run.argv[0] +
                                                   " is not a file that other users may execute; the program runs "
                                                   "as an unprivileged uid");
  }
  return {};
}

uint32_t pick_uid() {
  const uint32_t slot = static_cast<uint32_t>(getpid()) % kProcessSlots;
  return kUidBase + slot * kUidsPerProcess + next_uid_slot.fetch_add(1, std::memory_order_relaxed) % kUidsPerProcess;
}

/// Reads what `fd` has into `out` up to `bound` bytes, dropping the rest.
/// False at end of file.
bool drain(int fd, std::string& out, uint64_t bound, bool& truncated) {
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == EAGAIN;  // anything else: treat as closed
    if (n == 0) return false;
    const size_t room = out.size() < bound ? static_cast<size_t>(bound - out.size()) : 0;
    out.append(buf, std::min(room, static_cast<size_t>(n)));
    if (static_cast<size_t>(n) > room) truncated = true;
  }
}

}  // namespace

Status SandboxLimits::validate() const {
  auto bad = [](const std::string& what) { return Status(ErrorCode::invalid_argument, "sandbox limits: " + what); };
  if (!(timeout_s > 0 && timeout_s <= 3600)) {
    return bad("timeout_s is " + std::to_string(timeout_s) + "; need 0 < timeout_s <= 3600");
  }
  if (cpu_s < 1 || cpu_s > 3600) return bad("cpu_s is " + std::to_string(cpu_s) + "; need 1 <= cpu_s <= 3600");
  if (memory_bytes < (1u << 20)) {
    return bad("memory_bytes is " + std::to_string(memory_bytes) + "; need at least 1 MiB (python needs ~20 MiB)");
  }
  if (dir_bytes < 4096 || dir_bytes > (1ull << 32)) {
    return bad("dir_bytes is " + std::to_string(dir_bytes) + "; need 4 KiB <= dir_bytes <= 4 GiB");
  }
  if (open_files < 4) return bad("open_files is " + std::to_string(open_files) + "; need at least 4");
  if (max_processes < 1 || max_processes > 4096) {
    return bad("max_processes is " + std::to_string(max_processes) + "; need 1 <= max_processes <= 4096");
  }
  if (total_memory_bytes != 0 && total_memory_bytes < (16ull << 20)) {
    return bad("total_memory_bytes is " + std::to_string(total_memory_bytes) +
               "; need 0 (no memory cgroup) or at least 16 MiB (python needs ~20 MiB)");
  }
  if (output_bytes > (1ull << 30)) {
    return bad("output_bytes is " + std::to_string(output_bytes) + "; need output_bytes <= 1 GiB");
  }
  return {};
}

std::vector<std::string> python_argv(std::string_view script) {
  return {std::string(kPython), "-I", "-S", "-B", std::string(script)};
}

Result<SandboxResult> run_sandboxed(const SandboxRun& run, const SandboxLimits& limits) {
  if (Status s = limits.validate(); !s.ok()) return error(s);
  if (Status s = check_run(run, limits); !s.ok()) return error(s);
  // Root makes the namespaces itself and runs the program as a uid of its
  // own; any other caller makes them in a user namespace of its own (as
  // bubblewrap and rootless Podman do), where its uid is the program's.
  const bool user_namespace = geteuid() != 0;
  auto os_error = [](const char* what) {
    return error(ErrorCode::unsupported, std::string("sandbox: ") + what + ": " + errno_text(errno));
  };

  // stdin as a memfd: the program reads it at its own pace and the parent
  // never writes to a pipe that may be full or closed (SIGPIPE).
  Fd stdin_fd(memfd_create("sandbox-stdin", MFD_CLOEXEC));
  if (stdin_fd.get() < 0) return os_error("memfd_create");
  for (size_t done = 0; done < run.stdin_data.size();) {
    const ssize_t n = write(stdin_fd.get(), run.stdin_data.data() + done, run.stdin_data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return os_error("writing stdin");
    done += static_cast<size_t>(n);
  }
  if (lseek(stdin_fd.get(), 0, SEEK_SET) != 0) return os_error("lseek");
  int out_pipe[2], err_pipe[2], report_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return os_error("pipe");
  Fd out_read(out_pipe[0]), out_write(out_pipe[1]);
  if (pipe2(err_pipe, O_CLOEXEC) != 0) return os_error("pipe");
  Fd err_read(err_pipe[0]), err_write(err_pipe[1]);
  if (pipe2(report_pipe, O_CLOEXEC) != 0) return os_error("pipe");
  Fd report_read(report_pipe[0]), report_write(report_pipe[1]);
  for (int fd : {out_read.get(), err_read.get(), report_read.get()}) fcntl(fd, F_SETFL, O_NONBLOCK);
  Fd parent_pidfd(static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0)));
  if (parent_pidfd.get() < 0) return os_error("pidfd_open (Linux 5.3+)");
  // Removed (rmdir) when this returns, after every process of the run is
  // gone and its counters are read.
  std::optional<MemoryCgroup> cgroup;
  if (limits.total_memory_bytes != 0) {
    auto parent = sandbox_cgroup_parent();
    auto made = parent ? MemoryCgroup::make(*parent, limits.total_memory_bytes)
                       : Result<MemoryCgroup>(error(parent.error()));
    if (made) {
      cgroup.emplace(std::move(*made));
    } else if (limits.require_memory_cgroup) {
      return error(ErrorCode::unsupported, made.error().message() +
                                               " (or run without it: SandboxLimits::require_memory_cgroup = false)");
    }
  }

  // Everything the child reads, built here: it may not allocate.
  std::vector<char*> argv;
  for (const std::string& arg : run.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const std::string env_home = std::string("HOME=") + kWorkDir;
  char env_path[] = "PATH=/usr/local/bin:/usr/bin:/bin";
  char env_lang[] = "LANG=C.UTF-8";
  char* envp[] = {env_path, const_cast<char*>(env_home.c_str()), env_lang, nullptr};
  std::vector<FilePlan> files;
  for (const auto& [name, content] : run.files) files.push_back({name.c_str(), content.data(), content.size()});
  const std::string tmpfs_options = "size=" + std::to_string(limits.dir_bytes) + ",nr_inodes=" +
                                    std::to_string(std::max<uint64_t>(64, limits.dir_bytes / 4096)) + ",mode=0755";
  const uint32_t uid = pick_uid();
  const std::string uid_map = std::to_string(uid) + " " + std::to_string(geteuid()) + " 1\n";
  std::vector<std::string> private_dirs = {"/home", "/root"};
  for (const char* var : {"HOME", "TROUPE_HOME"}) {
    if (const char* dir = std::getenv(var); dir != nullptr && dir[0] == '/') private_dirs.emplace_back(dir);
  }
  std::vector<const char*> private_dir_ptrs;
  for (const std::string& d : private_dirs) private_dir_ptrs.push_back(d.c_str());
  const std::string gid_map = std::to_string(uid) + " " + std::to_string(getegid()) + " 1\n";
  // Root may raise a hard limit; another caller gets at most its own.
  auto fixed = [user_namespace](__rlimit_resource_t resource, uint64_t v) {
    rlimit now{};
    if (user_namespace && getrlimit(resource, &now) == 0 && now.rlim_max != RLIM_INFINITY) {
      v = std::min<uint64_t>(v, now.rlim_max);
    }
    return ChildPlan::Limit{resource, rlimit{v, v}};
  };
  const ChildPlan plan{
      .argv = argv.data(),
      .envp = envp,
      .files = files.data(),
      .file_count = files.size(),
      .tmpfs_options = tmpfs_options.c_str(),
      .stdin_fd = stdin_fd.get(),
      .out_fd = out_write.get(),
      .err_fd = err_write.get(),
      .report_fd = report_write.get(),
      .parent_pidfd = parent_pidfd.get(),
      .cgroup_procs_fd = cgroup ? cgroup->procs_fd() : -1,
      .uid = uid,
      .user_namespace = user_namespace,
      .uid_map = uid_map.c_str(),
      .gid_map = gid_map.c_str(),
      .seccomp = sandbox_seccomp_filter(),
      .private_dirs = private_dir_ptrs.data(),
      .private_dir_count = private_dir_ptrs.size(),
      // CPU: soft = hard, so SIGKILL at the limit (the program is PID 1 of
      // its namespace, which ignores the soft limit's SIGXCPU). NPROC counts
      // the processes of the program's uid: in a user namespace, those of
      // that namespace (Linux 5.14+ counts per user namespace).
      .limits = {fixed(RLIMIT_CPU, limits.cpu_s),
                 fixed(RLIMIT_AS, limits.memory_bytes),
                 fixed(RLIMIT_FSIZE, limits.file_bytes),
                 fixed(RLIMIT_NOFILE, limits.open_files),
                 fixed(RLIMIT_NPROC, limits.max_processes),
                 fixed(RLIMIT_CORE, 0)},
  };
  void* stack = mmap(nullptr, kChildStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) return os_error("mmap");
  mprotect(stack, kGuardBytes, PROT_NONE);

  // Like posix_spawn: the child shares this memory (no copy of a large
  // process's page tables, no copy-on-write faults afterwards) on a stack
  // of its own while this thread waits (CLONE_VFORK) until it execs or
  // fails. All signals blocked across the clone, so that none runs one of
  // the parent's handlers in the child before it resets them. (Exit signal
  // SIGCHLD: exec would make it that anyway.)
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const auto start = Clock::now();
  int pidfd_raw = -1;
  const int pid = clone(sandbox_child, static_cast<char*>(stack) + kChildStackBytes + kGuardBytes,
                        CLONE_VM | CLONE_VFORK | CLONE_PIDFD | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS |
                            CLONE_NEWIPC | CLONE_NEWUTS | (user_namespace ? CLONE_NEWUSER : 0) | SIGCHLD,
                        const_cast<ChildPlan*>(&plan), &pidfd_raw);
  const int clone_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  munmap(stack, kChildStackBytes + kGuardBytes);
  if (pid < 0) {
    std::string what = "; the sandbox needs Linux 5.12+";
    if (user_namespace && (clone_errno == EPERM || clone_errno == ENOSPC || clone_errno == EUSERS)) {
      what = "; this machine does not let users make user namespaces (sysctl user.max_user_namespaces, "
             "kernel.unprivileged_userns_clone, kernel.apparmor_restrict_unprivileged_userns): allow them, or run as "
             "root";
    } else if (clone_errno == EPERM) {
      what = "; the sandbox needs root with CAP_SYS_ADMIN (in a container: --privileged)";
    }
    return error(ErrorCode::unsupported,
                 std::string("sandbox: creating the sandbox's namespaces (") + (user_namespace ? "user, " : "") +
                     "pid, net, mount, ipc, uts) failed: " + errno_text(clone_errno) + what);
  }
  Fd pidfd(pidfd_raw);
  out_write.reset();
  err_write.reset();
  report_write.reset();
  stdin_fd.reset();
  // False when someone else took the status (waitpid(-1), SIGCHLD ignored).
  auto reap = [&](siginfo_t& info) {
    for (;;) {
      if (syscall(SYS_waitid, P_PIDFD, pidfd.get(), &info, WEXITED, nullptr) == 0) return true;
      if (errno != EINTR) return false;
    }
  };

  // The child has exec'd (the report pipe closed with it) or failed (a
  // report, then exit).
  Report report{};
  if (read(report_read.get(), &report, sizeof report) == sizeof report) {
    siginfo_t info{};
    reap(info);
    return error(ErrorCode::unsupported, stage_error(report.stage, report.error, run, uid, user_namespace));
  }

  SandboxResult result;
  result.uid = uid;
  result.user_namespace = user_namespace;
  bool out_open = true, err_open = true, exited = false, killed = false;
  const Clock::time_point deadline = start + seconds(limits.timeout_s);
  Clock::time_point kill_deadline{};
  // Until the program (PID 1) is gone, which means every process of its
  // namespace is; after a kill, at most the grace.
  while (!exited) {
    const auto now = Clock::now();
    if (!killed && now >= deadline) {
      syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
      killed = true;
      result.timed_out = true;
      kill_deadline = now + seconds(kKillGrace_s);
    }
    if (killed && now >= kill_deadline) break;
    const auto until = killed ? kill_deadline : deadline;
    const int wait_ms = static_cast<int>(
        std::ceil(std::chrono::duration<double, std::milli>(std::max(until - now, Clock::duration::zero())).count()));
    pollfd fds[3];
    nfds_t count = 0;
    fds[count++] = {pidfd.get(), POLLIN, 0};
    if (out_open) fds[count++] = {out_read.get(), POLLIN, 0};
    if (err_open) fds[count++] = {err_read.get(), POLLIN, 0};
    const int ready = poll(fds, count, wait_ms);
    if (ready < 0 && errno != EINTR) break;
    for (nfds_t i = 0; i < count && ready > 0; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == out_read.get()) out_open = drain(fds[i].fd, result.out, limits.output_bytes, result.out_truncated);
      if (fds[i].fd == err_read.get()) err_open = drain(fds[i].fd, result.err, limits.output_bytes, result.err_truncated);
      if (fds[i].fd == pidfd.get()) exited = true;
    }
  }
  // Every writer in the namespace is gone: what they wrote is in the pipes.
  // Not waiting for their end: a fork elsewhere in this process may hold a
  // copy of a write end until it execs.
  if (out_open) drain(out_read.get(), result.out, limits.output_bytes, result.out_truncated);
  if (err_open) drain(err_read.get(), result.err, limits.output_bytes, result.err_truncated);
  siginfo_t info{};
  if (!reap(info)) {
    return error(ErrorCode::unsupported,
                 "sandbox: the program's exit status was taken by another wait in this process (" + errno_text(errno) +
                     "); wait for your own children by pid, and do not set SIGCHLD to SIG_IGN");
  }
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (cgroup) {
    const CgroupUsage usage = cgroup->usage();
    result.memory_cgroup = true;
    result.memory_killed = usage.oom_kills > 0;
    result.peak_memory_bytes = usage.peak_bytes;
  }
  if (info.si_code == CLD_EXITED) {
    result.exit_code = info.si_status;
    result.timed_out = false;  // it ended on its own, whatever the clock said
  } else {
    result.term_signal = info.si_status;
  }
  return result;
}

Status sandbox_memory_cgroup_available() {
  auto parent = sandbox_cgroup_parent();
  if (!parent) return parent.error();
  auto probe = MemoryCgroup::make(*parent, 64ull << 20);
  return probe ? Status() : probe.error();
}

Status sandbox_available() {
  static std::once_flag once;
  static Status status;
  std::call_once(once, [] {
    SandboxLimits limits;
    limits.timeout_s = 5;
    auto r = run_sandboxed({.argv = {"/bin/true"}, .files = {}, .stdin_data = {}}, limits);
    if (!r) {
      status = r.error();
    } else if (!r->succeeded()) {
      status = Status(ErrorCode::unsupported,
                      "sandbox: /bin/true failed in a sandbox (exit code " + std::to_string(r->exit_code) + ", signal " +
                          std::to_string(r->term_signal) + ", stderr '" + r->err + "')");
    }
  });
  return status;
}

}  // namespace troupe::rl::reward
