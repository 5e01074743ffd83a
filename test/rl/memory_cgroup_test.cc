// Where a sandbox run's memory cgroup goes: found from /proc/self/mountinfo
// and /proc/self/cgroup on hybrid (v1 memory), pure v2 and containerised
// machines; made, limited, counted and removed on this one. The runs under
// it are in sandbox_test.cc.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "reward/memory_cgroup.h"

using namespace troupe::rl::reward;
namespace fs = std::filesystem;

namespace {

// Lines as the kernel writes them (Debian 12 hybrid, a v2 host, a
// container with a cgroup namespace, an old container without one).
constexpr const char* kHybridMounts =
    "24 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "32 24 0:27 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
    "33 32 0:28 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw\n"
    "36 32 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:15 - cgroup cgroup rw,cpu,cpuacct\n"
    "38 32 0:33 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,memory\n";
constexpr const char* kHybridCgroups =
    "12:pids:/user.slice/user-0.slice/session-1.scope\n"
    "4:memory:/user.slice/user-0.slice/session-1.scope\n"
    "2:cpu,cpuacct:/user.slice\n"
    "0::/user.slice/user-0.slice/session-1.scope\n";

/// True where this process may make memory cgroups (as root here, and in
/// CI); elsewhere (a cgroup v2 host without a delegated cgroup) checks that
/// the reason is an error that says what to do, and warns.
bool parent_here(const troupe::Result<CgroupParent>& parent) {
  if (parent) return true;
  WARN("no memory cgroup parent on this machine: " << parent.error().to_string());
  CHECK(parent.error().code() == troupe::ErrorCode::unsupported);
  CHECK(parent.error().message().rfind("sandbox memory cgroup: ", 0) == 0);
  return false;
}

}  // namespace

TEST_CASE("memory cgroup: a hybrid machine's runs go under this process's v1 memory cgroup", "[rl][sandbox]") {
  auto p = find_memory_cgroup(kHybridMounts, kHybridCgroups);
  REQUIRE(p);
  CHECK(p->version == CgroupVersion::v1);
  CHECK(p->dir == "/sys/fs/cgroup/memory/user.slice/user-0.slice/session-1.scope");
}

TEST_CASE("memory cgroup: a v2 machine's runs go under this process's v2 cgroup, a container's under its namespace's",
          "[rl][sandbox]") {
  const char* mounts =
      "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
      "rw,nsdelegate,memory_recursiveprot\n";
  auto host = find_memory_cgroup(mounts, "0::/system.slice/troupe.service\n");
  REQUIRE(host);
  CHECK(host->version == CgroupVersion::v2);
  CHECK(host->dir == "/sys/fs/cgroup/system.slice/troupe.service");
  // A cgroup namespace: its root is "/", the mount's root too.
  auto in_namespace = find_memory_cgroup(mounts, "0::/\n");
  REQUIRE(in_namespace);
  CHECK(in_namespace->dir == "/sys/fs/cgroup");
  // No namespace, the container's cgroup bound over the mount point: the
  // path is the host's, the mount's root says which part is mounted.
  auto bound = find_memory_cgroup("700 690 0:26 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n",
                                  "0::/docker/abc/sandboxes\n");
  REQUIRE(bound);
  CHECK(bound->dir == "/sys/fs/cgroup/sandboxes");
  // Escaped characters in the mount point.
  auto spaced = find_memory_cgroup("30 24 0:26 / /mnt/c\\040g rw - cgroup2 cgroup2 rw\n", "0::/a\n");
  REQUIRE(spaced);
  CHECK(spaced->dir == "/mnt/c g/a");
}

TEST_CASE("memory cgroup: a machine without a memory hierarchy is refused with what to do", "[rl][sandbox]") {
  auto none = find_memory_cgroup("24 30 0:22 / /sys rw - sysfs sysfs rw\n", "0::/\n");
  REQUIRE_FALSE(none);
  CHECK(none.error().code() == troupe::ErrorCode::unsupported);
  CHECK(none.error().message().find("mount cgroup2") != std::string::npos);
  // v1's memory mounted, but this process in no memory cgroup (a broken
  // /proc/self/cgroup): named.
  auto orphan = find_memory_cgroup(kHybridMounts, "0::/\n");
  REQUIRE_FALSE(orphan);
  CHECK(orphan.error().message().find("no memory cgroup") != std::string::npos);
  // Garbage is no mount at all.
  CHECK_FALSE(find_memory_cgroup("not a mount line\n- - -\n", "x\n"));
}

TEST_CASE("memory cgroup: a run's cgroup has its limit, counts its memory and is removed", "[rl][sandbox]") {
  auto parent = sandbox_cgroup_parent();
  if (!parent_here(parent)) return;
  std::string dir;
  {
    auto made = MemoryCgroup::make(*parent, 96ull << 20);
    INFO((made ? std::string() : made.error().to_string()));
    REQUIRE(made);
    dir = made->dir();
    CHECK(fs::is_directory(dir));
    CHECK(dir.rfind(parent->dir + "/troupe-sandbox-" + std::to_string(getpid()) + "-", 0) == 0);
    std::ifstream limit(dir + (parent->version == CgroupVersion::v1 ? "/memory.limit_in_bytes" : "/memory.max"));
    uint64_t bytes = 0;
    limit >> bytes;
    CHECK(bytes == 96ull << 20);
    CHECK(made->procs_fd() >= 0);
    // Nothing has run in it yet.
    CHECK(made->usage().oom_kills == 0);
    // Moved: one owner, one removal.
    MemoryCgroup moved = std::move(*made);
    CHECK(moved.dir() == dir);
    CHECK(made->dir().empty());
  }
  CHECK_FALSE(fs::exists(dir));
}

TEST_CASE("memory cgroup: cgroups left by dead processes are removed, a live process's are kept", "[rl][sandbox]") {
  auto own = sandbox_cgroup_parent();
  if (!parent_here(own)) return;
  // A parent of the test's own, new to this process (each parent is swept
  // at its first use).
  const CgroupParent parent{own->dir + "/troupe-test-sweep-" + std::to_string(getpid()), own->version};
  REQUIRE(mkdir(parent.dir.c_str(), 0755) == 0);
  if (parent.version == CgroupVersion::v2) std::ofstream(parent.dir + "/cgroup.subtree_control") << "+memory";
  // The pid of a process that is gone: a child, reaped.
  const pid_t gone = fork();
  REQUIRE(gone >= 0);
  if (gone == 0) _exit(0);
  REQUIRE(waitpid(gone, nullptr, 0) == gone);
  const std::string stale = parent.dir + "/troupe-sandbox-" + std::to_string(gone) + "-3";
  const std::string live = parent.dir + "/troupe-sandbox-" + std::to_string(getppid()) + "-7";
  REQUIRE(mkdir(stale.c_str(), 0755) == 0);
  REQUIRE(mkdir(live.c_str(), 0755) == 0);
  {
    auto made = MemoryCgroup::make(parent, 64ull << 20);
    INFO((made ? std::string() : made.error().to_string()));
    REQUIRE(made);
    CHECK_FALSE(fs::exists(stale));
    CHECK(fs::exists(live));
  }
  CHECK(rmdir(live.c_str()) == 0);
  CHECK(rmdir(parent.dir.c_str()) == 0);
}
