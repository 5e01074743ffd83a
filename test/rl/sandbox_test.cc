// The sandbox for untrusted code and the code-writing task it scores: a
// program runs with its files, stdin and output; it reaches no network,
// writes nowhere but its own directory, and whatever it does (fork bombs,
// memory bombs, endless loops, floods) ends within its limits with nothing
// left behind. The code task's problems are reproducible, its reference
// answers score 1, the weak teacher's dropped parentheses and garbage do
// not, and parallel scoring equals serial. The sandbox is made by root
// here (CI runs as root) and, for the path every other user takes (a user
// namespace of its own), by a child of the test dropped to nobody.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "reward/memory_cgroup.h"
#include "reward/sandbox.h"
#include "reward/seccomp_filter.h"
#include "support/scoped_env.h"
#include "tasks/code.h"

using namespace troupe::rl;
using reward::SandboxLimits;
using reward::SandboxResult;
using reward::SandboxRun;
namespace fs = std::filesystem;

namespace {

/// Fails the test, with the sandbox's reason, where sandboxes cannot be
/// made or Python is missing: a test that passes without them would prove
/// nothing.
void require_sandbox() {
  const troupe::Status s = reward::sandbox_available();
  INFO(s.to_string());
  REQUIRE(s.ok());
  INFO(reward::kPython << " is missing: install Debian package python3-minimal");
  REQUIRE(fs::exists(reward::kPython));
}

/// `script` run as main.py under python in a sandbox.
SandboxResult run_python(const std::string& script, const SandboxLimits& limits = {}, std::string stdin_data = {}) {
  SandboxRun run{.argv = reward::python_argv("main.py"), .files = {{"main.py", script}}, .stdin_data = stdin_data};
  auto r = reward::run_sandboxed(run, limits);
  INFO((r ? std::string() : r.error().to_string()));
  REQUIRE(r);
  return *r;
}

/// Processes on the host whose real uid is `uid`.
std::vector<int> processes_of_uid(uint32_t uid) {
  std::vector<int> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream status(entry.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("Uid:", 0) == 0) {
        if (std::stoul(line.substr(4)) == uid) pids.push_back(std::stoi(name));
        break;
      }
    }
  }
  return pids;
}

std::string unique_host_path(const std::string& tag) {
  static std::atomic<int> n{0};
  return (fs::temp_directory_path() / ("troupe-sandbox-" + tag + "-" + std::to_string(getpid()) + "-" +
                                       std::to_string(n.fetch_add(1))))
      .string();
}

std::atomic<int> sigchld_count{0};
void count_sigchld(int) { sigchld_count.fetch_add(1); }

/// Host processes in the namespace `ns` of kind `kind` ("pid", "mnt");
/// with `marker`, only those that see that file at that path (under their
/// root). The kernel reuses a freed namespace's number, so a sandbox started
/// meanwhile by a test running beside this one may have it by now: a file
/// only the asking test's sandbox wrote tells them apart.
int processes_in_namespace(const std::string& kind, const std::string& ns, const std::string& marker = "") {
  int count = 0;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    std::error_code ec;
    if (fs::read_symlink(entry.path() / "ns" / kind, ec) != ns || ec) continue;
    if (!marker.empty() && !fs::exists(entry.path() / "root" / marker.substr(1), ec)) continue;
    ++count;
  }
  return count;
}

constexpr uint32_t kNobody = 65534;

/// Forks children that would live forever until fork fails, then prints
/// how many it made.
constexpr const char* kBoundedForks =
    "import os, time\nn = 0\n"
    "while True:\n"
    "    try:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(1000)\n"
    "            os._exit(0)\n"
    "        n += 1\n"
    "    except OSError:\n"
    "        break\n"
    "print(n)\n";

/// run_sandboxed as a user who is not root: a child of this process drops
/// to nobody, runs the sandbox, and sends the result back as JSON.
troupe::Result<SandboxResult> run_as_nobody(const SandboxRun& run, const SandboxLimits& limits) {
  // The child of a process with threads may take no lock another thread
  // held at the fork: the filter's one-time build happens here first.
  REQUIRE(reward::sandbox_seccomp_filter() != nullptr);
  int fds[2];
  REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    nlohmann::json j;
    if (setgroups(0, nullptr) != 0 || setresgid(kNobody, kNobody, kNobody) != 0 ||
        setresuid(kNobody, kNobody, kNobody) != 0) {
      j = {{"code", static_cast<int>(troupe::ErrorCode::handler_failed)},
           {"error", std::string("dropping to nobody: ") + std::strerror(errno)}};
    } else {
      // A user's own process is dumpable; one that changed its uid is not
      // until it says so.
      prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
      auto r = reward::run_sandboxed(run, limits);
      if (!r) {
        j = {{"code", static_cast<int>(r.error().code())}, {"error", r.error().message()}};
      } else {
        j = {{"exit_code", r->exit_code},         {"term_signal", r->term_signal}, {"timed_out", r->timed_out},
             {"out", r->out},                     {"err", r->err},                 {"out_truncated", r->out_truncated},
             {"err_truncated", r->err_truncated}, {"wall_seconds", r->wall_seconds}, {"uid", r->uid},
             {"user_namespace", r->user_namespace}, {"memory_cgroup", r->memory_cgroup}, {"euid", geteuid()}};
      }
    }
    const std::string text = j.dump();
    for (size_t done = 0; done < text.size();) {
      const ssize_t n = write(fds[1], text.data() + done, text.size() - done);
      if (n <= 0) _exit(1);
      done += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    REQUIRE(n > 0);
    text.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  const auto j = nlohmann::json::parse(text);
  if (j.contains("error")) {
    return troupe::error(static_cast<troupe::ErrorCode>(j["code"].get<int>()), j["error"].get<std::string>());
  }
  CHECK(j["euid"] == kNobody);
  SandboxResult r;
  r.exit_code = j["exit_code"];
  r.term_signal = j["term_signal"];
  r.timed_out = j["timed_out"];
  r.out = j["out"];
  r.err = j["err"];
  r.out_truncated = j["out_truncated"];
  r.err_truncated = j["err_truncated"];
  r.wall_seconds = j["wall_seconds"];
  r.uid = j["uid"];
  r.user_namespace = j["user_namespace"];
  r.memory_cgroup = j["memory_cgroup"];
  return r;
}

/// `script` run as main.py under python in a sandbox made by nobody.
SandboxResult run_python_as_nobody(const std::string& script, const SandboxLimits& limits = {}) {
  SandboxRun run{.argv = reward::python_argv("main.py"), .files = {{"main.py", script}}, .stdin_data = "from stdin"};
  auto r = run_as_nobody(run, limits);
  INFO((r ? std::string() : r.error().to_string()));
  REQUIRE(r);
  return *r;
}

}  // namespace

