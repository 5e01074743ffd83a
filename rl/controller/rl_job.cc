#include "controller/rl_job.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <troupe/mesh.h>
#include <troupe/mesh_shape.h>
#include <troupe/placement.h>

#include "algo/advantages.h"
#include "controller/group_queue.h"
#include "controller/metrics_log.h"
#include "controller/replay_buffer.h"
#include "env/environment.h"
#include "io/atomic_write.h"
#include "model/generate.h"
#include "model/tokenizer.h"
#include "reward/reward_worker.h"
#include "rollout/rollout_engine.h"
#include "tasks/task.h"
#include "trainer/trainer_rank.h"

namespace troupe::rl::controller {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using rollout::RolloutEngine;
using trainer::TrainerRank;
using reward::RewardWorker;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// How asks of a member between incarnations fail.
bool between_incarnations(ErrorCode code) { return code == ErrorCode::peer_lost || code == ErrorCode::actor_dead; }

// Runs `ask` (an idempotent ask of a mesh member that may be between
// incarnations) and runs it again, paced, while it fails the way such a
// member's asks do (peer_lost, actor_dead; and `busy` too where given), for
// up to `timeout`. The restart notice can come before this process sees
// the old incarnation's connection close, and an ask sent in between fails
// with peer_lost: that is not the member's answer.
template <class F>
auto until_back(F ask, std::chrono::milliseconds timeout, std::optional<ErrorCode> busy = std::nullopt) {
  const auto deadline = Clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(20);
  for (;;) {
    auto r = ask();
    if (r) return r;
    const ErrorCode code = r.error().code();
    const bool transient = between_incarnations(code) || code == busy;
    if (!transient || Clock::now() + backoff >= deadline) return r;
    std::this_thread::sleep_for(backoff);  // retry pacing while the member restarts
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

// A failure of a mesh member, from the meshes' owner to the driver's thread.
struct FaultEvent {
  std::string mesh;
  MeshFailure failure;
};

// Thread-safe; `wake` is called after each push (to interrupt a wait).
class FaultInbox {
 public:
  void set_wake(std::function<void()> wake) {
    std::lock_guard lock(mu_);
    wake_ = std::move(wake);
  }
  void push(FaultEvent e) {
    std::function<void()> wake;
    {
      std::lock_guard lock(mu_);
      events_.push_back(std::move(e));
      wake = wake_;
    }
    if (wake) wake();
  }
  bool pending() const {
    std::lock_guard lock(mu_);
    return !events_.empty();
  }
  std::vector<FaultEvent> drain() {
    std::lock_guard lock(mu_);
    std::vector<FaultEvent> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
    events_.clear();
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::deque<FaultEvent> events_;
  std::function<void()> wake_;
};

// The owner of the job's meshes (Monarch's mesh supervision): it hands
// each member failure to the driver's thread.
class MeshWatch : public Actor<MeshWatch, MeshFailure> {
 public:
  MeshWatch(std::shared_ptr<FaultInbox> inbox, std::string mesh) : inbox_(std::move(inbox)), mesh_(std::move(mesh)) {}
  void handle(const MeshFailure& f) { inbox_->push({mesh_, f}); }

 private:
  std::shared_ptr<FaultInbox> inbox_;
  std::string mesh_;
};

struct Meshes {
  std::vector<std::string> placement_groups;
  std::vector<ProcMesh> procs;
  std::optional<ActorMesh<TrainerRank>> trainers;
  /// Rank 0's handle on the trainers' collective group (its id names it),
  /// released when a recovery makes a new one.
  std::optional<CollectiveGroup> trainer_group;
  std::optional<ActorMesh<RolloutEngine>> engines;
  std::optional<ActorMesh<RewardWorker>> rewards;
  std::vector<AnyRef> watchers;
};

Result<ProcMesh> make_procs(const ClusterClient& cluster, Meshes& m, const std::string& dim, size_t n, double cpus,
                            double gpus = 0) {
  PlacementGroupSpec spec;
  spec.strategy = PlacementStrategy::pack;
  Bundle bundle{{{"CPU", cpus}}};
  if (gpus > 0) bundle.resources["GPU"] = gpus;
  spec.bundles.assign(n, bundle);
  auto pg = cluster.create_placement_group(spec);
  if (!pg) return error(pg.error().code(), "rl job: cannot reserve " + std::to_string(n) + " x (" +
                                               fmt::format("{} CPU", cpus) +
                                               (gpus > 0 ? fmt::format(", {} GPU", gpus) : std::string()) +
                                               ") for the " + dim + ": " + pg.error().message());
  m.placement_groups.push_back(*pg);
  auto shape = Shape::make({{dim, n}});
  if (!shape) return error(shape.error());
  auto procs = ProcMesh::create(cluster, *shape, *pg);
  if (!procs) return error(procs.error().code(), "rl job: cannot start the " + dim + "' processes: " +
                                                     procs.error().message());
  m.procs.push_back(*procs);
  return *procs;
}

template <class A>
Status supervise(Runtime& rt, Meshes& m, const ActorMesh<A>& mesh, const std::shared_ptr<FaultInbox>& inbox,
                 const std::string& name) {
  auto watch = rt.spawn<MeshWatch>(inbox, name);
  m.watchers.push_back(watch);
  return mesh.supervise(m.watchers.back());
}

Result<Meshes> start_meshes(Runtime& rt, const ClusterClient& cluster, const config::RlConfig& c,
                            const std::string& text, const std::shared_ptr<FaultInbox>& inbox) {
  Meshes m;
  const ActorOptions restart{.max_restarts = -1};
  const double engine_gpus = c.rollout.device == config::Device::cuda ? c.rollout.gpus_per_engine : 0;
  double trainer_gpus = c.trainer.device == config::Device::cuda ? c.trainer.gpus_per_rank : 0;
  // Colocated, an engine shares its rank's process and so its GPUs.
  if (c.run.placement == config::Placement::colocated) trainer_gpus = std::max(trainer_gpus, engine_gpus);
  auto trainer_procs =
      make_procs(cluster, m, "ranks", c.trainer.ranks, static_cast<double>(c.trainer.threads), trainer_gpus);
  if (!trainer_procs) return error(trainer_procs.error());
  auto trainers = trainer_procs->spawn<TrainerRank>(restart, text);
  if (!trainers) return error(trainers.error().code(), "rl job: trainer mesh: " + trainers.error().message());
  m.trainers = *trainers;
  std::optional<ProcMesh> rollout_procs = trainer_procs.value();
  if (c.run.placement == config::Placement::disaggregated) {
    auto p = make_procs(cluster, m, "engines", c.rollout.engines, static_cast<double>(c.rollout.threads), engine_gpus);
    if (!p) return error(p.error());
    rollout_procs = *p;
  }
  auto engines = rollout_procs->spawn<RolloutEngine>(restart, text);
  if (!engines) return error(engines.error().code(), "rl job: rollout mesh: " + engines.error().message());
  m.engines = *engines;
  auto reward_procs = make_procs(cluster, m, "workers", c.reward.workers, 1.0);
  if (!reward_procs) return error(reward_procs.error());
  auto rewards = reward_procs->spawn<RewardWorker>(restart, text);
  if (!rewards) return error(rewards.error().code(), "rl job: reward mesh: " + rewards.error().message());
  m.rewards = *rewards;
  for (Status s : {supervise(rt, m, *m.trainers, inbox, "trainer"), supervise(rt, m, *m.engines, inbox, "rollout"),
                   supervise(rt, m, *m.rewards, inbox, "reward")}) {
    if (!s.ok()) return error(s);
  }
  if (c.trainer.ranks > 1) {
    auto groups = m.trainers->make_group();
    if (!groups) return error(groups.error());
    m.trainer_group = (*groups)[0];
    for (size_t r = 0; r < groups->size(); ++r) {
      auto joined = m.trainers->member(r).ask(trainer::JoinTrainerGroup{(*groups)[r]}).get();
      if (!joined) return error(joined.error());
    }
  }
  return m;
}

void stop_meshes(const ClusterClient& cluster, Meshes& m) {
  for (auto& p : m.procs) (void)p.stop();
  for (auto& pg : m.placement_groups) (void)cluster.remove_placement_group(pg);
}

// The loss denominators of a rank's share, by aggregation (see
// PolicyTrainer: a rank's gradient is scaled by its share).
double denominator(const std::vector<trainer::WireSequence>& seqs, model::LossAggregation agg) {
  if (seqs.empty()) return 0;
  switch (agg) {
    case model::LossAggregation::token_mean: {
      double tokens = 0;
      for (const auto& s : seqs) {
        tokens += s.mask.empty() ? static_cast<double>(s.completion.size())
                                 : static_cast<double>(std::count(s.mask.begin(), s.mask.end(), 1));
      }
      return tokens;
    }
    case model::LossAggregation::sequence_mean:
      return static_cast<double>(seqs.size());
    case model::LossAggregation::sequence_sum_over_positions: {
      size_t T = 0;
      for (const auto& s : seqs) T = std::max(T, s.prompt.size() + s.completion.size() - 1);
      return static_cast<double>(seqs.size() * T);
    }
  }
  return 0;
}

// One step's combined stats.
struct StepResult {
  double loss = 0, grad_norm = 0, learning_rate = 0, kl = 0, clip_fraction = 0, entropy = 0, value_loss = 0,
         explained_variance = 0;
  size_t sequences = 0, tokens = 0;
  double compute_s = 0, allreduce_s = 0;
  bool trained = false;
  // Optimizer steps taken (algorithm.epochs x mini_batches; 1 by default).
  size_t updates = 0;
};

// What each rank of a step did.
struct RankOutcomes {
  StepResult combined;  // over the ranks that succeeded
  std::vector<size_t> ok_ranks;
  std::vector<std::pair<size_t, Status>> failed;
  // With `snapshot`: each rank's snapshot after its update, by rank (all
  // of them, or none).
  std::vector<trainer::ShardSnapshot> snapshots;
};

// Splits `seqs` over the ranks (round robin) and takes one step on each;
// every rank gets a TrainStep, even an empty one (the allreduce needs it).
// `snapshot`: each rank snapshots its ZeRO-1 segment once updated.
RankOutcomes train_ranks(const ActorMesh<TrainerRank>& trainers, std::vector<trainer::WireSequence> seqs,
                         bool supervised, model::LossAggregation agg, uint64_t expected_steps, bool rl_phase,
                         bool snapshot, std::chrono::milliseconds timeout) {
  const size_t R = trainers.size();
  std::vector<std::vector<trainer::WireSequence>> shards(R);
  RankOutcomes o;
  StepResult& out = o.combined;
  out.sequences = seqs.size();
  for (size_t i = 0; i < seqs.size(); ++i) {
    out.tokens += seqs[i].completion.size();
    shards[i % R].push_back(std::move(seqs[i]));
  }
  std::vector<double> den(R);
  double total = 0;
  for (size_t r = 0; r < R; ++r) {
    total += den[r] = denominator(shards[r], supervised ? model::LossAggregation::token_mean : agg);
  }
  if (total == 0) return o;  // nothing to learn from: no step (an empty step would still decay the weights)
  std::vector<Future<trainer::RankStepStats>> futures;
  for (size_t r = 0; r < R; ++r) {
    futures.push_back(trainers.member(r).ask(
        trainer::TrainStep{supervised, std::move(shards[r]), den[r] / total, expected_steps, rl_phase, snapshot},
        timeout));
  }
  double ok_weight = 0;
  for (size_t r = 0; r < R; ++r) {
    auto st = futures[r].get();
    if (!st) {
      o.failed.emplace_back(r, st.error());
      continue;
    }
    o.ok_ranks.push_back(r);
    if (st->snapshot.size() == 1) o.snapshots.push_back(std::move(st->snapshot[0]));
    const double w = den[r] / total;
    ok_weight += w;
    out.loss += w * st->loss;
    out.kl += w * st->kl;
    out.clip_fraction += w * st->clip_fraction;
    out.entropy += w * st->entropy;
    out.value_loss += w * st->value_loss;
    out.explained_variance += w * st->explained_variance;
    out.grad_norm = st->grad_norm;
    out.learning_rate = st->learning_rate;
    out.compute_s = std::max(out.compute_s, st->compute_seconds);
    out.allreduce_s = std::max(out.allreduce_s, st->allreduce_seconds);
  }
  if (ok_weight > 0 && ok_weight < 1) {
    // Some ranks failed: the stats are those of the others, reweighted.
    for (double* v : {&out.loss, &out.kl, &out.clip_fraction, &out.entropy, &out.value_loss, &out.explained_variance}) {
      *v /= ok_weight;
    }
  }
  out.trained = !o.ok_ranks.empty();
  if (o.snapshots.size() != R) o.snapshots.clear();
  return o;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

/// The complete checkpoints (those with a manifest) under `run_dir`,
/// oldest first: their names (step-NNNNNN) sort by step.
std::vector<fs::path> complete_checkpoints(const std::string& run_dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(run_dir) / "checkpoints", ec)) {
    if (entry.path().filename().string().rfind("step-", 0) == 0 && fs::exists(entry.path() / "manifest.json")) {
      out.push_back(entry.path());
    }
  }
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  return out;
}

// Everything the job's threads share.
class Job {
 public:
  Job(Runtime& rt, const ClusterClient& cluster, config::RlConfig config, std::string text, JobOptions options)
      : rt_(rt),
        cluster_(cluster),
        c_(std::move(config)),
        text_(std::move(text)),
        options_(std::move(options)),
        timeout_(std::chrono::milliseconds(static_cast<int64_t>(c_.run.timeout_s * 1000))),
        inbox_(std::make_shared<FaultInbox>()) {}

  Result<JobResult> run();

  /// Logs a fault of a previous attempt of this run once the log is open.
  void note_fault(std::string what, std::string action) { noted_fault_ = {std::move(what), std::move(action)}; }
  /// True when run() failed because only the last checkpoint has a
  /// consistent state (a sharded optimizer lost a rank's segment).
  bool resume_from_checkpoint() const { return resume_from_checkpoint_; }
  /// Faults logged so far.
  size_t faults() const { return faults_; }

 private:
  /// ZeRO-1: the ranks hold segments of the optimizer state.
  bool sharded() const { return c_.trainer.shard_optimizer && c_.trainer.ranks > 1; }
  /// ZeRO-1 in memory: each rank snapshots its segment after every update
  /// and the next rank backs it up (trainer.shard_backup).
  bool shard_backup() const { return sharded() && c_.trainer.shard_backup; }
  void say(const std::string& line) {
    if (options_.progress) {
      options_.progress(line);
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }
  double now_s() const { return seconds_since(start_); }
  void log(json j) {
    j["wall_s"] = now_s();
    if (Status s = log_->append(j.dump()); !s.ok()) say("warning: " + s.message());
  }
  void fault(const std::string& what, const std::string& action, double cost_s) {
    ++faults_;
    log({{"event", "fault"}, {"step", step_.load()}, {"what", what}, {"action", action}, {"cost_s", cost_s}});
    say("fault: " + what + " -> " + action);
  }

  Status warmup();
  // One step on the trainer mesh, recovering from a lost rank (see the
  // file comment of rl_job.h).
  Result<StepResult> train_step(const std::vector<trainer::WireSequence>& seqs, bool supervised);
  // An RL step's updates (algorithm.epochs x mini_batches train_steps),
  // their stats combined.
  Result<StepResult> train_updates(std::vector<trainer::WireSequence> seqs);
  // PPO: each sequence's old values (the critic's before any update),
  // from the ranks, in place.
  Status score_values(std::vector<trainer::WireSequence>& seqs);
  Status recover_trainers(const std::vector<size_t>& ok_ranks);
  // ZeRO-1 in memory: every rank back at the last committed update, each
  // segment from its own rank or its successor's backup.
  Status recover_shards(const std::vector<trainer::TrainerInfo>& infos);
  // ZeRO-1 in memory: every rank snapshots its segment, then backs up the
  // previous rank's; the snapshot round of an update.
  // `taken`: the ranks' snapshots, already made with their step (all R);
  // empty: ask every rank for one first.
  Status snapshot_shards(std::vector<trainer::ShardSnapshot> taken = {});
  // A new collective group for the trainer mesh, joined by every rank.
  Status regroup_trainers();
  // The replicas' parameters agree, bit for bit.
  Status check_replicas();
  // Every rank's TrainerInfo (the asks wait for restarting ranks).
  Result<std::vector<trainer::TrainerInfo>> trainer_infos() const;
  Status publish_and_sync(uint64_t version, json& timing);
  // rollout.weight_sync = "rma": publishes `version`, and every engine
  // reads it. Returns the engines' longest sync, and sets published_.
  Result<double> read_weights(uint64_t version);
  // Rank 0 failed to publish `version` (`lost_because`): every rank takes
  // a survivor's state, then rank 0 publishes it; sets published_.
  Status republish(uint64_t version, const Status& lost_because);
  // rollout.weight_sync = "broadcast": publishes `version` and broadcasts
  // it from trainer rank 0 to every engine over the weight-sync group;
  // engines that miss it are synced by reads. Returns the engines' longest
  // sync (0: none took it), and sets published_.
  Result<double> broadcast_weights(uint64_t version);
  // The weight-sync group (trainer rank 0 and every engine), made and
  // joined; false when a member is between incarnations (reads this time).
  bool make_sync_group();
  // Releases the weight-sync group (a member failed): the collectives
  // still waiting on it fail at once; made again at the next sync.
  void drop_sync_group();
  // Syncs engine `e` by reads of published_ at once: true when done, else
  // it is left for resync_.
  bool read_sync(size_t e, const std::string& why);
  Status sync_engine(size_t engine);
  // The published weights' rank 0 is the one that published them; after
  // it restarted, every rank takes the job's state and rank 0 publishes the
  // same version again.
  Status ensure_publisher();
  Result<double> evaluate(uint64_t version);
  // One played episode of a multi-turn environment.
  struct Played {
    rollout::Sample sample;  // every token after the first observation
    std::vector<uint8_t> mask;  // 1 on the model's tokens
    double reward = 0;
  };
  // Plays `samples` episodes of each of `episodes` (sample i of episode e
  // draws from the streams of (seed_of(e), turn, i)), turn by turn: each
  // turn a Generate on an engine, then the environment's replies from a
  // reward worker.
  Result<std::vector<std::vector<Played>>> play(const std::vector<uint64_t>& episodes, size_t samples,
                                                const std::function<uint64_t(uint64_t)>& seed_of,
                                                double temperature, uint64_t min_version);
  Status checkpoint(size_t step);
  // Removes the checkpoints keep_checkpoints leaves out (never `newest`).
  void prune_checkpoints(const fs::path& newest);
  Result<size_t> resume();
  // Loads the checkpoint in `dir` on every rank; its step.
  Result<size_t> resume_from(const fs::path& dir);
  void feed();
  // Puts a group back after a failure; a group that failed kMaxGroupFailures
  // times stops the job (something is down for good, not a passing fault).
  void requeue(uint64_t group);
  Status handle_faults();

  Runtime& rt_;
  const ClusterClient& cluster_;
  const config::RlConfig c_;
  const std::string text_;
  const JobOptions options_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<FaultInbox> inbox_;
  Clock::time_point start_ = Clock::now();
  std::unique_ptr<MetricsLog> log_;
  Meshes meshes_;
  std::unique_ptr<GroupQueue> queue_;
  std::unique_ptr<ReplayBuffer> buffer_;
  std::atomic<size_t> step_{0};
  std::atomic<size_t> faults_{0};
  std::optional<std::pair<std::string, std::string>> noted_fault_;
  bool resume_from_checkpoint_ = false;
  std::optional<trainer::PublishedWeights> published_;
  std::set<uint64_t> consumed_;  // groups trained on at or past consumed_low_
  uint64_t consumed_low_ = 0;
  std::vector<tasks::TaskPrompt> eval_set_;
  std::unique_ptr<env::Environment> env_ = env::make_environment(c_);
  // Engines to sync again once they are back (they restarted).
  std::set<size_t> resync_;
  // rollout.weight_sync = "broadcast": each member's handle on the
  // weight-sync group (trainer rank 0's first); empty when not made.
  std::vector<CollectiveGroup> sync_group_;
  // Engines whose last broadcast went straight into their decoder
  // (config::device_weight_broadcast).
  size_t into_device_ = 0;
  // The last broadcast's root sent its device's parameters.
  bool from_device_ = false;
  // Broadcasts that failed in a row in a way no retry mends; after 2,
  // reads from then on.
  size_t lasting_failures_ = 0;
  bool broadcast_off_ = false;
  // A device-to-device weight copy failed once (logged once).
  bool device_copy_noted_ = false;
  // Keeps `p` as the published weights for later syncs (restarted
  // engines, fallbacks), without the trainer's device parameters: those
  // change at its next step, the published buffer only at the next publish.
  void keep_published(trainer::PublishedWeights p) {
    p.device = {};
    published_ = std::move(p);
  }
  // Whether the ranks are past the warm-up.
  bool rl_phase_ = false;
  // The ranks' optimizer steps in the current phase (each TrainStep says
  // it, so that a rank that lost its state refuses to train).
  uint64_t optimizer_steps_ = 0;
  // ZeRO-1 in memory: the last complete snapshot round's snapshots (for a
  // survivor's reference policy) and the version all ranks have.
  std::vector<trainer::ShardSnapshot> snapshots_;
  std::optional<trainer::ShardVersion> snapshot_version_;
  static constexpr int kMaxGroupFailures = 5;
  std::mutex failures_mu_;
  std::map<uint64_t, int> group_failures_;  // REQUIRES: failures_mu_
  std::string fatal_;                       // REQUIRES: failures_mu_
  std::atomic<bool> has_fatal_{false};
  friend class Probe;
};

// One field of each item.
template <class T, class F>
auto each(const std::vector<T>& items, F field) {
  std::vector<std::invoke_result_t<F, const T&>> out;
  for (const auto& i : items) out.push_back(field(i));
  return out;
}

// The test hook's view of a job.
class Probe : public JobProbe {
 public:
  explicit Probe(const Job& job) : job_(job) {}
  std::vector<int64_t> trainer_pids() const override {
    return each(infos(), [](const trainer::TrainerInfo& i) { return i.pid; });
  }
  std::vector<int64_t> engine_pids() const override {
    return each(reports(), [](const std::optional<rollout::EngineReport>& r) { return r ? r->pid : int64_t{-1}; });
  }
  std::vector<uint64_t> engine_checksums() const override {
    return each(reports(), [](const std::optional<rollout::EngineReport>& r) { return r ? r->checksum : uint64_t{0}; });
  }
  std::vector<uint64_t> trainer_checksums() const override {
    return each(infos(), [](const trainer::TrainerInfo& i) { return i.checksum; });
  }
  std::vector<uint64_t> trainer_optimizer_floats() const override {
    return each(infos(), [](const trainer::TrainerInfo& i) { return i.optimizer_floats; });
  }

 private:
  // Each engine's report (none for one that did not answer).
  std::vector<std::optional<rollout::EngineReport>> reports() const {
    std::vector<std::optional<rollout::EngineReport>> out;
    const auto& engines = *job_.meshes_.engines;
    for (size_t e = 0; e < engines.size(); ++e) {
      auto r = engines.member(e).ask(rollout::GetEngineReport{}, job_.timeout_).get();
      out.push_back(r ? std::optional(*r) : std::nullopt);
    }
    return out;
  }
  std::vector<trainer::TrainerInfo> infos() const {
    auto i = job_.trainer_infos();
    trainer::TrainerInfo lost;
    lost.pid = -1;
    return i ? *i : std::vector<trainer::TrainerInfo>(job_.meshes_.trainers->size(), lost);
  }
  const Job& job_;
};

Result<StepResult> Job::train_step(const std::vector<trainer::WireSequence>& seqs, bool supervised) {
  for (int attempt = 0;; ++attempt) {
    auto out = train_ranks(*meshes_.trainers, seqs, supervised, c_.algorithm.loss.aggregation, optimizer_steps_,
                           rl_phase_, shard_backup(), timeout_);
    std::string why;
    if (out.failed.empty()) {
      // ZeRO-1 in memory: the update counts once every segment is in two places.
      Status snap = out.combined.trained ? snapshot_shards(std::move(out.snapshots)) : Status();
      if (snap.ok()) {
        if (out.combined.trained) ++optimizer_steps_;
        out.combined.updates = out.combined.trained ? 1 : 0;
        return out.combined;
      }
      why = "the snapshot round after the update: " + snap.message();
      out.ok_ranks.clear();  // back to the last committed update
    }
    for (const auto& [r, st] : out.failed) {
      why += (why.empty() ? "" : "; ") + std::string("trainer rank ") + std::to_string(r) + ": " + st.message();
    }
    if (attempt == 4) return error(out.failed.empty() ? ErrorCode::peer_lost : out.failed[0].second.code(), why);
    const auto start = Clock::now();
    if (Status s = recover_trainers(out.ok_ranks); !s.ok()) {
      return error(s.code(), why + "; recovery failed: " + s.message());
    }
    if (sharded()) {
      fault(why, "every rank back at its shard after update " + std::to_string(optimizer_steps_) +
                     " (a lost rank's from its successor's backup); new collective group; update redone",
            seconds_since(start));
      continue;
    }
    if (!out.ok_ranks.empty()) {
      // A rank applied the step before another was lost: the step stands,
      // and every rank now has that rank's state.
      fault(why, "kept the step (rank " + std::to_string(out.ok_ranks[0]) +
                     " had applied it); every rank took its state; new collective group",
            seconds_since(start));
      ++optimizer_steps_;
      out.combined.updates = 1;
      return out.combined;
    }
    fault(why, "every rank took a survivor's state; new collective group; step redone", seconds_since(start));
  }
}

Result<StepResult> Job::train_updates(std::vector<trainer::WireSequence> seqs) {
  const size_t epochs = c_.algorithm.epochs;
  const size_t parts = std::max<size_t>(1, std::min(c_.algorithm.mini_batches, seqs.size()));
  if (epochs * parts == 1) return train_step(seqs, false);
  if (c_.algorithm.name == config::Algorithm::ppo) {
    if (Status s = score_values(seqs); !s.ok()) return error(s);
  }
  StepResult all;
  all.sequences = seqs.size();
  size_t trained = 0;
  for (size_t e = 0; e < epochs; ++e) {
    for (size_t p = 0; p < parts; ++p) {
      // Contiguous parts of near-equal size (a group's samples stay together
      // where the sizes allow).
      const size_t begin = p * seqs.size() / parts, end = (p + 1) * seqs.size() / parts;
      std::vector<trainer::WireSequence> part(seqs.begin() + static_cast<ptrdiff_t>(begin),
                                              seqs.begin() + static_cast<ptrdiff_t>(end));
      auto st = train_step(part, false);
      if (!st) return st;
      if (e == 0) all.tokens += st->tokens;
      all.compute_s += st->compute_s;
      all.allreduce_s += st->allreduce_s;
      if (!st->trained) continue;
      ++trained;
      all.trained = true;
      // Means over the updates; the last update's norm and learning rate.
      all.loss += st->loss;
      all.kl += st->kl;
      all.clip_fraction += st->clip_fraction;
      all.entropy += st->entropy;
      all.value_loss += st->value_loss;
      all.explained_variance += st->explained_variance;
      all.grad_norm = st->grad_norm;
      all.learning_rate = st->learning_rate;
    }
  }
  all.updates = trained;
  if (trained > 0) {
    for (double* v : {&all.loss, &all.kl, &all.clip_fraction, &all.entropy, &all.value_loss, &all.explained_variance}) {
      *v /= static_cast<double>(trained);
    }
  }
  return all;
}

Status Job::score_values(std::vector<trainer::WireSequence>& seqs) {
  const auto& T = *meshes_.trainers;
  const size_t R = T.size();
  for (int attempt = 0;; ++attempt) {
    std::vector<std::vector<trainer::WireSequence>> shards(R);
    for (size_t i = 0; i < seqs.size(); ++i) shards[i % R].push_back(seqs[i]);
    std::vector<Future<std::vector<std::vector<float>>>> asks;
    for (size_t r = 0; r < R; ++r) asks.push_back(T.member(r).ask(trainer::ScoreValues{std::move(shards[r])}, timeout_));
    std::string why;
    Status first;
    for (size_t r = 0; r < R; ++r) {
      auto v = asks[r].get();
      if (!v) {
        if (first.ok()) first = v.error();
        why += (why.empty() ? "" : "; ") + std::string("trainer rank ") + std::to_string(r) + ": " + v.error().message();
        continue;
      }
      for (size_t k = 0; k < v->size(); ++k) seqs[r + k * R].values = std::move((*v)[k]);
    }
    if (why.empty()) return {};
    if (attempt == 4) return Status(first.code(), "scoring the old values: " + why);
    // Scoring changes no state: any rank with the job's state will do.
    const auto start = Clock::now();
    if (Status s = recover_trainers({}); !s.ok()) {
      return Status(s.code(), "scoring the old values: " + why + "; recovery failed: " + s.message());
    }
    fault(why, "every rank took a survivor's state; new collective group; old values scored again",
          seconds_since(start));
  }
}

Status Job::recover_trainers(const std::vector<size_t>& ok_ranks) {
  const auto& T = *meshes_.trainers;
  const size_t R = T.size();
  // Each rank's state: the asks wait for a restarting rank to be back.
  auto got = trainer_infos();
  if (!got) return got.error();
  const std::vector<trainer::TrainerInfo>& infos = *got;
  if (sharded()) {
    if (!shard_backup()) {
      // ZeRO-1 without backups: the lost rank's segment of the optimizer state was only there.
      resume_from_checkpoint_ = true;
      return Status(ErrorCode::peer_lost, "a trainer rank's optimizer shard was lost (shard_optimizer without "
                                          "shard_backup): resume from the last checkpoint with --resume");
    }
    return recover_shards(infos);
  }
  // The state to copy: a rank that applied the step, else one whose state
  // is the job's (its phase and optimizer steps: a rank that restarted has
  // a fresh one).
  std::optional<size_t> source;
  for (size_t r : ok_ranks) {
    if (!source && infos[r].optimizer_steps == optimizer_steps_ + 1 && infos[r].rl_phase == rl_phase_) source = r;
  }
  for (size_t r = 0; r < R && !source && ok_ranks.empty(); ++r) {
    if (infos[r].optimizer_steps == optimizer_steps_ && infos[r].rl_phase == rl_phase_) source = r;
  }
  // Where no survivor has the whole state, the last checkpoint is the last
  // consistent one (run_rl_job goes back to it).
  if (!source) {
    resume_from_checkpoint_ = true;
    return Status(ErrorCode::peer_lost, "no trainer rank has the job's state (every one restarted): resume from the "
                                        "last checkpoint with --resume");
  }
  auto handles = T.member(*source).ask(trainer::ExportTrainerState{}, timeout_).get();
  if (!handles) return Status(handles.error().code(), "exporting rank " + std::to_string(*source) + "'s state: " +
                                                          handles.error().message());
  std::vector<std::pair<size_t, Future<uint64_t>>> imports;
  for (size_t r = 0; r < R; ++r) {
    if (r != *source) imports.emplace_back(r, T.member(r).ask(trainer::ImportTrainerState{*handles, rl_phase_}, timeout_));
  }
  for (auto& [r, f] : imports) {
    auto done = f.get();
    if (!done) return Status(done.error().code(), "rank " + std::to_string(r) + " taking the state: " + done.error().message());
  }
  if (Status s = regroup_trainers(); !s.ok()) return s;
  return check_replicas();
}

Status Job::regroup_trainers() {
  const auto& T = *meshes_.trainers;
  if (T.size() < 2) return {};
  // The old group is broken (a rank was lost); releasing it frees its shared
  // memory in the processes that survived.
  if (meshes_.trainer_group) (void)T.release_group(*meshes_.trainer_group);
  auto groups = T.make_group();
  if (!groups) return Status(groups.error().code(), "a new collective group: " + groups.error().message());
  meshes_.trainer_group = (*groups)[0];
  for (size_t r = 0; r < T.size(); ++r) {
    auto joined = T.member(r).ask(trainer::JoinTrainerGroup{(*groups)[r]}, timeout_).get();
    if (!joined) return Status(joined.error().code(), "rank " + std::to_string(r) + " joining: " + joined.error().message());
  }
  return {};
}

Status Job::check_replicas() {
  auto after = trainer_infos();
  if (!after) return after.error();
  for (size_t r = 1; r < after->size(); ++r) {
    if ((*after)[r].checksum != (*after)[0].checksum) {
      return Status(ErrorCode::invalid_argument, "after the recovery, rank " + std::to_string(r) +
                                                     "'s weights differ from rank 0's");
    }
  }
  return {};
}

Status Job::snapshot_shards(std::vector<trainer::ShardSnapshot> taken) {
  if (!shard_backup()) return {};
  const auto& T = *meshes_.trainers;
  const size_t R = T.size();
  std::vector<trainer::ShardSnapshot> snaps = std::move(taken);
  Status first;
  if (snaps.size() != R) {
    snaps.clear();
    std::vector<Future<trainer::ShardSnapshot>> asks;
    for (size_t r = 0; r < R; ++r) asks.push_back(T.member(r).ask(trainer::SnapshotShard{}, timeout_));
    for (size_t r = 0; r < R; ++r) {
      auto s = asks[r].get();
      if (!s && first.ok()) first = Status(s.error().code(), "trainer rank " + std::to_string(r) + ": " + s.error().message());
      snaps.push_back(s ? *s : trainer::ShardSnapshot{});
    }
    if (!first.ok()) return first;
  }
  std::vector<Future<void>> backups;
  for (size_t r = 0; r < R; ++r) backups.push_back(T.member(r).ask(trainer::BackUpShard{snaps[(r + R - 1) % R]}, timeout_));
  for (size_t r = 0; r < R; ++r) {
    auto b = backups[r].get();
    if (!b && first.ok()) first = Status(b.error().code(), "trainer rank " + std::to_string(r) + ": " + b.error().message());
  }
  if (!first.ok()) return first;
  snapshots_ = std::move(snaps);
  snapshot_version_ = trainer::ShardVersion{snapshots_[0].optimizer_steps, snapshots_[0].rl_phase};
  return {};
}

Status Job::recover_shards(const std::vector<trainer::TrainerInfo>& infos) {
  const auto& T = *meshes_.trainers;
  const size_t R = T.size();
  const trainer::ShardVersion at{optimizer_steps_, rl_phase_};
  auto holds = [&at](const std::vector<trainer::ShardVersion>& v) { return std::find(v.begin(), v.end(), at) != v.end(); };
  auto lost = [&](const std::string& why) {
    resume_from_checkpoint_ = true;
    return Status(ErrorCode::peer_lost, why + ": resume from the last checkpoint with --resume");
  };
  // Each rank's way back: its own state or snapshot (a rank that restarted
  // has no snapshot), else its successor's backup of its segment.
  std::vector<std::optional<trainer::ShardSnapshot>> from(R);
  std::optional<size_t> keeper;
  for (size_t r = 0; r < R; ++r) {
    const bool live = infos[r].optimizer_steps == at.optimizer_steps && infos[r].rl_phase == at.rl_phase;
    if (holds(infos[r].snapshots) || (live && !infos[r].snapshots.empty())) {
      if (!keeper) keeper = r;
      continue;
    }
    const size_t next = (r + 1) % R;
    if (!holds(infos[next].backups)) {
      return lost("trainer rank " + std::to_string(r) + "'s optimizer shard after update " +
                  std::to_string(at.optimizer_steps) + " is on neither it nor rank " + std::to_string(next) +
                  " (both were lost)");
    }
    auto b = T.member(next).ask(trainer::ExportBackup{at}, timeout_).get();
    if (!b) return lost("rank " + std::to_string(next) + " could not give its backup: " + b.error().message());
    from[r] = *b;
  }
  if (!keeper) return lost("no trainer rank kept its optimizer shard (every one restarted)");
  RemoteBuffer reference;
  if (*keeper < snapshots_.size()) reference = snapshots_[*keeper].reference;
  // The restarted ranks learn their segments by joining; then every rank
  // goes back to `at`; then every segment goes to every rank.
  if (Status s = regroup_trainers(); !s.ok()) return s;
  std::vector<Future<void>> restores;
  for (size_t r = 0; r < R; ++r) {
    trainer::RestoreShard m{at, from[r].value_or(trainer::ShardSnapshot{}), from[r] ? reference : RemoteBuffer()};
    restores.push_back(T.member(r).ask(m, timeout_));
  }
  for (size_t r = 0; r < R; ++r) {
    auto done = restores[r].get();
    if (!done) return Status(done.error().code(), "rank " + std::to_string(r) + " going back to its shard: " +
                                                      done.error().message());
  }
  std::vector<Future<void>> gathers;
  for (size_t r = 0; r < R; ++r) gathers.push_back(T.member(r).ask(trainer::GatherParams{}, timeout_));
  for (size_t r = 0; r < R; ++r) {
    auto done = gathers[r].get();
    if (!done) return Status(done.error().code(), "rank " + std::to_string(r) + ": " + done.error().message());
  }
  if (Status s = check_replicas(); !s.ok()) return s;
  // Every segment in two places again (the restarted ranks hold none yet).
  return snapshot_shards();
}

Result<std::vector<trainer::TrainerInfo>> Job::trainer_infos() const {
  const auto& T = *meshes_.trainers;
  std::vector<Future<trainer::TrainerInfo>> asks;
  for (size_t r = 0; r < T.size(); ++r) asks.push_back(T.member(r).ask(trainer::GetTrainerInfo{}, timeout_));
  std::vector<trainer::TrainerInfo> out;
  for (size_t r = 0; r < asks.size(); ++r) {
    auto i = asks[r].get();
    // A rank being restarted: ask it alone until it is back.
    if (!i && between_incarnations(i.error().code()))
      i = until_back([&] { return T.member(r).ask(trainer::GetTrainerInfo{}, timeout_).get(); }, timeout_);
    if (!i) return error(i.error().code(), "trainer rank " + std::to_string(r) + " is not back: " + i.error().message());
    out.push_back(*i);
  }
  return out;
}


Status Job::warmup() {
  auto set = tasks::warmup_set(c_);
  std::mt19937_64 rng(c_.run.seed + 2);
  const auto start = Clock::now();
  double last_loss = 0;
  for (size_t step = 1; step <= c_.warmup.steps; ++step) {
    std::vector<trainer::WireSequence> seqs(c_.warmup.batch);
    for (auto& s : seqs) {
      const auto& src = set[rng() % set.size()];
      s.prompt = src.prompt;
      s.completion = src.completion;
      s.mask = src.completion_mask;  // an episode's observations are context, not labels
    }
    auto st = train_step(seqs, true);
    if (!st) {
      return Status(st.error().code(), "warm-up step " + std::to_string(step) + ": " + st.error().message());
    }
    last_loss = st->loss;
    if (step % 250 == 0 || step == c_.warmup.steps) {
      say("warm-up " + std::to_string(step) + "/" + std::to_string(c_.warmup.steps) + "  loss " + fixed(last_loss, 3) +
          "  " + fixed(seconds_since(start), 1) + " s");
      log({{"event", "warmup"}, {"step", step}, {"loss", last_loss}});
    }
  }
  for (size_t r = 0; r < meshes_.trainers->size(); ++r) {
    auto ok = meshes_.trainers->member(r).ask(trainer::StartRlPhase{}, timeout_).get();
    if (!ok) return ok.error();
  }
  rl_phase_ = true;
  optimizer_steps_ = 0;  // the RL phase's optimizer starts afresh
  return snapshot_shards();
}

Status Job::sync_engine(size_t e) {
  // Called for an engine the job was told restarts. The sync is idempotent;
  // an engine still finishing a sync (already_exists: a broadcast whose
  // answer did not come in time) is asked again the same way.
  auto r = until_back([&] { return meshes_.engines->member(e).ask(rollout::SyncWeights{*published_}, timeout_).get(); },
                      timeout_, ErrorCode::already_exists);
  return r ? Status() : r.error();
}

std::vector<GroupRanks> sync_group_parts(const Meshes& m) {
  return {m.trainers->range("ranks", 0, 1).value().group_ranks(), m.engines->group_ranks()};
}

bool Job::make_sync_group() {
  const auto start = Clock::now();
  auto groups = make_group(sync_group_parts(meshes_), GroupOptions{.timeout = timeout_});
  if (!groups) {
    log({{"event", "weight_sync_group"}, {"step", step_.load()}, {"made", false},
         {"why", groups.error().message()}, {"action", "the engines read the weights this time"}});
    return false;
  }
  std::vector<Future<void>> joined;
  joined.push_back(meshes_.trainers->member(0).ask(trainer::JoinWeightSyncGroup{(*groups)[0]}, timeout_));
  for (size_t e = 0; e < meshes_.engines->size(); ++e) {
    joined.push_back(meshes_.engines->member(e).ask(trainer::JoinWeightSyncGroup{(*groups)[e + 1]}, timeout_));
  }
  sync_group_ = std::move(*groups);
  for (auto& f : joined) {
    if (auto r = f.get(); !r) {
      log({{"event", "weight_sync_group"}, {"step", step_.load()}, {"made", false},
           {"why", "a member did not join: " + r.error().message()}, {"action", "the engines read the weights this time"}});
      drop_sync_group();
      return false;
    }
  }
  log({{"event", "weight_sync_group"}, {"step", step_.load()}, {"made", true}, {"ranks", sync_group_.size()},
       {"cost_s", seconds_since(start)}});
  return true;
}

void Job::drop_sync_group() {
  if (sync_group_.empty()) return;
  (void)release_group(sync_group_parts(meshes_), sync_group_[0]);
  sync_group_.clear();
}

bool Job::read_sync(size_t e, const std::string& why) {
  auto r = meshes_.engines->member(e).ask(rollout::SyncWeights{*published_}, timeout_).get();
  if (r) return true;
  // It restarts (its failure comes to the inbox) and is synced once back.
  resync_.insert(e);
  fault("rollout engine " + std::to_string(e) + " failed a weight sync: " + why + "; then by reads: " +
            r.error().message(),
        "the others synced; it is synced again when it is back", 0);
  return false;
}

Result<double> Job::broadcast_weights(uint64_t version) {
  const size_t E = meshes_.engines->size();
  const auto parts = sync_group_parts(meshes_);
  const CollectiveGroup group = sync_group_[0];
  // Past the group's deadline (timeout_ from each member's start) every
  // member's broadcast has failed: the asks' own bound only catches a
  // member that never answers.
  const auto bound = timeout_ + std::chrono::seconds(15);
  auto root = meshes_.trainers->member(0).ask(trainer::BroadcastWeights{version, group.id}, bound);
  auto engines = meshes_.engines->stream(rollout::ReceiveWeights{version, group.id}, bound);
  // Whichever member fails first (a refusal, a lost process), the group is
  // released at once, so that the others stop waiting for it: the root
  // waits on the engines of its host, the engines on the root.
  std::once_flag released;
  auto release = [&] { std::call_once(released, [&] { (void)release_group(parts, group); }); };
  Result<trainer::WeightsBroadcast> b = error(ErrorCode::timeout, "no answer");
  std::thread root_waiter([&] {
    b = root.get();
    if (!b || !b->failed.empty()) release();
  });
  double engine_s = 0;
  std::vector<size_t> missed;
  std::string why;
  into_device_ = 0;
  from_device_ = false;
  // A failure that no retry mends (NCCL refusing two ranks on one GPU, a
  // device that cannot hold the standby) rather than a lost member or a
  // deadline, on an engine or the root.
  auto mends_not = [](ErrorCode code) {
    return code == ErrorCode::invalid_argument || code == ErrorCode::unsupported || code == ErrorCode::start_failed;
  };
  bool lasting = false;
  while (auto reply = engines.next()) {
    if (reply->second) {
      engine_s = std::max(engine_s, reply->second->seconds);
      into_device_ += reply->second->into_device;
      continue;
    }
    release();
    lasting |= mends_not(reply->second.error().code());
    if (why.empty()) why = reply->second.error().message();
    missed.push_back(reply->first);
  }
  root_waiter.join();
  const auto start = Clock::now();
  if (!b || !b->failed.empty() || !missed.empty()) sync_group_.clear();  // released: made again at the next sync
  if (!b) {
    // Rank 0 was lost: the engines read what it publishes once back.
    if (Status s = republish(version, b.error()); !s.ok()) return error(s);
    missed.clear();
    for (size_t e = 0; e < E; ++e) missed.push_back(e);
    why = "trainer rank 0 failed: " + b.error().message();
  } else {
    keep_published(b->published);
    from_device_ = b->from_device;
    if (!b->failed.empty()) lasting |= mends_not(static_cast<ErrorCode>(b->failed_code));
    if (!b->failed.empty() && missed.empty()) return engine_s;  // every engine has it; the root's side failed late
    if (!b->failed.empty()) why = b->failed;
  }
  if (missed.empty()) {
    lasting_failures_ = 0;
    return engine_s;
  }
  // One fault for the broadcast, whoever failed; an engine that cannot be
  // read into either is a fault of its own (read_sync).
  size_t read = 0;
  for (size_t e : missed) read += read_sync(e, why);
  // Twice in a row: a communicator aborted once is not a refusal.
  lasting_failures_ = lasting ? lasting_failures_ + 1 : 0;
  if (lasting_failures_ >= 2) broadcast_off_ = true;
  fault("the weight broadcast of version " + std::to_string(version) + " failed: " + why,
        std::to_string(read) + " of " + std::to_string(missed.size()) +
            " engine(s) that missed it synced by one-sided reads; " +
            (broadcast_off_ ? "twice a failure no retry mends: the engines read the weights from now on"
                            : "the weight-sync group is made again"),
        seconds_since(start));
  return engine_s;
}

Status Job::republish(uint64_t version, const Status& lost_because) {
  // Rank 0 was lost after the step: once it is back with a survivor's
  // state (the step's result), publish again.
  const auto lost = Clock::now();
  if (Status s = recover_trainers({}); !s.ok()) {
    return Status(lost_because.code(), "publishing weights: " + lost_because.message() + "; " + s.message());
  }
  fault("trainer rank 0 failed to publish version " + std::to_string(version) + ": " + lost_because.message(),
        "every rank took a survivor's state; published again", seconds_since(lost));
  auto pub = meshes_.trainers->member(0).ask(trainer::PublishWeights{version}, timeout_).get();
  if (!pub) return Status(pub.error().code(), "publishing weights: " + pub.error().message());
  keep_published(*pub);
  return {};
}

Result<double> Job::read_weights(uint64_t version) {
  auto pub = meshes_.trainers->member(0).ask(trainer::PublishWeights{version}, timeout_).get();
  if (pub) {
    keep_published(*pub);
  } else if (Status s = republish(version, pub.error()); !s.ok()) {
    return error(s);
  }
  // The trainer's device parameters go with this sync only: it takes no
  // step before every engine has answered, or the asks have timed out; an
  // engine copies from them only well before that.
  trainer::PublishedWeights now = pub ? *pub : *published_;
  if (!now.device.device.empty()) {
    now.device.valid_until_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                         (std::chrono::system_clock::now() + timeout_ / 2).time_since_epoch())
                                         .count();
  }
  std::vector<Future<rollout::SyncReport>> futures;
  for (size_t e = 0; e < meshes_.engines->size(); ++e) {
    futures.push_back(meshes_.engines->member(e).ask(rollout::SyncWeights{now}, timeout_));
  }
  double engine_s = 0;
  into_device_ = 0;
  for (size_t e = 0; e < futures.size(); ++e) {
    auto r = futures[e].get();
    if (r) {
      into_device_ += r->into_device;
      if (!r->device_copy_failed.empty() && !device_copy_noted_) {
        device_copy_noted_ = true;
        log({{"event", "weight_sync_device_copy"},
             {"step", step_.load()},
             {"engine", e},
             {"why", r->device_copy_failed},
             {"action", "it read the weights; so do the others when it fails"}});
      }
    }
    if (!r) {
      // The engine restarts (its failure comes to the inbox) and is synced
      // again once back; the others go on.
      resync_.insert(e);
      fault("rollout engine " + std::to_string(e) + " failed a weight sync: " + r.error().message(),
            "the others synced; it is synced again when it is back", 0);
      continue;
    }
    engine_s = std::max(engine_s, r->seconds);
  }
  return engine_s;
}

Status Job::publish_and_sync(uint64_t version, json& timing) {
  const auto start = Clock::now();
  const bool broadcast = c_.rollout.weight_sync == config::WeightSync::broadcast && !broadcast_off_ &&
                         (!sync_group_.empty() || make_sync_group());
  auto engine_s = broadcast ? broadcast_weights(version) : read_weights(version);
  if (!engine_s) return engine_s.error();
  const double bytes = static_cast<double>(published_->floats * sizeof(float));
  timing["sync"] = seconds_since(start);
  timing["sync_gbps"] = *engine_s > 0 ? bytes / *engine_s / 1e9 : 0;
  timing["synced_into_device"] = into_device_;
  timing["synced_from_device"] = broadcast && from_device_;
  queue_->publish(version);
  return {};
}

Status Job::ensure_publisher() {
  auto infos = trainer_infos();
  if (!infos) return infos.error();
  if ((*infos)[0].pid == published_->publisher_pid) return {};
  const auto start = Clock::now();
  const uint64_t version = published_->version;
  if (Status s = recover_trainers({}); !s.ok()) {
    return Status(s.code(), "trainer rank 0, which published version " + std::to_string(version) +
                                ", restarted, and the ranks could not take the job's state again: " + s.message());
  }
  auto pub = meshes_.trainers->member(0).ask(trainer::PublishWeights{version}, timeout_).get();
  if (!pub) return Status(pub.error().code(), "publishing version " + std::to_string(version) + " again: " +
                                                  pub.error().message());
  keep_published(*pub);
  fault("trainer rank 0 restarted after publishing version " + std::to_string(version),
        "every rank took the job's state; version " + std::to_string(version) + " published again",
        seconds_since(start));
  return {};
}

Status Job::handle_faults() {
  for (auto& e : inbox_->drain()) {
    const auto& f = e.failure;
    std::string what = e.mesh + " member " + std::to_string(f.rank) + " failed: " + f.reason;
    if (!f.restarting) return Status(ErrorCode::peer_lost, what + "; it is not restarting");
    if (e.mesh == "rollout") resync_.insert(f.rank);
    // A member of the weight-sync group went with its process: the group
    // is broken; a new one is made at the next sync.
    if (e.mesh == "rollout" || (e.mesh == "trainer" && f.rank == 0)) drop_sync_group();
    const char* action = e.mesh == "rollout"   ? "its groups requeued; it restarts and is synced again"
                         : e.mesh == "trainer" ? "it restarts; the step takes a survivor's state"
                                               : "its groups scored elsewhere or requeued; it restarts";
    fault(what, action, 0);
  }
  if (!published_) return {};
  if (!resync_.empty()) {
    // Colocated, an engine dies with its rank: when that was rank 0, the
    // published weights went with it.
    if (Status s = ensure_publisher(); !s.ok()) return s;
  }
  for (auto it = resync_.begin(); it != resync_.end();) {
    const auto start = Clock::now();
    if (Status s = sync_engine(*it); !s.ok()) {
      return Status(s.code(), "rollout engine " + std::to_string(*it) + " did not come back: " + s.message());
    }
    log({{"event", "fault"},
         {"step", step_.load()},
         {"what", "rollout engine " + std::to_string(*it) + " is back"},
         {"action", "synced to version " + std::to_string(published_->version)},
         {"cost_s", seconds_since(start)}});
    it = resync_.erase(it);
  }
  return {};
}

Result<std::vector<std::vector<Job::Played>>> Job::play(const std::vector<uint64_t>& episodes, size_t samples,
                                                       const std::function<uint64_t(uint64_t)>& seed_of,
                                                       double temperature, uint64_t min_version) {
  struct Live {
    size_t episode, sample;
    std::vector<int32_t> context;
    std::vector<std::string> turns;
  };
  std::vector<std::vector<Played>> out(episodes.size(), std::vector<Played>(samples));
  std::vector<Live> live;
  for (size_t e = 0; e < episodes.size(); ++e) {
    const auto first = tasks::prompt_tokens(env_->first(episodes[e]));
    for (size_t i = 0; i < samples; ++i) {
      live.push_back({e, i, first, {}});
      out[e][i].sample.version_first = rollout::kNoVersion;
    }
  }
  const size_t context = c_.model.shape.context_length;
  for (uint64_t turn = 0; !live.empty(); ++turn) {
    rollout::Generate gen;
    gen.min_version = min_version;
    gen.temperature = temperature;
    for (size_t k = 0; k < live.size(); ++k) {
      gen.groups.push_back({k, live[k].context, 1, seed_of(episodes[live[k].episode]) ^ (turn * 0x9e3779b97f4a7c15ull + live[k].sample)});
    }
    auto done = meshes_.engines->choose(gen, timeout_).get();
    if (!done) return error(done.error().code(), "turn " + std::to_string(turn) + ": " + done.error().message());
    reward::StepEnv step;
    for (size_t k = 0; k < live.size(); ++k) {
      const rollout::Sample& s = (*done)[k].samples[0];
      Played& p = out[live[k].episode][live[k].sample];
      p.sample.tokens.insert(p.sample.tokens.end(), s.tokens.begin(), s.tokens.end());
      p.sample.logprobs.insert(p.sample.logprobs.end(), s.logprobs.begin(), s.logprobs.end());
      p.mask.resize(p.sample.tokens.size(), 1);
      p.sample.version_first = std::min(p.sample.version_first, s.version_first);
      p.sample.version_last = s.version_last;
      p.sample.stop = s.stop;
      live[k].context.insert(live[k].context.end(), s.tokens.begin(), s.tokens.end());
      std::vector<int32_t> text(s.tokens);
      if (!text.empty() && text.back() == model::ByteTokenizer::kEos) text.pop_back();
      live[k].turns.push_back(model::ByteTokenizer::decode(text));
      step.turns.push_back({episodes[live[k].episode], live[k].turns});
    }
    auto replies = meshes_.rewards->choose(step, timeout_).get();
    if (!replies || replies->size() != live.size()) {
      return error(replies ? ErrorCode::malformed : replies.error().code(),
                   "environment, turn " + std::to_string(turn) + ": " +
                       (replies ? std::string("wrong reply") : replies.error().message()));
    }
    std::vector<Live> still;
    for (size_t k = 0; k < live.size(); ++k) {
      const reward::EnvReply& r = (*replies)[k];
      Played& p = out[live[k].episode][live[k].sample];
      p.reward = r.reward;
      const bool stopped = p.sample.stop == static_cast<uint8_t>(model::StopReason::stop_token);
      auto obs = model::ByteTokenizer::encode(r.text);
      // The episode ends when the environment says so, when the model did
      // not end its turn, or when the next turn would not fit the context.
      if (r.done || !stopped || live[k].context.size() + obs.size() + c_.answer_budget() > context) continue;
      p.sample.tokens.insert(p.sample.tokens.end(), obs.begin(), obs.end());
      p.sample.logprobs.resize(p.sample.tokens.size(), 0.0f);
      p.mask.resize(p.sample.tokens.size(), 0);
      live[k].context.insert(live[k].context.end(), obs.begin(), obs.end());
      still.push_back(std::move(live[k]));
    }
    live = std::move(still);
  }
  return out;
}

Result<double> Job::evaluate(uint64_t version) {
  if (env_) {
    std::vector<uint64_t> episodes;
    for (size_t i = 0; i < c_.task.eval_problems; ++i) episodes.push_back(env::eval_episode(c_, i));
    auto played = play(episodes, 1, [](uint64_t) { return uint64_t{0}; }, 0.0, version);
    if (!played) return error(played.error().code(), "evaluation: " + played.error().message());
    double sum = 0;
    for (const auto& e : *played) sum += e[0].reward;
    return sum / static_cast<double>(played->size());
  }
  if (eval_set_.empty()) eval_set_ = tasks::eval_prompts(c_);
  rollout::Generate gen;
  gen.min_version = version;
  gen.temperature = 0;
  for (size_t i = 0; i < eval_set_.size(); ++i) {
    gen.groups.push_back({i, tasks::prompt_tokens(eval_set_[i].prompt), 1, 0});
  }
  auto out = meshes_.engines->choose(gen, timeout_).get();
  if (!out) return error(out.error().code(), "evaluation: " + out.error().message());
  reward::Score score;
  for (size_t i = 0; i < out->size(); ++i) {
    const auto& s = (*out)[i].samples[0];
    score.items.push_back({eval_set_[i].reference, s.tokens, s.stop});
  }
  auto rewards = meshes_.rewards->choose(score, timeout_).get();
  if (!rewards) return error(rewards.error().code(), "evaluation: " + rewards.error().message());
  double sum = 0;
  for (double r : *rewards) sum += r;
  return sum / static_cast<double>(rewards->size());
}

Status Job::checkpoint(size_t step) {
  const auto start = Clock::now();
  char name[32];
  std::snprintf(name, sizeof(name), "step-%06zu", step);
  const fs::path dir = fs::path(options_.run_dir) / "checkpoints" / name;
  // A checkpoint that fails is removed whole: its partial files would hold
  // the disk's space, and resume would skip it anyway (no manifest).
  auto abandon = [&](const Status& why) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    return Status(why.code(), why.message() + (ec ? "; its partial directory " + dir.string() +
                                                        " could not be removed (" + ec.message() + ")"
                                                  : "; its partial files were removed"));
  };
  // One left at this step (by a run that went back past it) is stale: its
  // manifest must not stand beside this checkpoint's half-written state.
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return abandon(Status(ErrorCode::storage, "checkpoint: cannot create " + dir.string() + ": " + ec.message()));
  // Rank 0 writes the state; with a sharded optimizer every rank takes
  // part (the moments are gathered from all of them).
  const trainer::SaveTrainerState save{(dir / "trainer.safetensors").string(),
                                       {{"rl.step", std::to_string(step)}},
                                       (dir / "reference.safetensors").string()};
  const size_t savers = sharded() ? meshes_.trainers->size() : 1;
  std::vector<Future<void>> saves;
  for (size_t r = 0; r < savers; ++r) saves.push_back(meshes_.trainers->member(r).ask(save, timeout_));
  Status saved_all;
  for (auto& f : saves) {
    auto saved = f.get();
    if (!saved && saved_all.ok()) saved_all = Status(saved.error().code(), "checkpoint: " + saved.error().message());
  }
  if (!saved_all.ok()) return abandon(saved_all);
  // The manifest goes last, atomically and durably: a checkpoint without
  // one is incomplete and resume skips it.
  json manifest = {{"step", step},
                   {"version", step},
                   {"consumed_low", consumed_low_},
                   {"consumed", std::vector<uint64_t>(consumed_.begin(), consumed_.end())},
                   {"seed", c_.run.seed},
                   {"config", text_}};
  const fs::path manifest_path = dir / "manifest.json";
  if (Status s = io::write_atomically(manifest_path, manifest.dump(1) + "\n"); !s.ok()) {
    return abandon(Status(s.code(), "checkpoint: cannot write " + manifest_path.string() + ": " + s.message()));
  }
  log({{"event", "checkpoint"}, {"step", step}, {"path", dir.string()}, {"seconds", seconds_since(start)}});
  if (c_.run.keep_checkpoints > 0) prune_checkpoints(dir);
  return {};
}

void Job::prune_checkpoints(const fs::path& newest) {
  // The newest keep_checkpoints complete ones stay; older complete ones go,
  // and so do incomplete ones older than the newest (a crash's leftovers).
  const std::vector<fs::path> complete = complete_checkpoints(options_.run_dir);
  const size_t kept = std::min(complete.size(), c_.run.keep_checkpoints);
  std::set<fs::path> keep(complete.end() - static_cast<std::ptrdiff_t>(kept), complete.end());
  keep.insert(newest);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(options_.run_dir) / "checkpoints", ec)) {
    const fs::path& p = entry.path();
    const bool old_checkpoint = p.filename().string().rfind("step-", 0) == 0 && p.filename() < newest.filename();
    if (!old_checkpoint || keep.count(p) != 0) continue;
    std::error_code removed;
    fs::remove_all(p, removed);
    if (removed) say("warning: checkpoint: cannot remove the old checkpoint " + p.string() + ": " + removed.message());
  }
}

