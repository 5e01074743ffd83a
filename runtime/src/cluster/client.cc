// ClusterClient: a driver's asks to the head.
#include "cluster/protocol.h"
#include "troupe/cluster.h"

namespace troupe {

using namespace cluster;

Result<ClusterClient> ClusterClient::connect(Runtime& rt, const std::string& head_address,
                                             std::chrono::milliseconds timeout) {
  std::string address = head_address;
  if (address.find("://") == std::string::npos) address = "tcp://" + address;
  auto head = rt.resolve_any(address + "/" + kHeadName, timeout);
  if (!head) {
    return error(head.error().code(), "cluster: no head answers at " + address + " (" + head.error().message() +
                                          "); start one with `troupe start --head`, or check the address");
  }
  return ClusterClient(*head, address);
}

Result<ClusterStatus> ClusterClient::status(std::chrono::milliseconds timeout) const {
  return head_.ask<ClusterStatus>(GetClusterStatus{}, timeout).get();
}

Future<std::string> ClusterClient::create_placement_group_async(const PlacementGroupSpec& spec,
                                                                 std::chrono::milliseconds timeout) const {
  return head_.ask<std::string>(CreatePlacementGroup{spec}, timeout);
}

Future<PlacementGroupInfo> ClusterClient::wait_placement_group_async(const std::string& id,
                                                                     std::chrono::milliseconds timeout) const {
  // The head answers by the deadline; the ask waits a little longer so that
  // its answer (with the reason) arrives rather than a bare timeout.
  return head_.ask<PlacementGroupInfo>(WaitPlacementGroup{id, timeout.count()}, timeout + std::chrono::seconds(2));
}

Future<void> ClusterClient::remove_placement_group_async(const std::string& id,
                                                         std::chrono::milliseconds timeout) const {
  return head_.ask<void>(RemovePlacementGroup{id}, timeout);
}

Result<std::string> ClusterClient::create_placement_group(const PlacementGroupSpec& spec,
                                                          std::chrono::milliseconds timeout) const {
  return create_placement_group_async(spec, timeout).get();
}

Result<PlacementGroupInfo> ClusterClient::wait_placement_group(const std::string& id,
                                                               std::chrono::milliseconds timeout) const {
  return wait_placement_group_async(id, timeout).get();
}

Status ClusterClient::remove_placement_group(const std::string& id, std::chrono::milliseconds timeout) const {
  auto r = remove_placement_group_async(id, timeout).get();
  return r ? Status() : r.error();
}

}  // namespace troupe

namespace troupe {

using namespace cluster;

Result<std::string> ClusterClient::submit_job(const std::vector<std::string>& command, const std::string& node,
                                              const std::vector<std::string>& env,
                                              std::chrono::milliseconds timeout) const {
  return head_.ask<std::string>(SubmitJob{command, node, env}, timeout).get();
}

Result<JobInfo> ClusterClient::job(const std::string& id, std::chrono::milliseconds timeout) const {
  return head_.ask<JobInfo>(GetJob{id}, timeout).get();
}

Result<std::string> ClusterClient::job_logs(const std::string& id, uint64_t offset, uint64_t max_bytes,
                                            std::chrono::milliseconds timeout) const {
  return head_.ask<std::string>(ReadJobLog{id, offset, max_bytes}, timeout).get();
}

Status ClusterClient::stop_job(const std::string& id, std::chrono::milliseconds timeout) const {
  auto r = head_.ask<void>(StopJob{id}, timeout).get();
  return r ? Status() : r.error();
}

}  // namespace troupe