TEST_CASE("sandbox: a program gets its files and stdin, and its output and exit code come back", "[rl][sandbox]") {
  require_sandbox();
  // This process's handlers and signal mask stay as they were.
  struct sigaction count {}, old {}, after {};
  count.sa_handler = count_sigchld;
  sigaction(SIGCHLD, &count, &old);
  sigset_t mask_before, mask_after;
  pthread_sigmask(SIG_SETMASK, nullptr, &mask_before);
  SandboxRun run{.argv = reward::python_argv("main.py"),
                 .files = {{"main.py",
                            "import os, sys\n"
                            "data = open('data.txt').read()\n"
                            "print(os.getcwd(), data, sys.stdin.read(), sep='|')\n"
                            "print('to stderr', file=sys.stderr)\n"
                            "sys.exit(3)\n"},
                           {"data.txt", "file contents"}},
                 .stdin_data = "from stdin"};
  auto r = reward::run_sandboxed(run, {});
  pthread_sigmask(SIG_SETMASK, nullptr, &mask_after);
  sigaction(SIGCHLD, &old, &after);
  CHECK(after.sa_handler == count_sigchld);
  for (int sig = 1; sig < SIGRTMIN; ++sig) CHECK(sigismember(&mask_before, sig) == sigismember(&mask_after, sig));
  REQUIRE(r);
  CHECK(r->out == "/tmp/work|file contents|from stdin\n");
  CHECK(r->err == "to stderr\n");
  CHECK(r->exit_code == 3);
  CHECK(r->term_signal == 0);
  CHECK_FALSE(r->timed_out);
  CHECK_FALSE(r->out_truncated);
  CHECK_FALSE(r->succeeded());
  CHECK(r->uid >= 2'000'000'000u);
  CHECK(r->wall_seconds > 0);

  auto ok = run_python("print(sum(range(10)))");
  CHECK(ok.out == "45\n");
  CHECK(ok.succeeded());
}

TEST_CASE("sandbox: the network is unreachable, the host's loopback included", "[rl][sandbox]") {
  require_sandbox();
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(listener, 4) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const int port = ntohs(addr.sin_port);

  auto r = run_python("import socket\n"
                      "print([name for _, name in socket.if_nameindex()])\n"
                      "try:\n"
                      "    socket.create_connection(('127.0.0.1', " +
                      std::to_string(port) +
                      "), timeout=2)\n"
                      "    print('connected')\n"
                      "except OSError as e:\n"
                      "    print('failed', e.errno)\n");
  INFO(r.out << r.err);
  CHECK(r.out.find("['lo']") != std::string::npos);  // no interface but a loopback, and that one down
  CHECK(r.out.find("failed " + std::to_string(ENETUNREACH)) != std::string::npos);
  CHECK(r.out.find("connected") == std::string::npos);
  // Nothing reached the listener.
  CHECK(accept(listener, nullptr, nullptr) < 0);
  CHECK(errno == EAGAIN);
  close(listener);
}

TEST_CASE("sandbox: writes outside the working directory fail, writes inside succeed", "[rl][sandbox]") {
  require_sandbox();
  const std::string host_tmp = unique_host_path("escape");
  const std::vector<std::string> outside = {host_tmp,
                                            "/var/tmp/troupe-sandbox-escape",
                                            "/dev/shm/troupe-sandbox-escape",
                                            "/dev/troupe-sandbox-escape",
                                            "/run/troupe-sandbox-escape",
                                            "/etc/troupe-sandbox-escape",
                                            "/tmp/troupe-sandbox-escape"};
  std::string script = "import os\n";
  for (const std::string& path : outside) {
    script += "try:\n    open('" + path + "', 'w').write('x')\n    print('wrote')\nexcept OSError as e:\n    print(e.errno)\n";
  }
  script += "open('inside.txt', 'w').write('abc')\nos.mkdir('sub')\nopen('sub/f', 'w').write('d')\n"
            "open('/dev/null', 'w').write('gone')\n"
            "print(open('inside.txt').read() + open('sub/f').read() + str(len(open('/dev/urandom', 'rb').read(4))))\n";
  auto r = run_python(script);
  INFO(r.out << r.err);
  REQUIRE(r.succeeded());
  CHECK(r.out.find("wrote") == std::string::npos);
  // A read-only filesystem (EROFS), not ours (EACCES), or not there
  // (ENOENT: the sandbox's /dev has no shm).
  size_t lines = 0;
  for (size_t pos = 0; (pos = r.out.find('\n', pos)) != std::string::npos; ++pos) ++lines;
  CHECK(lines == outside.size() + 1);
  for (const std::string& path : outside) CHECK_FALSE(fs::exists(path));
  for (size_t start = 0, i = 0; i < outside.size(); ++i) {
    const size_t end = r.out.find('\n', start);
    const int err = std::stoi(r.out.substr(start, end - start));
    CHECK((err == EROFS || err == EACCES || err == ENOENT));
    start = end + 1;
  }
  CHECK(r.out.find("abcd4\n") != std::string::npos);
}

TEST_CASE("sandbox: the working directory is fresh for each run and gone afterwards", "[rl][sandbox]") {
  require_sandbox();
  auto first = run_python(
      "import os\nopen('left-behind.txt', 'w').write('x' * 100000)\n"
      "print(os.readlink('/proc/self/ns/mnt'))\n");
  REQUIRE(first.succeeded());
  const std::string ns = first.out.substr(0, first.out.find('\n'));
  CHECK(ns.rfind("mnt:[", 0) == 0);
  // No process is left in the sandbox's mount namespace, so it and its
  // tmpfs are gone; the host never had the file.
  CHECK(processes_in_namespace("mnt", ns, "/tmp/work/left-behind.txt") == 0);
  CHECK_FALSE(fs::exists("/tmp/work/left-behind.txt"));
  auto second = run_python("import os\nprint(sorted(os.listdir('.')))\n");
  CHECK(second.out == "['main.py']\n");
}

TEST_CASE("sandbox: a fork bomb is contained and leaves no process behind", "[rl][sandbox]") {
  require_sandbox();
  SandboxLimits limits;
  limits.max_processes = 4;
  limits.timeout_s = 5;
  // Children that would live forever: the program gets max_processes - 1
  // of them, and they die with it.
  auto bounded = run_python(
      kBoundedForks,
      limits);
  INFO(bounded.out << bounded.err);
  CHECK(bounded.out == "3\n");
  CHECK(bounded.succeeded());
  CHECK(bounded.wall_seconds < 2.0);
  CHECK(processes_of_uid(bounded.uid).empty());

  // A real bomb: every process forks forever; the timeout ends it.
  limits.timeout_s = 1;
  const auto start = std::chrono::steady_clock::now();
  auto bomb = run_python(
      "import os\n"
      "while True:\n"
      "    try:\n"
      "        os.fork()\n"
      "    except OSError:\n"
      "        pass\n",
      limits);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(bomb.timed_out);
  CHECK(bomb.term_signal == SIGKILL);
  CHECK(elapsed >= 1.0);
  CHECK(elapsed < 2.0);
  CHECK(processes_of_uid(bomb.uid).empty());
}

TEST_CASE("sandbox: a memory bomb fails inside the sandbox", "[rl][sandbox]") {
  require_sandbox();
  SandboxLimits limits;
  limits.memory_bytes = 64ull << 20;
  auto big = run_python("x = bytearray(1 << 30)\n", limits);
  CHECK(big.exit_code == 1);
  CHECK(big.err.find("MemoryError") != std::string::npos);
  auto growing = run_python("a = []\nwhile True:\n    a.append(bytearray(1 << 20))\n", limits);
  CHECK(growing.exit_code == 1);
  CHECK(growing.err.find("MemoryError") != std::string::npos);
  CHECK_FALSE(growing.timed_out);
  // This process is untouched and can still allocate.
  std::vector<char> fine(16 << 20, 1);
  CHECK(fine.back() == 1);
}

/// Three children of 60 MiB each, alive at once: each allocates, says so,
/// and waits to be released. Prints how many got there, then each child's
/// end (0, or -9 for a SIGKILL). The first child's death ends the wait
/// (SIGCHLD; later ones, once the wait is over, change nothing).
constexpr const char* kThreeChildren =
    "import os, signal\n"
    "class Died(Exception):\n"
    "    pass\n"
    "died = False\n"
    "def on_child(sig, frame):\n"
    "    global died\n"
    "    if not died:\n"
    "        died = True\n"
    "        raise Died()\n"
    "r, w = os.pipe()\n"
    "hold_r, hold_w = os.pipe()\n"
    "pids, ready = [], 0\n"
    "signal.signal(signal.SIGCHLD, on_child)\n"
    "try:\n"
    "    for i in range(3):\n"
    "        pid = os.fork()\n"
    "        if pid == 0:\n"
    "            signal.signal(signal.SIGCHLD, signal.SIG_DFL)\n"
    "            os.close(hold_w)\n"
    "            b = b'\\1' * (60 << 20)\n"
    "            os.write(w, b'x')\n"
    "            os.read(hold_r, 1)\n"
    "            os._exit(0)\n"
    "        pids.append(pid)\n"
    "    while ready < 3:\n"
    "        ready += len(os.read(r, 3))\n"
    "except Died:\n"
    "    pass\n"
    "signal.signal(signal.SIGCHLD, signal.SIG_DFL)\n"
    "os.close(hold_w)\n"
    "print(ready, sorted(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids))\n";

/// Where runs get no memory cgroup: a run goes on without one (no peak
/// counted), and one that requires it is refused, the reason containing
/// `why`.
void check_runs_without_cgroup(const std::string& why) {
  SandboxLimits limits;
  auto r = run_python("print('hi')\n", limits);
  CHECK(r.succeeded());
  CHECK_FALSE(r.memory_cgroup);
  CHECK(r.peak_memory_bytes == 0);
  limits.require_memory_cgroup = true;
  const SandboxRun empty{.argv = reward::python_argv("main.py"), .files = {{"main.py", ""}}, .stdin_data = {}};
  auto refused = reward::run_sandboxed(empty, limits);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == troupe::ErrorCode::unsupported);
  CHECK_THAT(refused.error().message(), Catch::Contains(why) && Catch::Contains("require_memory_cgroup"));
}

