// The runtime behind troupe::Runtime: owns the CAF actor system, creates
// cells, keeps unsupervised actors alive until they stop, and shuts down in
// order.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>

#include "scheduler.h"
#include "troupe/runtime.h"

namespace troupe::detail {

class Cell;
class Node;

class RuntimeImpl {
 public:
  explicit RuntimeImpl(RuntimeConfig config);
  ~RuntimeImpl();

  const RuntimeConfig& config() const { return config_; }
  bool shutting_down() const { return shutting_down_.load(std::memory_order_acquire); }

  /// Creates a cell. With a parent it is a supervised child whose first start
  /// is answered to the parent with `start_seq`; without, it is kept alive by
  /// the runtime until it stops. `start_reply` (optional) is completed by the
  /// first start. Empty when the runtime is shutting down.
  CellPtr spawn(SpawnSpec spec, Cell* parent, uint64_t start_seq, ReplyRef start_reply);

  /// Called by a cell as it terminates.
  void on_cell_exit(Cell* cell);
  /// Logs a crash report and passes it to the configured hook.
  void report_crash(const CrashReport& report);

  /// A proxy cell for actor `id` on the node at `address`.
  CellPtr spawn_proxy(std::shared_ptr<Node> node, const std::string& address, uint64_t id);
  /// The network node (created on first use when the runtime does not listen).
  Result<std::shared_ptr<Node>> node();
  std::string address() const;

  Result<SupervisorRef> start_supervisor(std::string name, SupervisorSpec spec, std::chrono::milliseconds timeout);
  Future<ExitReason> monitor(const AnyRef& actor, std::chrono::milliseconds timeout);
  size_t live() const { return static_cast<size_t>(live_.load(std::memory_order_acquire)); }
  Status shutdown();
  /// What idle scheduler threads poll (the node attaches its transport).
  NetworkPoller& net_poller() { return net_poller_; }

 private:
  /// Waits until `pred` holds (under mu_) or the deadline; false on timeout.
  template <class Pred>
  bool wait_until(std::chrono::steady_clock::time_point deadline, Pred pred);

  RuntimeConfig config_;
  NetworkPoller net_poller_;  // outlives the scheduler that uses it
  std::unique_ptr<caf::actor_system_config> caf_config_;
  std::unique_ptr<caf::actor_system> system_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> shutting_down_{false};
  std::atomic<int64_t> live_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  /// Unsupervised cells by id: the runtime is what keeps them alive.
  std::unordered_map<uint64_t, CellPtr> top_;
  /// Root supervisors in start order (ids into top_).
  std::vector<uint64_t> roots_;
  std::optional<Status> shutdown_status_;
  std::mutex node_mu_;
  std::shared_ptr<Node> node_;
  Status node_status_;  // why the node could not start, if it could not
  std::mutex shutdown_mu_;  // serialises shutdown() calls
};

/// Builds the spawn spec of a supervisor (its instances are SupervisorActors).
SpawnSpec supervisor_spawn_spec(std::string name, SupervisorSpec spec);
/// Checks a supervisor spec; the error names the offending field.
Status validate_spec(const SupervisorSpec& spec);

}  // namespace troupe::detail
