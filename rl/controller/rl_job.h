// The RL job's single controller (the driver): it owns the trainer, rollout
// and reward meshes and runs the loop (docs/rl.md has the diagram):
//
//   rollout engines --samples--> reward workers --scored groups--> replay buffer
//         ^                                                             |
//         +---- weight sync (one-sided reads of rank 0's copy) <--- trainer mesh
//
// Feeder threads hand prompt groups to the engines (the least loaded, each
// holding several groups: continuous batching), get them scored, and put
// them in the replay buffer; the driver's thread takes a step's groups,
// makes advantages, splits the sequences across the trainer ranks (which
// average their gradients with the mesh's allreduce), publishes the new
// weights and syncs every engine. The group queue's gate makes the same
// loop on-policy (max_staleness 0) or asynchronous.
//
// Faults: a group whose engine or reward worker is lost is requeued (it is
// trained on once: groups are keyed by index); the engine restarts (the
// meshes' processes restart without limit) and is synced again before it
// generates. A trainer rank lost during a step: once it is back, every
// rank takes a survivor's state (one-sided reads of its weights and
// optimizer), the ranks make a new collective group, and the step is redone
// (or kept, when a survivor had applied it). Every fault is a line of the
// metrics with what it cost.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <troupe/cluster.h>
#include <troupe/runtime.h>

#include "config/rl_config.h"
#include "troupe/status.h"

namespace troupe::rl::controller {

/// What a test may look at between steps (JobOptions::after_step).
class JobProbe {
 public:
  virtual ~JobProbe() = default;
  /// The process ids of the trainer ranks and of the rollout engines, in
  /// rank order (asks to the meshes: they wait for restarting members).
  virtual std::vector<int64_t> trainer_pids() const = 0;
  virtual std::vector<int64_t> engine_pids() const = 0;
  /// Each trainer rank's parameter checksum (equal when the replicas agree).
  virtual std::vector<uint64_t> trainer_checksums() const = 0;
  /// Each engine's checksum of the weights it generates with (after a
  /// step's sync: equal to the trainer ranks').
  virtual std::vector<uint64_t> engine_checksums() const = 0;
  /// The optimizer moments (floats per moment) each trainer rank holds:
  /// the whole model's, or its segment's under ZeRO-1.
  virtual std::vector<uint64_t> trainer_optimizer_floats() const = 0;
};

/// How to run a job.
struct JobOptions {
  /// Where the metrics, checkpoints and report go (created if missing).
  std::string run_dir;
  /// Continue from the run directory's latest checkpoint.
  bool resume = false;
  /// Each progress line (default: standard error).
  std::function<void(const std::string&)> progress;
  /// Called in the driver's thread after each step with its number (tests
  /// use it to inject faults); never in normal runs.
  std::function<void(size_t step, const JobProbe& probe)> after_step;
};

/// What a job did.
struct JobResult {
  /// Steps trained in this run (after a resume: since it).
  size_t steps = 0;
  /// Held-out accuracy of each evaluation, (step, accuracy), in order.
  std::vector<std::pair<size_t, double>> evals;
  double wall_seconds = 0;
  /// Faults survived (lost engines, reward workers, trainer ranks).
  size_t faults = 0;
  std::string metrics_path;
};

/// Runs the job of `config_text` (TOML, rl_config.h) on `cluster` from the
/// driver's `runtime`. Errors: a bad config (the key named), a run
/// directory that cannot be written, meshes that cannot start (the
/// cluster's reason), a fault it cannot recover from (what failed, and
/// which checkpoint to resume from).
Result<JobResult> run_rl_job(Runtime& runtime, const ClusterClient& cluster, const std::string& config_text,
                             const JobOptions& options);

}  // namespace troupe::rl::controller