/// True where sandbox runs get a memory cgroup on this machine (as root
/// here, and in CI). Where they do not (a cgroup v2 host without a
/// delegated cgroup), checks what a run does instead (it goes on without
/// one, and is refused with the reason when one is required) and warns why,
/// so that a caller skips its checks of the cgroup only with the fallback
/// checked in their place.
bool memory_cgroups_here() {
  const troupe::Status available = reward::sandbox_memory_cgroup_available();
  if (available.ok()) return true;
  WARN("no memory cgroup for sandboxes on this machine (" << available.to_string() << "): checking runs without one");
  check_runs_without_cgroup("sandbox memory cgroup");
  return false;
}

TEST_CASE("sandbox: a memory cgroup bounds the run's processes together, and the kernel's kill is reported",
          "[rl][sandbox]") {
  require_sandbox();
  if (!memory_cgroups_here()) return;
  SandboxLimits limits;
  limits.timeout_s = 30;
  limits.require_memory_cgroup = true;
  // Each child is well within its own address space (RLIMIT_AS 256 MiB):
  // only the sum is bounded.
  limits.total_memory_bytes = 512ull << 20;
  auto roomy = run_python(kThreeChildren, limits);
  INFO(roomy.out << roomy.err);
  CHECK(roomy.succeeded());
  CHECK(roomy.out == "3 [0, 0, 0]\n");
  CHECK(roomy.memory_cgroup);
  CHECK_FALSE(roomy.memory_killed);
  CHECK(roomy.peak_memory_bytes >= 180ull << 20);
  CHECK(roomy.peak_memory_bytes <= limits.total_memory_bytes);

  // 128 MiB for three times 60: the kernel kills a child (the largest) and
  // the program goes on to report it.
  limits.total_memory_bytes = 128ull << 20;
  auto tight = run_python(kThreeChildren, limits);
  INFO(tight.out << tight.err);
  CHECK(tight.succeeded());
  CHECK(tight.memory_cgroup);
  CHECK(tight.memory_killed);
  CHECK(tight.out.rfind("3 ", 0) != 0);  // not all three got their memory
  CHECK(tight.out.find("-9") != std::string::npos);
  CHECK(tight.peak_memory_bytes > 0);
  CHECK(tight.peak_memory_bytes <= limits.total_memory_bytes);
  CHECK(processes_of_uid(tight.uid).empty());
  // This process is untouched and can still allocate.
  std::vector<char> fine(256 << 20, 1);
  CHECK(fine.back() == 1);
}

