// Starting a program on a cluster in one line, like ray.init():
//
//   int main() {
//     auto session = troupe::init().value();   // a worker process never gets past this line
//     auto counter = session->cluster().spawn<Counter>({.max_restarts = -1}, 0).value();
//     ...
//   }                                          // the embedded cluster (if any) stops here
//
// With no address (and TROUPE_ADDRESS unset) it starts an embedded local
// cluster inside this process: a head (its state in a temporary directory)
// and one node agent offering this machine, which starts worker processes
// from this program. With an address it connects to that cluster's head.
// See docs/cluster.md.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "troupe/cluster.h"
#include "troupe/placement.h"
#include "troupe/runtime.h"
#include "troupe/status.h"

namespace troupe {

struct InitOptions {
  /// The head to join ("tcp://host:port", "host:port"); empty: the
  /// TROUPE_ADDRESS environment variable, else an embedded local cluster.
  std::string address{};
  /// The embedded cluster's node: what it offers on top of what the machine
  /// has (CPU, memory, GPUs), and its labels.
  ResourceMap resources{};
  Labels labels{};
  /// The driver's runtime (it listens on 127.0.0.1, any port, unless told
  /// otherwise: the cluster watches it to stop the actors it owns). An
  /// embedded cluster speaks its `transport` ("tcp" or "ucx").
  RuntimeConfig runtime{};
  /// The log level of the embedded cluster (and of its workers) when
  /// TROUPE_LOG_LEVEL does not say.
  std::string cluster_log_level = "warn";
  /// How long to wait for the head (and the embedded cluster to start).
  std::chrono::milliseconds timeout{10'000};
};

/// A driver's session: its runtime and its cluster client, and the embedded
/// cluster when there is one. Destroying it stops the driver's runtime (its
/// owned actors with it), then the embedded cluster.
class Session {
 public:
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Runtime& runtime();
  const ClusterClient& cluster() const;
  /// The head's address (the embedded one's, or the one joined).
  const std::string& address() const;
  /// True when this session started the cluster itself.
  bool embedded() const;

  struct Impl;
  /// Internal.
  explicit Session(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

/// Starts a worker if this process is one (see worker.h), else joins the
/// cluster at `options.address` or starts an embedded one. Errors: the head
/// does not answer, the embedded cluster cannot start (say why).
Result<std::unique_ptr<Session>> init(InitOptions options = {});

}  // namespace troupe
