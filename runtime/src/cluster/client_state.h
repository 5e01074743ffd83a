// Internal: what a ClusterClient shares between its copies (and with the
// supervisor children it runs on the cluster, cluster/remote_child.cc).
#pragma once

#include <mutex>
#include <string>
#include <thread>

#include "cluster/protocol.h"
#include "troupe/cluster.h"

namespace troupe {

struct ClusterClient::State {
  Runtime* rt;
  std::string address;
  std::mutex mu;
  AnyRef head;  // under mu; replaced when the head comes back
  AnyRef owner;
  cluster::Location owner_at;  // empty address: the driver does not listen
  std::string executable;
  AnyRef resolver;  // finds the next incarnation for refs that follow actors
  bool refreshing = false;  // under mu
  std::thread refresher;    // looks for the head again (resolving blocks)

  ~State() {
    if (refresher.joinable()) refresher.join();
  }
  AnyRef current_head() {
    std::lock_guard<std::mutex> lock(mu);
    return head;
  }
  /// Finds the head at its address again, in the background, once at a time.
  void refresh_head();
};

/// A spawn request for the head from this driver (its program, its owner).
cluster::SpawnActor spawn_request(const ClusterClient::State& state, const std::string& class_key, std::string args,
                                  const ActorOptions& options);

}  // namespace troupe