TEST_CASE("sandbox: each run's cgroup is removed, TROUPE_SANDBOX_CGROUP picks the parent or turns cgroups off",
          "[rl][sandbox]") {
  require_sandbox();
  if (!memory_cgroups_here()) return;
  auto own = reward::sandbox_cgroup_parent();
  INFO((own ? std::string() : own.error().to_string()));
  REQUIRE(own);
  auto runs_under = [](const std::string& dir) {
    size_t n = 0;
    for (const auto& entry : fs::directory_iterator(dir)) {
      n += entry.is_directory() &&
           entry.path().filename().string().rfind("troupe-sandbox-" + std::to_string(getpid()) + "-", 0) == 0;
    }
    return n;
  };
  SandboxLimits limits;
  limits.require_memory_cgroup = true;
  auto r = run_python("print('hi')\n", limits);
  CHECK(r.succeeded());
  CHECK(r.memory_cgroup);
  CHECK(r.peak_memory_bytes > 0);
  CHECK(runs_under(own->dir) == 0);

  // A parent of the caller's own: the runs' cgroups go there, and go.
  const std::string mine = own->dir + "/troupe-test-parent-" + std::to_string(getpid());
  REQUIRE(mkdir(mine.c_str(), 0755) == 0);
  // The caller's own setting (a v2 machine's delegated parent) comes back
  // after the test, however it ends.
  troupe::test::ScopedEnv restore("TROUPE_SANDBOX_CGROUP", mine);
  auto under = run_python("import os\nprint(open('/proc/self/cgroup').read())\n", limits);
  CHECK(under.succeeded());
  CHECK(under.memory_cgroup);
  // The program sees its cgroup (the host's path: no cgroup namespace).
  CHECK(under.out.find("troupe-test-parent-" + std::to_string(getpid()) + "/troupe-sandbox-") != std::string::npos);
  CHECK(runs_under(mine) == 0);

  // Off: without the cgroup the run goes on, unless it is required.
  setenv("TROUPE_SANDBOX_CGROUP", "off", 1);
  check_runs_without_cgroup("TROUPE_SANDBOX_CGROUP=off");
  CHECK_FALSE(reward::sandbox_memory_cgroup_available().ok());
  // Not a cgroup: named.
  setenv("TROUPE_SANDBOX_CGROUP", "/tmp", 1);
  CHECK_THAT(reward::sandbox_memory_cgroup_available().message(), Catch::Contains("/tmp"));
  CHECK(rmdir(mine.c_str()) == 0);
}

TEST_CASE("sandbox: an endless program is killed at the timeout, a busy one at its CPU limit", "[rl][sandbox]") {
  require_sandbox();
  SandboxLimits limits;
  limits.timeout_s = 1;
  for (const char* script : {"while True:\n    pass\n", "import time\ntime.sleep(1000)\n"}) {
    INFO(script);
    auto r = run_python(script, limits);
    CHECK(r.timed_out);
    CHECK(r.term_signal == SIGKILL);
    CHECK(r.exit_code == -1);
    CHECK(r.wall_seconds >= 1.0);
    CHECK(r.wall_seconds < 2.0);
    CHECK(processes_of_uid(r.uid).empty());
  }
  limits.timeout_s = 10;
  limits.cpu_s = 1;
  auto busy = run_python("while True:\n    pass\n", limits);
  CHECK_FALSE(busy.timed_out);
  CHECK(busy.term_signal == SIGKILL);
  CHECK(busy.wall_seconds < limits.timeout_s);
}

