// A second driver process for the owner tests: the test binary started with
// TROUPE_TEST_DRIVER_HEAD set connects to that head, spawns an owned and a
// detached actor (named "owned" and "detached" in namespace "owners"), says
// "ready" on stdout, and waits to be killed.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "troupe/cluster.h"
#include "troupe/troupe.h"

namespace troupe::test {

/// Answers with the pid of the process it runs in.
struct WhichProcess {
  TROUPE_MESSAGE_NAMED(WhichProcess, "test.WhichProcess");
};
class Probe : public Actor<Probe, WhichProcess> {
 public:
  int64_t handle(const WhichProcess&) { return getpid(); }
};

inline void run_test_driver_if_asked() {
  const char* head = std::getenv("TROUPE_TEST_DRIVER_HEAD");
  if (head == nullptr) return;
  RuntimeConfig cfg;
  cfg.listen = "tcp://127.0.0.1:0";  // owned actors need a driver the head can watch
  cfg.log_level = "error";
  Runtime rt(cfg);
  auto cluster = ClusterClient::connect(rt, head);
  if (!cluster) {
    std::printf("error %s\n", cluster.error().message().c_str());
    std::exit(1);
  }
  ActorOptions owned{.name = "owned", .ns = "owners"};
  ActorOptions detached{.name = "detached", .ns = "owners", .detached = true};
  auto a = cluster->spawn<Probe>(owned);
  auto b = cluster->spawn<Probe>(detached);
  if (!a || !b) {
    std::printf("error %s\n", (!a ? a.error() : b.error()).message().c_str());
    std::exit(1);
  }
  std::printf("ready\n");
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  std::exit(0);
}

}  // namespace troupe::test