Result<size_t> Job::resume() {
  const fs::path root = fs::path(options_.run_dir) / "checkpoints";
  const std::vector<fs::path> complete = complete_checkpoints(options_.run_dir);
  // The newest that loads; one whose files are damaged (a manifest that is
  // not one, a state file truncated or unreadable) is passed over for the
  // one before it, and said.
  std::vector<std::string> skipped;
  for (auto it = complete.rbegin(); it != complete.rend(); ++it) {
    auto step = resume_from(*it);
    if (step) {
      for (const std::string& why : skipped) say("warning: resume: passed over " + why);
      log({{"event", "resume"}, {"step", *step}, {"from", it->string()}, {"skipped", skipped}});
      say("resumed from " + it->string() + " at step " + std::to_string(*step));
      return step;
    }
    const ErrorCode code = step.error().code();
    if (code != ErrorCode::malformed && code != ErrorCode::storage && code != ErrorCode::not_found &&
        code != ErrorCode::invalid_argument) {
      return error(step.error());  // the meshes, not the checkpoint
    }
    skipped.push_back(it->string() + " (" + step.error().message() + ")");
  }
  std::string why = "resume: no complete checkpoint under " + root.string();
  for (const std::string& s : skipped) why += (s == skipped.front() ? ": " : "; ") + s;
  return error(ErrorCode::not_found, why + " (run without --resume to start afresh)");
}