TEST_CASE("sandbox: an output flood is cut at the bound without blocking the program", "[rl][sandbox]") {
  require_sandbox();
  SandboxLimits limits;
  limits.output_bytes = 1000;
  auto r = run_python(
      "import sys\nsys.stdout.write('o' * 10_000_000)\nsys.stdout.flush()\n"
      "sys.stderr.write('e' * 10_000_000)\nprint('finished', file=sys.stderr)\n",
      limits);
  CHECK(r.succeeded());  // it wrote all 20 MB: nothing blocked
  CHECK(r.out == std::string(1000, 'o'));
  CHECK(r.err == std::string(1000, 'e'));
  CHECK(r.out_truncated);
  CHECK(r.err_truncated);
  auto small = run_python("print('x' * 999)\n", limits);
  CHECK(small.out.size() == 1000);
  CHECK_FALSE(small.out_truncated);
  // A flood that never ends: the timeout, and still the bound.
  limits.timeout_s = 1;
  auto endless = run_python("import sys\nwhile True:\n    sys.stdout.write('z' * 65536)\n", limits);
  CHECK(endless.timed_out);
  CHECK(endless.out.size() == 1000);
  CHECK(endless.out_truncated);
}

TEST_CASE("sandbox: bad limits and runs are refused, naming what is wrong", "[rl][sandbox]") {
  auto refused = [](const SandboxLimits& limits, const std::string& field) {
    INFO(field);
    CHECK_THAT(limits.validate().message(), Catch::Contains(field));
    auto r = reward::run_sandboxed({.argv = reward::python_argv("main.py"), .files = {}, .stdin_data = {}}, limits);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == troupe::ErrorCode::invalid_argument);
    CHECK_THAT(r.error().message(), Catch::Contains(field));
  };
  CHECK(SandboxLimits{}.validate().ok());
  refused({.timeout_s = 0}, "timeout_s");
  refused({.timeout_s = -1}, "timeout_s");
  refused({.cpu_s = 0}, "cpu_s");
  refused({.memory_bytes = 0}, "memory_bytes");
  refused({.dir_bytes = 0}, "dir_bytes");
  refused({.open_files = 0}, "open_files");
  refused({.max_processes = 0}, "max_processes");
  refused({.output_bytes = 1ull << 40}, "output_bytes");
  refused({.total_memory_bytes = 1ull << 20}, "total_memory_bytes");

  auto bad_run = [](const SandboxRun& run, const std::string& what) {
    INFO(what);
    auto r = reward::run_sandboxed(run, {});
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == troupe::ErrorCode::invalid_argument);
    CHECK_THAT(r.error().message(), Catch::Contains(what));
  };
  bad_run({.argv = {"python3", "-c", "pass"}, .files = {}, .stdin_data = {}}, "absolute path");
  bad_run({.argv = {}, .files = {}, .stdin_data = {}}, "absolute path");
  bad_run({.argv = reward::python_argv("main.py"), .files = {{"../escape.py", ""}}, .stdin_data = {}}, "../escape.py");
  bad_run({.argv = reward::python_argv("main.py"), .files = {{"a", ""}, {"a", ""}}, .stdin_data = {}}, "twice");
}

TEST_CASE("sandbox: a missing interpreter is reported with its package", "[rl][sandbox]") {
  auto missing = reward::run_sandboxed(
      {.argv = {"/usr/bin/python3-not-installed", "-c", "pass"}, .files = {}, .stdin_data = {}}, {});
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code() == troupe::ErrorCode::not_found);
  CHECK_THAT(missing.error().message(), Catch::Contains("/usr/bin/python3-not-installed") &&
                                            Catch::Contains("python3-minimal"));
  auto other = reward::run_sandboxed({.argv = {"/opt/no-such-tool"}, .files = {}, .stdin_data = {}}, {});
  REQUIRE_FALSE(other);
  CHECK(other.error().code() == troupe::ErrorCode::not_found);
  CHECK_THAT(other.error().message(), Catch::Contains("/opt/no-such-tool"));
  // The interpreter the code task needs is there.
  CHECK(fs::exists(reward::kPython));
}

TEST_CASE("code task: problems are reproducible by seed, short, and their tests follow the reference",
          "[rl][sandbox][task]") {
  auto task = tasks::CodeTask::make({}, 11).value();
  auto again = tasks::CodeTask::make({}, 11).value();
  std::set<std::string> references;
  size_t with_parentheses = 0;
  for (int i = 0; i < 1000; ++i) {
    auto p = task.next();
    auto q = again.next();
    REQUIRE(p.prompt == q.prompt);
    REQUIRE(p.reference == q.reference);
    REQUIRE(p.tests == q.tests);
    CHECK(p.prompt.back() == ':');
    CHECK(p.prompt.size() + p.reference.size() <= 38);  // + BOS + EOS: 40 tokens
    CHECK(p.tests.size() == 5);
    std::set<int64_t> xs;
    for (auto [x, y] : p.tests) xs.insert(x);
    CHECK(xs.size() == 5);
    references.insert(p.reference);
    with_parentheses += p.reference.find('(') != std::string::npos ? 1 : 0;
  }
  CHECK(references.size() > 200);
  CHECK(with_parentheses > 150);  // enough problems where the teacher can be wrong
  CHECK(tasks::CodeTask::make({}, 12).value().take(3)[2].prompt != tasks::CodeTask::make({}, 11).value().take(3)[2].prompt);

  // "add 3 then times 2" at x: (x+3)*2.
  auto three = tasks::CodeTask::make({.min_steps = 3, .max_steps = 3}, 5).value().take(50);
  for (const auto& p : three) CHECK(p.prompt.find(" then ") != p.prompt.rfind(" then "));
  CHECK_THAT(tasks::CodeTask::make({.min_steps = 0}, 1).error().message(), Catch::Contains("min_steps"));
  CHECK_THAT(tasks::CodeTask::make({.tests = 30, .test_range = 10}, 1).error().message(), Catch::Contains("tests"));
  CHECK_FALSE(tasks::CodeTask::make({.max_steps = 4}, 1));
}

