// The peer program (test/transports/peer_main.cc) as a child process, for
// tests where a process has to be killed.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>

#include <catch2/catch.hpp>

namespace troupe::test {

using namespace std::chrono_literals;

/// The peer program as a child process, with its address read from stdout.
class PeerProcess {
 public:
  explicit PeerProcess(const std::string& token = "test-token", const std::string& scheme = "tcp") {
    int in[2], out[2];
    // Close-on-exec, so that no other child keeps the peer's stdin open.
    REQUIRE(pipe2(in, O_CLOEXEC) == 0);
    REQUIRE(pipe2(out, O_CLOEXEC) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      execl(TROUPE_TEST_PEER, TROUPE_TEST_PEER, token.c_str(), scheme.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
    address_ = read_line(10s);
    REQUIRE_FALSE(address_.empty());
  }
  ~PeerProcess() {
    if (stdin_ >= 0) close(stdin_);
    if (stdout_ >= 0) close(stdout_);
    if (pid_ > 0) {
      // Closing stdin lets it exit; a test that already killed it reaps here.
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  void kill9() {
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  std::string read_line(std::chrono::milliseconds timeout) {
    std::string line;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{stdout_, POLLIN, 0};
      int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
      if (poll(&p, 1, std::max(left, 1)) <= 0) continue;
      char c;
      if (read(stdout_, &c, 1) != 1) break;
      if (c == '\n') return line;
      line += c;
    }
    return {};
  }
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  std::string address_;
};

}  // namespace troupe::test
