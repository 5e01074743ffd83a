// A generation engine of the rollout mesh: a copy of the policy's weights
// with a version, a KV cache of `rollout.max_sequences` slots (on the CPU,
// or on a GPU with `rollout.device = "cuda"`: model/decoder.h), and a decode
// loop with continuous batching: the engine runs one step at a time (one
// token for every live sequence, a whole prompt for a new one), and the
// messages that arrive in between, new prompt groups and new weights, take
// effect at the next step. A group's reply carries, for each sample, the
// tokens, the model's log-probability of each, and the weight versions it
// was generated with.
//
// New weights arrive as a handle to the trainer's published buffer
// (trainer_rank.h): the engine reads them with one-sided reads, in buckets,
// several in flight, into a second copy of the model while it keeps
// decoding with the first; once all is in, it switches between two steps.
// A trainer resident on this engine's device sends where its parameters are
// there too: the engine then copies them device to device into its
// decoder's standby (the trainer's process, or another by CUDA IPC) and
// switches the same way.
// Sequences in flight then go on with the new weights (their cached keys
// and values are recomputed: a partial rollout); each sample records the
// first and last version that produced its tokens.
//
// A group asks for weights of at least `min_version`: it waits in the
// queue until the engine has them (an engine that has just restarted has
// none until the driver syncs it).
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <troupe/remote_buffer.h>
#include <troupe/troupe.h>

#include "config/rl_config.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "model/decoder.h"
#include "model/sampler.h"
#include "trainer/trainer_rank.h"