TEST_CASE("code task: the weak teacher drops parentheses at its rate", "[rl][sandbox][task]") {
  std::mt19937_64 rng(3);
  tasks::CodeProblem p{"add 3 then times 2 then square:", "((x+3)*2)**2", {}};
  CHECK(tasks::CodeTask::weak_teacher_answer(p, 0.0, rng) == "((x+3)*2)**2");
  CHECK(tasks::CodeTask::weak_teacher_answer(p, 1.0, rng) == "x+3*2**2");
  std::map<std::string, int> seen;
  for (int i = 0; i < 4000; ++i) seen[tasks::CodeTask::weak_teacher_answer(p, 0.5, rng)] += 1;
  CHECK(seen.size() == 4);
  CHECK(seen["((x+3)*2)**2"] == Approx(1000).margin(120));
  CHECK(seen["x+3*2**2"] == Approx(1000).margin(120));
  CHECK(tasks::CodeTask::weak_teacher_answer({"add 3:", "x+3", {}}, 1.0, rng) == "x+3");
}

TEST_CASE("code task: the reference scores 1, dropped parentheses and garbage score less", "[rl][sandbox][task]") {
  require_sandbox();
  tasks::CodeProblem p{"add 3 then times 2:", "(x+3)*2", {{-4, -2}, {0, 6}, {1, 8}, {5, 16}, {9, 24}}};
  CHECK(tasks::code_reward(p, "(x+3)*2").value() == 1.0);
  CHECK(tasks::code_reward(p, "2*x+6").value() == 1.0);  // any right expression
  // x+3*2 = x+6: right only at x = 0.
  CHECK(tasks::code_reward(p, "x+3*2").value() == Approx(0.2));
  for (const char* garbage : {"", "x+", "(x+3", "print(x)", "x; 1", "__import__('os').system('true')", "'a'",
                              "x/1", "1 / 0", "x**10**10", "\xff\xfe", "x\n)"}) {
    INFO(garbage);
    CHECK(tasks::code_reward(p, garbage).value() == 0.0);
  }
  // Without builtins, yet reaching sys through a class: what it prints
  // spoils the harness's line, even with the right values.
  const std::string printing =
      "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'BuiltinImporter'][0]"
      ".load_module('sys').stdout.write('x\\n') and (x+3)*2";
  CHECK(tasks::code_reward(p, printing).value() == 0.0);
  CHECK(tasks::code_reward(p, "(x+3)*2 if x else [c for c in ().__class__.__base__.__subclasses__()][0]").value() ==
        Approx(0.8));
}

TEST_CASE("code task: scoring many completions in parallel equals scoring them one by one", "[rl][sandbox][task]") {
  require_sandbox();
  auto problems = tasks::CodeTask::make({}, 21).value().take(12);
  std::mt19937_64 rng(4);
  std::vector<tasks::CodeProblem> batch;
  std::vector<std::string> completions;
  for (const auto& p : problems) {
    for (const std::string& c : {p.reference, tasks::CodeTask::weak_teacher_answer(p, 1.0, rng), std::string("x+")}) {
      batch.push_back(p);
      completions.push_back(c);
    }
  }
  auto open_fds = [] { return std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator()); };
  const auto fds_before = open_fds();
  auto parallel = tasks::code_rewards(batch, completions, tasks::code_limits(), 4);
  REQUIRE(parallel);
  CHECK(open_fds() == fds_before);  // nothing leaked by 36 sandboxes on 4 threads
  std::vector<double> serial;
  for (size_t i = 0; i < batch.size(); ++i) serial.push_back(tasks::code_reward(batch[i], completions[i]).value());
  CHECK(*parallel == serial);
  for (size_t i = 0; i < batch.size(); i += 3) {
    INFO(batch[i].reference << " / teacher: " << completions[i + 1]);
    CHECK(serial[i] == 1.0);
    CHECK(serial[i + 2] == 0.0);
    if (completions[i + 1] != completions[i] && serial[i + 1] == 1.0) {
      // Dropping the parentheses left the value alone (x**2**2 is (x**2)**2).
      CHECK(batch[i].reference.find("**2)**2") != std::string::npos);
    }
  }
  CHECK_FALSE(tasks::code_rewards(batch, std::span(completions).first(2), tasks::code_limits(), 4));
  CHECK_FALSE(tasks::code_rewards(batch, completions, tasks::code_limits(), 0));
}

TEST_CASE("code task: a completion repeated on the same tests runs once and every repeat takes its reward",
          "[rl][sandbox][task]") {
  require_sandbox();
  auto problems = tasks::CodeTask::make({}, 5).value().take(2);
  REQUIRE(problems[0].tests != problems[1].tests);
  // A group of 8 samples of problem 0 that mostly agree, and 3 of problem 1
  // (its "x" is not problem 0's: other tests).
  std::vector<tasks::CodeProblem> batch;
  std::vector<std::string> completions;
  auto add = [&](const tasks::CodeProblem& p, const std::string& c) {
    batch.push_back(p);
    completions.push_back(c);
  };
  for (int i = 0; i < 5; ++i) add(problems[0], problems[0].reference);
  add(problems[0], "x+");
  add(problems[0], "x");
  add(problems[0], "x+");
  add(problems[1], problems[1].reference);
  add(problems[1], "x");
  add(problems[1], problems[1].reference);
  size_t runs = 0;
  auto rewards = tasks::code_rewards(batch, completions, tasks::code_limits(), 2, &runs);
  REQUIRE(rewards);
  CHECK(runs == 5);  // (0, reference), (0, "x+"), (0, "x"), (1, reference), (1, "x")
  for (size_t i = 0; i < batch.size(); ++i) {
    INFO(i << ": " << completions[i]);
    CHECK((*rewards)[i] == tasks::code_reward(batch[i], completions[i]).value());
  }
  CHECK((*rewards)[0] == 1.0);
  CHECK((*rewards)[5] == 0.0);
  CHECK((*rewards)[8] == 1.0);
}

