#include "reward/memory_cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

namespace troupe::rl::reward {

namespace {

constexpr std::string_view kPrefix = "troupe-sandbox-";
constexpr long kCgroupV1Magic = 0x27e0eb;    // CGROUP_SUPER_MAGIC
constexpr long kCgroupV2Magic = 0x63677270;  // CGROUP2_SUPER_MAGIC
// Cgroups whose removal found processes still there (a kill the kernel had
// not finished), retried at the next make(); bounded, the rest left.
constexpr size_t kMaxPending = 64;

std::atomic<uint64_t> next_cgroup{0};

std::mutex& pending_mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<std::string>& pending() {
  static auto* dirs = new std::vector<std::string>;
  return *dirs;
}

const char* env_var = "TROUPE_SANDBOX_CGROUP";

std::string why(int err) { return std::strerror(err); }

/// Removes the runs' cgroups under `dir` that processes no longer alive
/// made (a process killed while its sandboxes ran leaves their emptied
/// cgroups behind). One still in use refuses (EBUSY) and stays.
void sweep_dead(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = readdir(d)) {
    const std::string_view name = e->d_name;
    if (name.substr(0, kPrefix.size()) != kPrefix) continue;
    const long pid = std::strtol(std::string(name.substr(kPrefix.size())).c_str(), nullptr, 10);
    if (pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      rmdir((dir + "/" + std::string(name)).c_str());
  }
  closedir(d);
}

Status unsupported(std::string what) { return Status(ErrorCode::unsupported, "sandbox memory cgroup: " + what); }

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  for (;;) {
    const size_t end = s.find(sep, pos);
    out.push_back(s.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos));
    if (end == std::string_view::npos) return out;
    pos = end + 1;
  }
}

bool has_token(std::string_view list, std::string_view token, char sep) {
  for (std::string_view t : split(list, sep)) {
    if (t == token) return true;
  }
  return false;
}

// mountinfo writes space, tab, newline and backslash as \ooo.
std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3') {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

/// `path` (of this process, in its cgroup namespace) below a mount whose
/// root in the hierarchy is `root`, as a directory: the mount point plus
/// the part of the path under the root.
std::string join(const std::string& mount_point, const std::string& root, std::string_view path) {
  std::string rel(path);
  if (root != "/" && rel.compare(0, root.size(), root) == 0) rel = rel.substr(root.size());
  if (rel.empty() || rel == "/") return mount_point;
  return mount_point + (rel.front() == '/' ? "" : "/") + rel;
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return error(ErrorCode::not_found, "cannot read " + path + ": " + why(errno));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

Status write_file(const std::string& path, std::string_view text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Status(errno == ENOENT ? ErrorCode::not_found : ErrorCode::unsupported, why(errno));
  const ssize_t n = write(fd, text.data(), text.size());
  const int err = errno;
  close(fd);
  if (n != static_cast<ssize_t>(text.size())) return Status(ErrorCode::unsupported, why(n < 0 ? err : EIO));
  return {};
}

/// The number after `key ` in a "key value" per line file, or 0.
uint64_t keyed(std::string_view text, std::string_view key) {
  for (std::string_view line : split(text, '\n')) {
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ' ') {
      return std::strtoull(std::string(line.substr(key.size() + 1)).c_str(), nullptr, 10);
    }
  }
  return 0;
}

uint64_t number_in(const std::string& path) {
  auto text = read_file(path);
  return text ? std::strtoull(text->c_str(), nullptr, 10) : 0;
}

/// Checks a v2 parent: its children get the memory controller, turned on
/// here when it is not yet.
Status ready_v2(const std::string& dir) {
  auto subtree = read_file(dir + "/cgroup.subtree_control");
  if (!subtree) return unsupported(subtree.error().message());
  if (has_token(std::string_view(*subtree).substr(0, subtree->find('\n')), "memory", ' ')) return {};
  auto controllers = read_file(dir + "/cgroup.controllers");
  if (!controllers || !has_token(std::string_view(*controllers).substr(0, controllers->find('\n')), "memory", ' ')) {
    return unsupported("cgroup v2 directory " + dir +
                       " does not offer the memory controller; turn it on in its parent's cgroup.subtree_control "
                       "(echo +memory > .../cgroup.subtree_control), or set " +
                       env_var + " to a cgroup that has it");
  }
  if (Status s = write_file(dir + "/cgroup.subtree_control", "+memory"); !s.ok()) {
    return unsupported("turning on the memory controller for the children of " + dir + " failed: " + s.message() +
                       (s.message() == why(EBUSY)
                            ? " (a cgroup v2 with processes of its own cannot: this process's cgroup is one)"
                            : "") +
                       "; make an empty cgroup for sandboxes (mkdir /sys/fs/cgroup/troupe; echo +memory > "
                       "/sys/fs/cgroup/cgroup.subtree_control) and set " +
                       env_var + "=/sys/fs/cgroup/troupe, or start troupe under systemd-run -p Delegate=yes");
  }
  return {};
}

}  // namespace