namespace troupe::rl::rollout {

/// No weights yet (a new or restarted engine).
inline constexpr uint64_t kNoVersion = std::numeric_limits<uint64_t>::max();

/// `samples` continuations of one prompt; sample i draws from the random
/// stream (seed, i), so what a sample is does not depend on the engine or
/// the batch it ran in.
struct PromptGroup {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  uint32_t samples = 1;
  uint64_t seed = 0;
  TROUPE_FIELDS(id, prompt, samples, seed);
};

/// Generates the groups (the reply comes when all are done). `temperature`
/// < 0: the job's sampling settings; 0: greedy (evaluation).
struct Generate {
  std::vector<PromptGroup> groups;
  uint64_t min_version = 0;
  double temperature = -1;
  TROUPE_MESSAGE_NAMED(Generate, "troupe.rl.Generate", groups, min_version, temperature);
};

/// One continuation.
struct Sample {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  /// model::StopReason.
  uint8_t stop = 0;
  /// The weight versions of its first and last token.
  uint64_t version_first = 0, version_last = 0;
  TROUPE_FIELDS(tokens, logprobs, stop, version_first, version_last);
};

/// A group's samples, in sample order.
struct GroupSamples {
  uint64_t id = 0;
  std::vector<Sample> samples;
  TROUPE_FIELDS(id, samples);
};

/// Takes new weights from a trainer's published buffer, or, where they
/// come with the trainer's device parameters on this engine's device
/// (PublishedWeights::device), by a device-to-device copy into the
/// decoder's standby (CUDA IPC from another process on the same GPU).
struct SyncWeights {
  trainer::PublishedWeights weights;
  TROUPE_MESSAGE_NAMED(SyncWeights, "troupe.rl.SyncWeights", weights);
};

/// rollout.weight_sync = "broadcast": takes new weights as `version` from
/// the weight-sync group's broadcast (trainer::JoinWeightSyncGroup; trainer
/// rank 0 sends them with BroadcastWeights) into the standby copy, while
/// the engine keeps decoding with the other, then switches as SyncWeights
/// does. With config::device_weight_broadcast the standby is the device
/// decoder's own (Decoder::standby_weights): trainer rank 0's device sends
/// its parameters there (NCCL between GPUs), and nothing crosses the host. Errors, with the engine's weights unchanged:
/// not in that group (it restarted since), a sync in progress, the broadcast failed (an engine or the trainer gone, the
/// group's deadline, a root with another model's size: the group's ranks disagree).
struct ReceiveWeights {
  uint64_t version = 0;
  std::string group;
  TROUPE_MESSAGE_NAMED(ReceiveWeights, "troupe.rl.ReceiveWeights", version, group);
};

/// What a sync did.
struct SyncReport {
  uint64_t version = 0;
  uint64_t bytes = 0;
  /// From the message's arrival to the switch.
  double seconds = 0;
  /// Sequences in flight that went on with the new weights.
  uint32_t interrupted = 0;
  /// The weights went straight into the decoder's standby
  /// (config::device_weight_broadcast: NCCL between GPUs), no host copy.
  bool into_device = false;
  /// Why a copy from the trainer's device parameters (PublishedWeights::
  /// device, on this engine's device) failed, so that the sync read the
  /// buffer instead; empty when it did not fail.
  std::string device_copy_failed;
  TROUPE_FIELDS(version, bytes, seconds, interrupted, into_device, device_copy_failed);
};

/// The engine's counters.
struct EngineReport {
  uint64_t version = kNoVersion;
  uint32_t live = 0, queued = 0;
  uint64_t tokens_generated = 0, decode_steps = 0;
  /// Seconds spent in decode steps since the engine started.
  double busy_seconds = 0;
  int64_t pid = 0;
  /// FNV-1a over the weights in use (equal to the publisher's TrainerInfo
  /// checksum when the engine has its weights).
  uint64_t checksum = 0;
  /// Where it decodes (Decoder::describe): "cpu", "cuda:0 NVIDIA H100 ...".
  std::string device;
  TROUPE_FIELDS(version, live, queued, tokens_generated, decode_steps, busy_seconds, pid, checksum, device);
};
struct GetEngineReport {
  TROUPE_MESSAGE_NAMED(GetEngineReport, "troupe.rl.GetEngineReport");
};

/// Internal: the engine's next decode step.
struct EngineTick {
  TROUPE_MESSAGE_NAMED(EngineTick, "troupe.rl.EngineTick");
};

/// The actor.
class RolloutEngine : public Actor<RolloutEngine, Generate, SyncWeights, trainer::JoinWeightSyncGroup, ReceiveWeights,
                                   GetEngineReport, EngineTick> {
 public:
  /// An engine of the job configured by `config_toml` (rl_config.h).
  explicit RolloutEngine(std::string config_toml);

  Deferred<std::vector<GroupSamples>> handle(const Generate& m);
  Deferred<SyncReport> handle(const SyncWeights& m);
  void handle(const trainer::JoinWeightSyncGroup& m);
  Deferred<SyncReport> handle(const ReceiveWeights& m);
  /// Errors: a device decoder's weights could not be read back (checksum).
  Result<EngineReport> handle(const GetEngineReport& m);
  void handle(const EngineTick& m);

 private:
  // One request's groups, answered when the last sample is done.
  struct Request {
    Deferred<std::vector<GroupSamples>> reply;
    std::vector<GroupSamples> groups;
    size_t left = 0;
    uint64_t min_version = 0;
    model::SamplingParams sampling;
  };
  // One sequence being generated.
  struct Sequence {
    std::shared_ptr<Request> request;
    size_t group = 0, sample = 0;
    std::vector<int32_t> prompt;
    model::SampleRng rng;
    uint32_t slot = 0;
    // Tokens of prompt + sample already in the cache.
    size_t fed = 0;
  };

  void schedule_tick();
  // Moves queued sequences whose version is met into free slots.
  void admit();
  void finish(Sequence& s, model::StopReason why);
  // Decodes with the standby copy from now on: the host's (standby_), or
  // with `in_decoder` the decoder's own (a device broadcast filled it).
  // Errors: the decoder could not take the weights (a device's copy
  // failed); nothing changed.
  Status switch_weights(uint64_t version, bool in_decoder = false);
  // A sync in progress: its reads of the published buffer, in buckets.
  struct SyncState;
  void pump(const std::shared_ptr<SyncState>& st);

  config::RlConfig config_;
  std::shared_ptr<model::Gpt<float>> active_, standby_;
  // active_ holds the weights the decoder runs (false after a device
  // broadcast: they are in the decoder alone).
  bool host_current_ = true;
  uint64_t version_ = kNoVersion;
  // Shared: a collective writing into its standby keeps it alive.
  std::shared_ptr<model::Decoder> decoder_;
  // config::device_weight_broadcast: broadcasts go into the decoder.
  bool broadcast_into_decoder_ = false;
  std::deque<Sequence> queued_;
  std::vector<Sequence> live_;
  std::vector<uint32_t> free_slots_;
  bool tick_scheduled_ = false;
  bool syncing_ = false;
  // rollout.weight_sync = "broadcast": the group the weights come over.
  std::optional<CollectiveGroup> sync_group_;
  // Scratch of a step (kept: no allocation per decode step).
  std::vector<model::DecodeRow> rows_;
  std::vector<size_t> last_row_;
  std::vector<Sequence> still_;
  std::vector<float> logits_, scratch_;
  std::vector<int32_t> order_;
  EngineReport report_;
};

}  // namespace troupe::rl::rollout