Result<size_t> Job::resume_from(const fs::path& dir) {
  std::ifstream in(dir / "manifest.json");
  json manifest = json::parse(in, nullptr, false);
  auto unsigned_at = [&](const char* key) { return manifest.contains(key) && manifest[key].is_number_unsigned(); };
  bool valid = !manifest.is_discarded() && manifest.is_object() && unsigned_at("step") && unsigned_at("consumed_low") &&
               manifest.contains("consumed") && manifest["consumed"].is_array();
  for (size_t i = 0; valid && i < manifest["consumed"].size(); ++i) {
    valid = manifest["consumed"][i].is_number_unsigned();
  }
  if (!valid) return error(ErrorCode::malformed, (dir / "manifest.json").string() + " is not a manifest");
  if (manifest.value("config", std::string()) != text_) {
    say("warning: the config differs from the checkpoint's; resuming with the new one");
  }
  const std::string state = (dir / "trainer.safetensors").string();
  const std::string reference = (dir / "reference.safetensors").string();
  for (size_t r = 0; r < meshes_.trainers->size(); ++r) {
    auto loaded = meshes_.trainers->member(r).ask(trainer::LoadTrainerState{state, reference}, timeout_).get();
    if (!loaded) return error(loaded.error().code(), "resume: " + loaded.error().message());
  }
  auto infos = trainer_infos();
  if (!infos) return error(infos.error().code(), "resume: " + infos.error().message());
  optimizer_steps_ = (*infos)[0].optimizer_steps;
  const size_t step = manifest["step"].get<size_t>();
  consumed_low_ = manifest["consumed_low"].get<uint64_t>();
  consumed_.clear();
  for (const json& g : manifest["consumed"]) consumed_.insert(g.get<uint64_t>());
  return step;
}