Result<CgroupParent> find_memory_cgroup(std::string_view mounts, std::string_view cgroups) {
  // The memory controller's mount: v1 (a "cgroup" mount with the memory
  // option) where there is one, as on a hybrid machine; else the v2 mount.
  std::string v1_mount, v1_root, v2_mount, v2_root;
  for (std::string_view line : split(mounts, '\n')) {
    const auto fields = split(line, ' ');
    size_t dash = 0;
    while (dash < fields.size() && fields[dash] != "-") ++dash;
    if (dash < 6 || dash + 3 >= fields.size()) continue;
    const std::string_view fstype = fields[dash + 1];
    const std::string_view super_options = fields[dash + 3];
    if (fstype == "cgroup" && has_token(super_options, "memory", ',') && v1_mount.empty()) {
      v1_root = unescape(fields[3]);
      v1_mount = unescape(fields[4]);
    } else if (fstype == "cgroup2" && v2_mount.empty()) {
      v2_root = unescape(fields[3]);
      v2_mount = unescape(fields[4]);
    }
  }
  std::string v1_path, v2_path;
  bool v1_found = false, v2_found = false;
  for (std::string_view line : split(cgroups, '\n')) {
    const size_t a = line.find(':');
    const size_t b = a == std::string_view::npos ? a : line.find(':', a + 1);
    if (b == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1),
                           path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {
      v2_path = std::string(path);
      v2_found = true;
    } else if (has_token(controllers, "memory", ',')) {
      v1_path = std::string(path);
      v1_found = true;
    }
  }
  if (!v1_mount.empty()) {
    if (!v1_found) return error(unsupported("the memory controller is mounted but this process has no memory cgroup"));
    return CgroupParent{join(v1_mount, v1_root, v1_path), CgroupVersion::v1};
  }
  if (!v2_mount.empty() && v2_found) return CgroupParent{join(v2_mount, v2_root, v2_path), CgroupVersion::v2};
  return error(
      unsupported("no cgroup file system with the memory controller is mounted (mount cgroup2 on "
                  "/sys/fs/cgroup)"));
}

Result<CgroupParent> sandbox_cgroup_parent() {
  CgroupParent parent;
  if (const char* env = std::getenv(env_var); env != nullptr && *env != '\0') {
    if (std::string_view(env) == "off") return error(unsupported(std::string("turned off by ") + env_var + "=off"));
    struct statfs fs {};
    if (env[0] != '/' || statfs(env, &fs) != 0) {
      return error(unsupported(std::string(env_var) + "=" + env + " is not a directory of a cgroup file system (" +
                               (env[0] != '/' ? std::string("not an absolute path") : why(errno)) + ")"));
    }
    if (fs.f_type == kCgroupV2Magic) {
      parent = {env, CgroupVersion::v2};
    } else if (fs.f_type == kCgroupV1Magic &&
               access((std::string(env) + "/memory.limit_in_bytes").c_str(), F_OK) == 0) {
      parent = {env, CgroupVersion::v1};
    } else {
      return error(
          unsupported(std::string(env_var) + "=" + env + " is not in a cgroup hierarchy with the memory controller"));
    }
  } else {
    auto mounts = read_file("/proc/self/mountinfo");
    auto cgroups = read_file("/proc/self/cgroup");
    if (!mounts || !cgroups) {
      return error(unsupported((mounts ? cgroups.error() : mounts.error()).message() + " (is /proc mounted?)"));
    }
    auto found = find_memory_cgroup(*mounts, *cgroups);
    if (!found) return error(found.error());
    parent = std::move(*found);
  }
  if (parent.version == CgroupVersion::v2) {
    if (Status s = ready_v2(parent.dir); !s.ok()) return error(s);
  }
  return parent;
}