TEST_CASE("sandbox made by a user who is not root: a user namespace of its own, no capabilities, no network, "
          "and the user's own files read-only",
          "[rl][sandbox]") {
  require_sandbox();
  // A directory the user may write on the host: the sandbox may not.
  // A directory the user may write on the host, its home (with a secret
  // only the user may read): the sandbox may neither write nor read there.
  const std::string owned = "/opt/troupe-sandbox-owned-" + std::to_string(getpid());
  fs::create_directories(owned);
  REQUIRE(chown(owned.c_str(), kNobody, kNobody) == 0);
  const std::string home = owned + "/home";
  fs::create_directories(home);
  std::ofstream(home + "/secret") << "key";
  REQUIRE(chown(home.c_str(), kNobody, kNobody) == 0);
  REQUIRE(chown((home + "/secret").c_str(), kNobody, kNobody) == 0);
  REQUIRE(chmod((home + "/secret").c_str(), 0600) == 0);
  const std::string script =
      "import os, socket, sys\n"
      "try:\n"
      "    print('read', open('" + home + "/secret').read())\n"
      "except OSError as e:\n"
      "    print('hidden', e.errno)\n"
      "print(os.getcwd(), open('main.py').read()[:6], sys.stdin.read(), sep='|')\n"
      "print([l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm'))])\n"
      "print([name for _, name in socket.if_nameindex()])\n"
      "try:\n"
      "    socket.create_connection(('127.0.0.1', 9), timeout=2)\n"
      "    print('connected')\n"
      "except OSError as e:\n"
      "    print('net', e.errno)\n"
      "for path in ['" + owned + "/x', '/etc/x', '/tmp/x', '/var/tmp/x']:\n"
      "    try:\n"
      "        open(path, 'w').write('x')\n"
      "        print('wrote', path)\n"
      "    except OSError as e:\n"
      "        print('refused', e.errno)\n"
      "open('inside.txt', 'w').write('ok')\n"
      "open('/dev/null', 'w').write('gone')\n"
      "print(open('inside.txt').read(), len(open('/dev/urandom', 'rb').read(4)), os.getuid())\n"
      "print(os.readlink('/proc/self/ns/pid'))\n";
  const char* home_before = std::getenv("HOME");
  const std::string home_was = home_before != nullptr ? home_before : "";
  setenv("HOME", home.c_str(), 1);  // the user's HOME, as the sandbox's caller sees it
  auto r = run_python_as_nobody(script);
  home_was.empty() ? unsetenv("HOME") : setenv("HOME", home_was.c_str(), 1);
  INFO(r.out << r.err);
  REQUIRE(r.succeeded());
  CHECK(r.user_namespace);
  CHECK(r.out.rfind("hidden " + std::to_string(ENOENT) + "\n/tmp/work|import|from stdin\n", 0) == 0);
  CHECK(r.out.find("['0000000000000000', '0000000000000000']") != std::string::npos);
  CHECK(r.out.find("['lo']") != std::string::npos);
  CHECK(r.out.find("net " + std::to_string(ENETUNREACH)) != std::string::npos);
  CHECK(r.out.find("wrote") == std::string::npos);
  CHECK(r.out.find("connected") == std::string::npos);
  CHECK(r.out.find("ok 4 " + std::to_string(r.uid) + "\n") != std::string::npos);
  CHECK(r.uid >= 2'000'000'000u);
  CHECK(fs::exists(home + "/secret"));
  CHECK_FALSE(fs::exists(owned + "/x"));
  fs::remove_all(owned);
  // Nothing of it is left.
  const size_t at = r.out.find("pid:[");
  REQUIRE(at != std::string::npos);
  CHECK(processes_in_namespace("pid", r.out.substr(at, r.out.find('\n', at) - at)) == 0);
}

TEST_CASE("sandbox made by a user who is not root: fork and memory bombs and endless programs end within the "
          "limits",
          "[rl][sandbox]") {
  require_sandbox();
  SandboxLimits limits;
  limits.max_processes = 4;
  limits.timeout_s = 5;
  // The program gets max_processes - 1 children: the count is the sandbox's
  // user namespace's, not every process of the user's.
  auto bounded = run_python_as_nobody(
      kBoundedForks,
      limits);
  INFO(bounded.out << bounded.err);
  CHECK(bounded.out == "3\n");
  CHECK(bounded.succeeded());
  limits.timeout_s = 1;
  auto bomb = run_python_as_nobody("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
                                   limits);
  CHECK(bomb.timed_out);
  CHECK(bomb.term_signal == SIGKILL);
  CHECK(bomb.wall_seconds < 2.0);
  limits.timeout_s = 5;
  limits.memory_bytes = 64ull << 20;
  auto big = run_python_as_nobody("x = bytearray(1 << 30)\n", limits);
  CHECK(big.exit_code == 1);
  CHECK(big.err.find("MemoryError") != std::string::npos);
  limits.timeout_s = 1;
  auto endless = run_python_as_nobody("while True:\n    pass\n", limits);
  CHECK(endless.timed_out);
  CHECK(endless.term_signal == SIGKILL);
}

TEST_CASE("sandbox made by a user who is not root: without a cgroup it may manage, the run goes on under its "
          "rlimits, or is refused when the cgroup is required",
          "[rl][sandbox]") {
  require_sandbox();
  SandboxLimits limits;
  auto r = run_python_as_nobody("print('hi')\n", limits);
  INFO(r.out << r.err);
  CHECK(r.succeeded());
  CHECK_FALSE(r.memory_cgroup);
  limits.require_memory_cgroup = true;
  auto refused = run_as_nobody({.argv = reward::python_argv("main.py"), .files = {{"main.py", ""}}, .stdin_data = {}},
                               limits);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == troupe::ErrorCode::unsupported);
  CHECK_THAT(refused.error().message(), Catch::Contains("memory cgroup") && Catch::Contains("require_memory_cgroup"));
}