void Job::requeue(uint64_t group) {
  {
    std::lock_guard lock(failures_mu_);
    if (++group_failures_[group] >= kMaxGroupFailures && fatal_.empty()) {
      fatal_ = "group " + std::to_string(group) + " failed " + std::to_string(kMaxGroupFailures) +
               " times (see the faults above): a mesh is down for good";
      has_fatal_ = true;
    }
  }
  if (has_fatal_) {
    buffer_->notify();  // the driver's thread stops the job
    return;
  }
  queue_->requeue(group);
}

void Job::feed() {
  const size_t G = c_.algorithm.group_size;
  while (auto g = queue_->next()) {
    if (env_) {
      const auto started = Clock::now();
      auto played = play({*g}, G, [this](uint64_t e) { return tasks::group_seed(c_, e); }, -1, queue_->min_version(*g));
      if (!played) {
        fault("episode group " + std::to_string(*g) + " failed: " + played.error().message(), "group requeued",
              seconds_since(started));
        requeue(*g);
        continue;
      }
      GroupRecord rec;
      rec.index = *g;
      rec.prompt = tasks::prompt_tokens(env_->first(*g));
      for (auto& p : (*played)[0]) {
        rec.samples.push_back(std::move(p.sample));
        rec.masks.push_back(std::move(p.mask));
        rec.rewards.push_back(p.reward);
      }
      rec.generated_at_s = rec.scored_at_s = now_s();
      buffer_->push(std::move(rec));
      continue;
    }
    const auto prompt = tasks::rl_prompt(c_, *g);
    rollout::PromptGroup group{*g, tasks::prompt_tokens(prompt.prompt), static_cast<uint32_t>(G),
                               tasks::group_seed(c_, *g)};
    const auto started = Clock::now();
    auto gen = meshes_.engines->choose(rollout::Generate{{group}, queue_->min_version(*g), -1}, timeout_).get();
    if (!gen || gen->size() != 1) {
      fault("generation of group " + std::to_string(*g) + " failed: " +
                (gen ? std::string("wrong reply") : gen.error().message()),
            "group requeued", seconds_since(started));
      requeue(*g);
      continue;
    }
    GroupRecord rec;
    rec.index = *g;
    rec.prompt = group.prompt;
    rec.samples = std::move((*gen)[0].samples);
    rec.generated_at_s = now_s();
    reward::Score score;
    for (const auto& s : rec.samples) score.items.push_back({prompt.reference, s.tokens, s.stop});
    Result<std::vector<double>> rewards = error(ErrorCode::timeout, "not scored");
    for (int attempt = 0; attempt < 3 && !rewards; ++attempt) {
      rewards = meshes_.rewards->choose(score, timeout_).get();
      if (!rewards) {
        fault("scoring group " + std::to_string(*g) + " failed: " + rewards.error().message(),
              attempt < 2 ? "scored again" : "group requeued", 0);
      }
    }
    if (!rewards || rewards->size() != rec.samples.size()) {
      requeue(*g);
      continue;
    }
    rec.rewards = std::move(*rewards);
    rec.scored_at_s = now_s();
    buffer_->push(std::move(rec));
  }
}

