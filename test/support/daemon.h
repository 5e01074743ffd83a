// `troupe start ... --block` as a child process of a test or benchmark: the
// address comes back on the readiness pipe the command line writes to
// (TROUPE_READY_FD); the child dies with its parent (PR_SET_PDEATHSIG), so a
// crashed test leaves no cluster behind.
#pragma once

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace troupe::test {

/// The `troupe` command line that tests and benchmarks start: $TROUPE_CLI
/// when set (a bundle carried to another machine, where this build's path
/// does not exist: scripts/gpu.sh), else the one this build made.
inline std::string troupe_cli() {
  const char* env = std::getenv("TROUPE_CLI");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(TROUPE_CLI);
}

class Daemon {
 public:
  /// Starts `cli args... --block` with TROUPE_HOME=`home` and the cluster
  /// token `token`; ok() says whether it answered within 20 s.
  /// `prefix` runs before it (e.g. {"ip", "netns", "exec", "ns1"}).
  Daemon(const std::string& cli, const std::filesystem::path& home, const std::string& token,
         std::vector<std::string> args, std::vector<std::string> prefix = {}) {
    int ready[2];
    if (pipe(ready) != 0) return;
    pid_ = fork();
    if (pid_ < 0) return;
    if (pid_ == 0) {
      close(ready[0]);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      setenv("TROUPE_HOME", home.c_str(), 1);
      setenv("TROUPE_CLUSTER_TOKEN", token.c_str(), 1);
      setenv("TROUPE_READY_FD", std::to_string(ready[1]).c_str(), 1);
      setenv("TROUPE_LOG_LEVEL", "warn", 1);
      args.insert(args.begin(), cli);
      args.push_back("--block");
      args.insert(args.begin(), prefix.begin(), prefix.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      _exit(127);
    }
    close(ready[1]);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    pollfd p{ready[0], POLLIN, 0};
    while (std::chrono::steady_clock::now() < deadline) {
      if (poll(&p, 1, 100) <= 0) continue;
      char c;
      if (read(ready[0], &c, 1) != 1 || c == '\n') break;
      said_ += c;
    }
    close(ready[0]);
    if (said_.rfind("ok ", 0) == 0) address_ = said_.substr(3);
  }
  ~Daemon() { stop(); }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  bool ok() const { return !address_.empty(); }
  /// What it said on the readiness pipe ("ok ADDRESS" or "error WHY").
  const std::string& said() const { return said_; }
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  void signal(int sig) { ::kill(pid_, sig); }
  void kill9() {
    ::kill(pid_, SIGKILL);
    reap();
  }
  /// SIGTERM (after SIGCONT, in case it was stopped) and wait.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGTERM);
    reap();
  }

 private:
  void reap() {
    int status = 0;
    if (pid_ > 0) waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  pid_t pid_ = -1;
  std::string said_;
  std::string address_;
};

/// Runs `command` through the shell: its exit code and its output (stdout
/// and stderr together).
inline std::pair<int, std::string> run_command(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) out += buf;
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace troupe::test