Result<MemoryCgroup> MemoryCgroup::make(const CgroupParent& parent, uint64_t limit_bytes) {
  {
    std::lock_guard lock(pending_mu());
    auto& dirs = pending();
    std::erase_if(dirs, [](const std::string& d) { return rmdir(d.c_str()) == 0 || errno == ENOENT; });
    static std::set<std::string>* swept = new std::set<std::string>;
    if (swept->insert(parent.dir).second) sweep_dead(parent.dir);
  }
  const std::string prefix = parent.dir + "/" + std::string(kPrefix) + std::to_string(getpid()) + "-";
  std::string dir;
  int made = -1, err = 0;
  // A name taken is one left by a dead process of this pid (removed, then
  // taken) or, rarely, a live one's in another PID namespace (busy: the
  // next number).
  for (int attempt = 0; attempt < 8 && made != 0; ++attempt) {
    dir = prefix + std::to_string(next_cgroup.fetch_add(1, std::memory_order_relaxed));
    made = mkdir(dir.c_str(), 0755);
    err = errno;
    if (made != 0 && err == EEXIST && rmdir(dir.c_str()) == 0) {
      made = mkdir(dir.c_str(), 0755);
      err = errno;
    }
    if (made != 0 && err != EEXIST) break;
  }
  if (made != 0) {
    return error(
        unsupported("making " + dir + " failed: " + why(err) +
                    (err == EACCES || err == EPERM || err == EROFS
                         ? std::string("; run as root, or set ") + env_var + " to a cgroup this user may manage"
                         : std::string())));
  }
  MemoryCgroup cgroup(dir, parent.version, -1);  // removed again on any failure below
  const std::string limit = std::to_string(limit_bytes);
  // The memory limit first: v1 refuses a swap limit below it. Swap counts
  // too (ENOENT: the kernel does not count swap, so there is none to use).
  const std::string memory = parent.version == CgroupVersion::v1 ? "/memory.limit_in_bytes" : "/memory.max";
  const std::string swap = parent.version == CgroupVersion::v1 ? "/memory.memsw.limit_in_bytes" : "/memory.swap.max";
  if (Status s = write_file(dir + memory, limit); !s.ok()) {
    return error(unsupported("setting " + dir + memory + " to " + limit + " failed: " + s.message()));
  }
  if (Status s = write_file(dir + swap, parent.version == CgroupVersion::v1 ? limit : "0");
      !s.ok() && s.code() != ErrorCode::not_found) {
    return error(unsupported("setting " + dir + swap + " failed: " + s.message()));
  }
  cgroup.procs_fd_ = open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  if (cgroup.procs_fd_ < 0) return error(unsupported("opening " + dir + "/cgroup.procs failed: " + why(errno)));
  return cgroup;
}

MemoryCgroup::MemoryCgroup(MemoryCgroup&& other) noexcept
    : dir_(std::move(other.dir_)), version_(other.version_), procs_fd_(std::exchange(other.procs_fd_, -1)) {
  other.dir_.clear();
}

MemoryCgroup& MemoryCgroup::operator=(MemoryCgroup&& other) noexcept {
  if (this != &other) {
    release();
    dir_ = std::move(other.dir_);
    other.dir_.clear();
    version_ = other.version_;
    procs_fd_ = std::exchange(other.procs_fd_, -1);
  }
  return *this;
}

MemoryCgroup::~MemoryCgroup() { release(); }

void MemoryCgroup::release() {
  if (procs_fd_ >= 0) close(procs_fd_);
  procs_fd_ = -1;
  if (dir_.empty()) return;
  if (rmdir(dir_.c_str()) != 0 && errno == EBUSY) {
    std::lock_guard lock(pending_mu());
    if (pending().size() < kMaxPending) pending().push_back(dir_);
  }
  dir_.clear();
}

CgroupUsage MemoryCgroup::usage() const {
  CgroupUsage u;
  if (version_ == CgroupVersion::v1) {
    u.peak_bytes = number_in(dir_ + "/memory.max_usage_in_bytes");
    if (auto oom = read_file(dir_ + "/memory.oom_control")) u.oom_kills = keyed(*oom, "oom_kill");
  } else {
    u.peak_bytes = number_in(dir_ + "/memory.peak");
    if (auto events = read_file(dir_ + "/memory.events")) u.oom_kills = keyed(*events, "oom_kill");
  }
  return u;
}

}  // namespace troupe::rl::reward