Result<JobResult> Job::run() {
  std::error_code ec;
  fs::create_directories(options_.run_dir, ec);
  if (ec) {
    return error(ErrorCode::storage, "rl job: cannot create the run directory '" + options_.run_dir +
                                         "': " + ec.message() + " (give a writable --run-dir)");
  }
  auto opened = MetricsLog::open((fs::path(options_.run_dir) / "metrics.jsonl").string());
  if (!opened) return error(opened.error());
  log_ = std::move(*opened);
  JobResult result;
  result.metrics_path = log_->path();

  say("starting the meshes: " + std::to_string(c_.trainer.ranks) + " trainer rank(s), " +
      std::to_string(c_.rollout.engines) + " rollout engine(s), " + std::to_string(c_.reward.workers) +
      " reward worker(s), " + (c_.run.placement == config::Placement::colocated ? "colocated" : "disaggregated"));
  auto meshes = start_meshes(rt_, cluster_, c_, text_, inbox_);
  if (!meshes) return error(meshes.error());
  meshes_ = std::move(*meshes);
  struct Cleanup {
    Job* job;
    ~Cleanup() { stop_meshes(job->cluster_, job->meshes_); }
  } cleanup{this};

  if (c_.trainer.device != config::TrainerConfig::Device::cpu) {
    auto infos = trainer_infos();
    if (!infos) return error(infos.error());
    for (size_t r = 0; r < infos->size(); ++r) say("trainer rank " + std::to_string(r) + " on " + (*infos)[r].device);
  }
  if (c_.rollout.device != config::Device::cpu) {
    for (size_t e = 0; e < meshes_.engines->size(); ++e) {
      auto r = meshes_.engines->member(e).ask(rollout::GetEngineReport{}, timeout_).get();
      if (!r) return error(r.error().code(), "rl job: rollout engine " + std::to_string(e) + ": " + r.error().message());
      say("rollout engine " + std::to_string(e) + " on " + r->device);
    }
  }
  if (noted_fault_) fault(noted_fault_->first, noted_fault_->second, 0);
  log({{"event", "run"},
       {"run_id", c_.run.name},
       {"mode", c_.run.mode == config::Mode::sync ? "sync" : "async"},
       {"placement", c_.run.placement == config::Placement::colocated ? "colocated" : "disaggregated"},
       {"algorithm", json::parse(config::rl_config_json(c_))["algorithm"]["name"]},
       {"config", json::parse(config::rl_config_json(c_))}});

  rl_phase_ = c_.model.init != config::ModelInit::warmup || c_.warmup.steps == 0;
  size_t first_step = 0;
  if (options_.resume) {
    rl_phase_ = true;
    auto s = resume();
    if (!s) return error(s.error());
    first_step = *s;
  }
  // ZeRO-1 in memory: the starting state (or the resumed one), in two places.
  if (Status s = snapshot_shards(); !s.ok()) return error(s.code(), "the first shard snapshots: " + s.message());
  if (!options_.resume && c_.model.init == config::ModelInit::warmup && c_.warmup.steps > 0) {
    if (Status s = warmup(); !s.ok()) return error(s);
  }
  step_ = first_step;

  const uint64_t P = c_.algorithm.prompts_per_step;
  const size_t S = c_.run.max_staleness;
  // Groups trained before a resume (below its low-water mark, or past it
  // in consumed_) are not generated again.
  queue_ = std::make_unique<GroupQueue>(P, S, consumed_low_, c_.run.steps * P, consumed_);
  buffer_ = std::make_unique<ReplayBuffer>((S + 2) * P + 1, [this](uint64_t g) { queue_->requeue(g); });
  inbox_->set_wake([this] { buffer_->notify(); });

  json timing;
  if (Status s = publish_and_sync(first_step, timing); !s.ok()) return error(s);
  {
    auto acc = evaluate(first_step);
    if (!acc) return error(acc.error());
    result.evals.emplace_back(first_step, *acc);
    log({{"event", "eval"}, {"step", first_step}, {"accuracy", *acc}, {"problems", c_.task.eval_problems}});
    say("step " + std::to_string(first_step) + "  held-out accuracy " + fixed(100 * *acc, 1) + "%");
  }

  const size_t feeders = c_.rollout.engines * c_.rollout.groups_in_flight;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < feeders; ++i) threads.emplace_back([this] { feed(); });
  struct Joiner {
    Job* job;
    std::vector<std::thread>& threads;
    ~Joiner() {
      job->queue_->stop();
      job->buffer_->stop();
      for (auto& t : threads) t.join();
    }
  } joiner{this, threads};

  const size_t G = c_.algorithm.group_size;
  for (size_t step = first_step; step < c_.run.steps; ++step) {
    step_ = step;
    const auto step_start = Clock::now();
    const double step_start_s = now_s();
    // A step's groups, handling faults while waiting.
    std::optional<ReplayBuffer::Taken> taken;
    size_t stale = 0;
    double waited = 0;
    for (;;) {
      if (Status s = handle_faults(); !s.ok()) return error(s);
      taken = buffer_->take(P, step, S, [this] { return inbox_->pending() || has_fatal_; });
      if (!taken) return error(ErrorCode::shutting_down, "rl job: stopped");
      if (has_fatal_) {
        std::lock_guard lock(failures_mu_);
        return error(ErrorCode::peer_lost, "rl job: step " + std::to_string(step) + ": " + fatal_ +
                                               " (fix it, then continue with --resume)");
      }
      stale += taken->stale.size();
      waited += taken->waited_s;
      if (taken->groups.size() == P) break;
    }
    // Advantages, and the sequences that carry a signal.
    std::vector<trainer::WireSequence> seqs;
    double reward_sum = 0, reward_sq = 0, gen_done = 0, scored = 0;
    uint64_t staleness_max = 0;
    double staleness_sum = 0;
    size_t samples = 0, sample_tokens = 0;
    const auto algorithm = c_.algorithm.name;
    for (auto& rec : taken->groups) {
      auto adv = algorithm == config::Algorithm::rloo
                     ? algo::rloo_advantages(rec.rewards, G)
                     : algo::group_advantages(rec.rewards, G, {.scale_by_std = c_.algorithm.normalize_std});
      if (!adv) return error(adv.error());
      for (size_t i = 0; i < rec.samples.size(); ++i) {
        const double r = rec.rewards[i];
        reward_sum += r;
        reward_sq += r * r;
        ++samples;
        // The model's tokens (a multi-turn episode's observations are not).
        sample_tokens += rec.masks.empty() ? rec.samples[i].tokens.size()
                                           : static_cast<size_t>(std::count(rec.masks[i].begin(), rec.masks[i].end(), 1));
        const uint64_t st = step - std::min<uint64_t>(step, rec.samples[i].version_first);
        staleness_max = std::max(staleness_max, st);
        staleness_sum += static_cast<double>(st);
        if (rec.samples[i].tokens.empty()) continue;
        // A critic learns from every sample; critic-free advantages of a
        // group that scored all the same are zero (no signal).
        if (algorithm != config::Algorithm::ppo && (*adv)[i] == 0.0) continue;
        seqs.push_back({rec.prompt, rec.samples[i].tokens, rec.samples[i].logprobs, (*adv)[i], r,
                        rec.masks.empty() ? std::vector<uint8_t>{} : rec.masks[i], {}});
      }
      gen_done = std::max(gen_done, rec.generated_at_s);
      scored = std::max(scored, rec.scored_at_s);
      consumed_.insert(rec.index);
    }
    while (consumed_.count(consumed_low_)) consumed_.erase(consumed_low_++);
    const auto train_start = Clock::now();
    auto st = train_updates(std::move(seqs));
    if (!st) {
      return error(st.error().code(), "rl job: step " + std::to_string(step) + ": " + st.error().message() +
                                          " (resume from the last checkpoint with --resume)");
    }
    const double train_s = seconds_since(train_start);
    json t;
    if (Status s = publish_and_sync(step + 1, t); !s.ok()) return error(s);
    const double step_s = seconds_since(step_start);
    const double mean = reward_sum / static_cast<double>(samples);
    const double var = std::max(0.0, reward_sq / static_cast<double>(samples) - mean * mean);
    json time_s;
    if (c_.run.mode == config::Mode::sync) {
      // On the critical path: generation until the last group was
      // generated, then the scoring that had not overlapped it.
      time_s["generation"] = std::max(0.0, gen_done - step_start_s);
      time_s["reward"] = std::max(0.0, scored - std::max(gen_done, step_start_s));
      time_s["wait"] = 0.0;
    } else {
      time_s["generation"] = 0.0;
      time_s["reward"] = 0.0;
      time_s["wait"] = waited;  // the trainer waiting for generated groups
    }
    time_s["train"] = train_s;
    time_s["sync"] = t["sync"];
    json line = {{"event", "step"},
                 {"step", step + 1},
                 {"version", step + 1},
                 {"reward_mean", mean},
                 {"reward_std", std::sqrt(var)},
                 {"samples", samples},
                 {"tokens", sample_tokens},
                 {"tokens_per_s", static_cast<double>(sample_tokens) / step_s},
                 {"trained_sequences", st->sequences},
                 {"updates", st->updates},
                 {"staleness_mean", staleness_sum / static_cast<double>(samples)},
                 {"staleness_max", staleness_max},
                 {"dropped_stale", stale},
                 {"time_s", time_s},
                 {"step_s", step_s},
                 {"sync_gbps", t["sync_gbps"]},
                 {"synced_into_device", t["synced_into_device"]},
                 {"synced_from_device", t["synced_from_device"]}};
    if (st->trained) {
      line.update({{"loss", st->loss},
                   {"grad_norm", st->grad_norm},
                   {"learning_rate", st->learning_rate},
                   {"kl", st->kl},
                   {"clip_fraction", st->clip_fraction},
                   {"allreduce_s", st->allreduce_s}});
      if (algorithm == config::Algorithm::ppo) {
        line.update({{"value_loss", st->value_loss}, {"explained_variance", st->explained_variance}});
      }
      if (c_.algorithm.loss.entropy_coef > 0) line["entropy"] = st->entropy;  // computed only then
    }
    log(line);
    result.steps = step + 1 - first_step;
    std::string progress = "step " + std::to_string(step + 1) + "/" + std::to_string(c_.run.steps) + "  reward " +
                           fixed(mean, 2) + "  " + fixed(static_cast<double>(sample_tokens) / step_s, 0) +
                           " tok/s  gen " + fixed(time_s["generation"].get<double>(), 2) + "s  reward " +
                           fixed(time_s["reward"].get<double>(), 2) + "s  wait " +
                           fixed(time_s["wait"].get<double>(), 2) + "s  train " + fixed(train_s, 2) + "s  sync " +
                           fixed(t["sync"].get<double>(), 3) + "s";
    if ((step + 1) % c_.run.eval_every == 0 || step + 1 == c_.run.steps) {
      auto acc = evaluate(step + 1);
      if (acc) {
        result.evals.emplace_back(step + 1, *acc);
        log({{"event", "eval"}, {"step", step + 1}, {"accuracy", *acc}, {"problems", c_.task.eval_problems}});
        progress += "  held-out accuracy " + fixed(100 * *acc, 1) + "%";
      } else {
        fault(acc.error().message(), "evaluation skipped", 0);
      }
    }
    say(progress);
    if ((c_.run.checkpoint_every > 0 && (step + 1) % c_.run.checkpoint_every == 0) || step + 1 == c_.run.steps) {
      if (Status s = checkpoint(step + 1); !s.ok()) say("warning: " + s.message() + " (training goes on)");
    }
    step_ = step + 1;
    if (options_.after_step) options_.after_step(step + 1, Probe(*this));
  }
  result.wall_seconds = now_s();
  result.faults = faults_;
  log({{"event", "end"},
       {"step", c_.run.steps},
       {"status", "ok"},
       {"final_accuracy", result.evals.empty() ? 0.0 : result.evals.back().second}});
  return result;
}