TEST_CASE("sandbox: the system-call filter refuses unix sockets on the host's paths and new namespaces, root or not",
          "[rl][sandbox]") {
  require_sandbox();
  // A service's socket where the sandbox can see it (outside the hidden
  // directories), open to everyone: without the filter, one connect away.
  const std::string dir = "/opt/troupe-sandbox-sock-" + std::to_string(getpid());
  fs::create_directories(dir);
  const std::string path = dir + "/service.sock";
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(chmod(path.c_str(), 0777) == 0);
  REQUIRE(listen(listener, 4) == 0);
  // And a datagram service's: a datagram socketpair end could sendto() it.
  const std::string dgram_path = dir + "/dgram.sock";
  const int dgram = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  REQUIRE(dgram >= 0);
  sockaddr_un dgram_addr{};
  dgram_addr.sun_family = AF_UNIX;
  std::snprintf(dgram_addr.sun_path, sizeof dgram_addr.sun_path, "%s", dgram_path.c_str());
  REQUIRE(bind(dgram, reinterpret_cast<sockaddr*>(&dgram_addr), sizeof dgram_addr) == 0);
  REQUIRE(chmod(dgram_path.c_str(), 0777) == 0);
  const std::string script =
      "import socket\n"
      "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('Seccomp:')])\n"
      "try:\n"
      "    s = socket.socket(socket.AF_UNIX)\n"
      "    s.connect('" + path + "')\n"
      "    print('connected')\n"
      "except OSError as e:\n"
      "    print('unix', e.errno)\n"
      "try:\n"
      "    c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
      "    c.sendto(b'x', '" + dgram_path + "')\n"
      "    print('sent')\n"
      "except OSError as e:\n"
      "    print('dgram', e.errno)\n"
      "a, b = socket.socketpair()\n"
      "a.send(b'pair')\n"
      "print(b.recv(4).decode())\n";
  for (bool as_root : {true, false}) {
    INFO((as_root ? "made by root" : "made by nobody"));
    SandboxRun run{.argv = reward::python_argv("main.py"), .files = {{"main.py", script}}, .stdin_data = {}};
    auto r = as_root ? reward::run_sandboxed(run, {}) : run_as_nobody(run, {});
    REQUIRE(r);
    INFO(r->out << r->err);
    CHECK(r->succeeded());
    CHECK(r->out == "['2']\nunix " + std::to_string(EACCES) + "\ndgram " + std::to_string(EACCES) + "\npair\n");
    // A user namespace, which would give the program every capability over
    // fresh namespaces of its own, is refused.
    auto nested = as_root ? reward::run_sandboxed({.argv = {"/usr/bin/unshare", "-U", "-r", "/bin/true"},
                                                    .files = {},
                                                    .stdin_data = {}},
                                                   {})
                          : run_as_nobody({.argv = {"/usr/bin/unshare", "-U", "-r", "/bin/true"},
                                           .files = {},
                                           .stdin_data = {}},
                                          {});
    REQUIRE(nested);
    INFO(nested->err);
    CHECK(nested->exit_code != 0);
    CHECK_THAT(nested->err, Catch::Contains("Operation not permitted"));
  }
  CHECK(accept(listener, nullptr, nullptr) < 0);
  CHECK(errno == EAGAIN);
  char byte;
  CHECK(recv(dgram, &byte, 1, 0) < 0);
  CHECK(errno == EAGAIN);
  close(listener);
  close(dgram);
  fs::remove_all(dir);
}

TEST_CASE("sandbox: every branch of the system-call filter answers as it should, root or not", "[rl][sandbox]") {
  require_sandbox();
  std::ifstream in(TROUPE_SYSCALL_PROBE, std::ios::binary);
  const std::string probe((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE_FALSE(probe.empty());
  auto run_probe = [&](bool as_root, const std::string& arg) {
    SandboxRun run{.argv = {"/bin/sh", "-c", "chmod +x probe && exec ./probe " + arg},
                   .files = {{"probe", probe}},
                   .stdin_data = {}};
    SandboxLimits limits;
    limits.dir_bytes = 16ull << 20;
    auto r = as_root ? reward::run_sandboxed(run, limits) : run_as_nobody(run, limits);
    REQUIRE(r);
    return *r;
  };
  auto errno_line = [](const char* name, int err) { return std::string(name) + " " + std::to_string(err) + "\n"; };
  for (bool as_root : {true, false}) {
    INFO((as_root ? "made by root" : "made by nobody"));
    auto r = run_probe(as_root, "");
    INFO(r.out << r.err);
    REQUIRE(r.succeeded());
    CHECK(r.out == errno_line("clone_newuser", EPERM) + errno_line("clone_newnet", EPERM) +
                       errno_line("clone3", ENOSYS) + errno_line("unshare", EPERM) + errno_line("ptrace", EPERM) +
                       errno_line("unix_socket", EACCES) + errno_line("dgram_pair", EACCES) +
                       "stream_pair ok\ninet_socket ok\nfork ok\n");
    // A call through another ABI's table is not answered: the process dies.
    auto x32 = run_probe(as_root, "x32");
    INFO(x32.out << x32.err);
    CHECK(x32.term_signal == SIGSYS);
    CHECK(x32.out.find("survived") == std::string::npos);
  }
}