/// True when `run_dir` holds a complete checkpoint (one with a manifest).
bool has_checkpoint(const std::string& run_dir) { return !complete_checkpoints(run_dir).empty(); }

}  // namespace

Result<JobResult> run_rl_job(Runtime& runtime, const ClusterClient& cluster, const std::string& config_text,
                             const JobOptions& options) {
  auto c = config::parse_rl_config(config_text, "config");
  if (!c) return error(c.error());
  if (options.run_dir.empty()) return error(ErrorCode::invalid_argument, "rl job: no run directory given");
  JobOptions now = options;
  std::string lost;  // why the last attempt went back to a checkpoint
  size_t faults = 0;
  for (int attempt = 0;; ++attempt) {
    Job job(runtime, cluster, *c, config_text, now);
    if (!lost.empty()) job.note_fault(lost, "went back to the last checkpoint (new meshes, --resume)");
    auto r = job.run();
    if (r) {
      r->faults += faults;
      return r;
    }
    // A state no survivor holds (a lost optimizer shard, or every rank
    // restarted) is recovered this way, from the run directory's last
    // checkpoint, twice at most; anything else is the caller's to see.
    if (!job.resume_from_checkpoint() || attempt == 2 || !has_checkpoint(now.run_dir)) {
      if (job.resume_from_checkpoint() && !has_checkpoint(now.run_dir)) {
        return error(r.error().code(), r.error().message() + "; there is no checkpoint to go back to yet "
                                                               "(they are written every run.checkpoint_every RL "
                                                               "steps): run again");
      }
      return r;
    }
    lost = r.error().message();
    faults += job.faults();  // the loss itself is the next attempt's (note_fault)
    now.resume = true;
  }
}

}  // namespace troupe::rl::controller
