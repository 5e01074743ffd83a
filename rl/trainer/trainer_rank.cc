#include "trainer/trainer_rank.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <span>
#include <stdexcept>

#include <unistd.h>

#include "model/safetensors.h"
#include "model/threads.h"
#include "model/tokenizer.h"
#include "tasks/draw.h"
#include "train/batch.h"

namespace troupe::rl::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

model::Gpt<float> initial_model(const config::RlConfig& c) {
  auto gpt = model::Gpt<float>::make(c.trainer_shape());
  if (!gpt) throw std::runtime_error("trainer: " + gpt.error().message());
  gpt->init_random(c.run.seed);  // a value head starts at zero
  if (c.model.init == config::ModelInit::checkpoint) {
    // A policy's checkpoint: its tensors fill the policy part of the
    // layout (a critic's head keeps its zeros).
    auto policy = model::ParamLayout::make(c.model.shape);
    if (Status s = model::load_model(c.model.checkpoint, *policy, gpt->params()); !s.ok()) {
      throw std::runtime_error("trainer: " + s.message());
    }
  }
  return std::move(*gpt);
}

model::AdamWConfig optim_for(const config::RlConfig& c) {
  // The warm-up's optimizer trains first; a job without one starts with
  // the RL optimizer (a warm-up's end resets to it: see TrainStep).
  return c.model.init == config::ModelInit::warmup && c.warmup.steps > 0 ? c.warmup.optim : c.algorithm.optim;
}

/// Rank `rank` of `ranks`'s segment of `count` elements: the segment the
/// mesh's reduce_scatter leaves reduced on it (collective_group.h).
model::ParamRange segment_of(size_t count, size_t rank, size_t ranks) {
  const size_t q = count / ranks, rest = count % ranks;
  const size_t begin = rank * q + std::min(rank, rest);
  return {begin, begin + q + (rank < rest ? 1 : 0)};
}

Result<train::TrainBatch> wire_batch(const std::vector<WireSequence>& wire, size_t context_length) {
  std::vector<train::TrainSequence> seqs;
  seqs.reserve(wire.size());
  for (const auto& w : wire) seqs.push_back({w.prompt, w.completion, w.logprobs, w.advantage, w.mask, w.values});
  return train::make_train_batch(seqs, context_length, model::ByteTokenizer::kPad);
}

}  // namespace

TrainerRank::TrainerRank(std::string config_toml) : config_(config::job_config_or_throw(config_toml, "trainer")) {
  model::set_compute_threads(config_.trainer.threads);
  // On the first device until the rank is known (JoinTrainerGroup): a
  // process that cannot run the CUDA model fails here, before the job starts.
  device_ = make_device(0);
  // ZeRO-1: no moments until the rank knows its segment (JoinTrainerGroup),
  // rather than the whole model's for a while.
  if (config_.trainer.shard_optimizer && config_.trainer.ranks >= 2) shard_ = model::ParamRange{0, 0};
  make_trainer(initial_model(config_), optim_for(config_));
  rl_phase_ = !(config_.model.init == config::ModelInit::warmup && config_.warmup.steps > 0);
}

std::unique_ptr<model::DeviceModel> TrainerRank::make_device(size_t rank) const {
  if (config_.trainer.device == config::TrainerConfig::Device::cpu) return nullptr;
  auto dev = model::make_device_model(config_.trainer_shape(), {.kind = device_kind(),
                                                                 .device = -1,
                                                                 .rank = rank,
                                                                 .precision = config_.trainer.precision});
  if (!dev) {
    throw std::runtime_error(std::string("trainer: 'trainer.device' \"") +
                             (device_kind() == model::DeviceKind::host ? "host" : "cuda") +
                             "\": " + dev.error().message());
  }
  return std::move(*dev);
}

size_t TrainerRank::optimizer_floats() const {
  // Without copying a resident device's moments out: the optimizer's range.
  return shard_ ? shard_->end - shard_->begin : trainer_->layout().total();
}

model::DeviceKind TrainerRank::device_kind() const {
  return config_.trainer.device == config::TrainerConfig::Device::host ? model::DeviceKind::host
                                                                       : model::DeviceKind::cuda;
}

void TrainerRank::make_trainer(model::Gpt<float> weights, const model::AdamWConfig& optim) {
  trainer_.reset();  // the old trainer's buffers go before the new one's come
  trainer_.emplace(std::move(weights), optim, shard_, device_.get());
}

void TrainerRank::handle(const JoinTrainerGroup& m) {
  group_ = m.group;
  if (device_ != nullptr &&
      static_cast<int>(m.group.rank % static_cast<size_t>(std::max(1, device_->devices_seen()))) != device_->device()) {
    auto dev = make_device(m.group.rank);
    {
      // The trainer points at device_: swap it in place of the old one.
      reference_device_.reset();
      model::Gpt<float> weights = std::move(trainer_->edit_model());
      auto& old = trainer_->optimizer();
      std::vector<float> m_all = old.m(), v_all = old.v();
      const size_t steps = old.steps();
      const model::AdamWConfig optim = optim_now();
      trainer_.reset();
      device_ = std::move(dev);
      make_trainer(std::move(weights), optim);
      if (Status s = trainer_->edit_optimizer().restore(std::move(m_all), std::move(v_all), steps); !s.ok()) {
        fail(s.message());
      }
    }
  }
  if (!config_.trainer.shard_optimizer || m.group.size < 2) return;
  // ZeRO-1: keep the optimizer state of this rank's segment only.
  const auto range = segment_of(trainer_->layout().total(), m.group.rank, m.group.size);
  const auto now = trainer_->optimizer().range();
  if (shard_ && now.begin == range.begin && now.end == range.end) return;
  if (shard_ && shard_->begin == shard_->end && trainer_->optimizer().steps() == 0) {
    // The first group: the segment's moments start at zero.
    shard_ = range;
    make_trainer(std::move(trainer_->edit_model()), optim_now());
    return;
  }
  if (shard_) {
    fail("trainer: a new group moves this rank's optimizer shard; its state is not here (resume from a checkpoint)");
  }
  shard_ = range;
  auto& old = trainer_->optimizer();
  std::vector<float> m_all = old.m(), v_all = old.v();
  const size_t steps = old.steps();
  make_trainer(std::move(trainer_->edit_model()), optim_now());
  if (Status s = trainer_->edit_optimizer().restore(std::move(m_all), std::move(v_all), steps); !s.ok()) fail(s.message());
}

model::AdamWConfig TrainerRank::optim_now() const { return rl_phase_ ? config_.algorithm.optim : optim_for(config_); }

void TrainerRank::collective(CollectiveKind kind, void* data, size_t count, DType dtype, const char* what,
                             std::function<void(Status)> then) {
  Collective c{group_->id, group_->rank, data, count, dtype, ReduceOp::sum, kind};
  ask<void>(group_->engine(self()), c).then([this, what, then = std::move(then)](Result<void> r) mutable {
    if (r) return then(Status());
    then(Status(r.error().code(), "trainer rank " + std::to_string(group_ ? group_->rank : 0) + ": " + what +
                                      " failed: " + r.error().message()));
  });
}

Deferred<RankStepStats> TrainerRank::handle(const TrainStep& m) {
  auto reply = defer<RankStepStats>();
  const auto start = Clock::now();
  if (trainer_->optimizer_steps() != m.expected_steps || rl_phase_ != m.rl_phase) {
    reply.fail(Status(ErrorCode::invalid_argument,
                      "trainer rank " + std::to_string(group_ ? group_->rank : 0) + ": its state (" +
                          (rl_phase_ ? "rl" : "warm-up") + " phase, " +
                          std::to_string(trainer_->optimizer_steps()) + " optimizer steps) is not the job's (" +
                          (m.rl_phase ? "rl" : "warm-up") + ", " + std::to_string(m.expected_steps) +
                          "): it restarted and must take a survivor's state"));
    return reply;
  }
  train::StepStats st;
  if (m.sequences.empty()) {
    if (Status s = trainer_->zero_gradients(); !s.ok()) {
      reply.fail(s);
      return reply;
    }
  } else {
    auto batch = wire_batch(m.sequences, config_.model.shape.context_length);
    if (!batch) {
      reply.fail(batch.error());
      return reply;
    }
    Result<train::StepStats> r = train::StepStats{};
    if (m.supervised) {
      r = trainer_->supervised_gradients(*batch, m.grad_scale);
    } else {
      const float* ref = nullptr;
      if (config_.algorithm.loss.kl_coef > 0) {
        if (Status s = reference_logprobs(*batch); !s.ok()) {
          reply.fail(s);
          return reply;
        }
        ref = ref_logprobs_.data();
      }
      if (config_.algorithm.name == config::Algorithm::ppo) {
        std::vector<double> rewards;
        for (const auto& w : m.sequences) rewards.push_back(w.reward);
        const auto& a = config_.algorithm;
        train::PpoConfig ppo{.gae = {.gamma = a.gamma, .lambda = a.lambda},
                             .value = {.value_clip = a.value_clip, .aggregation = a.loss.aggregation},
                             .value_coef = a.value_coef};
        r = trainer_->ppo_gradients(*batch, rewards, a.loss, ppo, ref, m.grad_scale);
      } else {
        r = trainer_->policy_gradients(*batch, config_.algorithm.loss, ref, m.grad_scale);
      }
    }
    if (!r) {
      reply.fail(r.error());
      return reply;
    }
    st = *r;
  }
  RankStepStats out;
  out.loss = st.loss;
  out.completion_tokens = st.completion_tokens;
  out.clip_fraction = st.policy.clip_fraction;
  out.ratio_mean = st.policy.ratio_mean;
  out.kl = st.policy.kl;
  out.entropy = st.policy.entropy;
  out.value_loss = st.value.loss;
  out.explained_variance = st.value.explained_variance;
  out.compute_seconds = seconds_since(start);

  auto finish = [this, reply, out, st](Clock::time_point reduce_start) mutable {
    out.allreduce_seconds = seconds_since(reduce_start);
    if (Status s = trainer_->apply_gradients(st); !s.ok()) return reply.fail(s);
    out.grad_norm = st.grad_norm;
    out.learning_rate = st.learning_rate;
    reply.complete(out);
  };
  if (config_.trainer.ranks == 1) {
    finish(Clock::now());
    return reply;
  }
  if (!group_) {
    reply.fail(Status(ErrorCode::invalid_argument,
                      "trainer rank " + std::to_string(group_ ? group_->rank : 0) + ": no collective group yet (send JoinTrainerGroup)"));
    return reply;
  }
  const size_t n = trainer_->layout().total();
  const auto reduce_start = Clock::now();
  if (shard_) {
    sharded_step(reply, out, st, m.snapshot, reduce_start);
    return reply;
  }
  // On a resident device, its gradients in place: the engine takes NCCL
  // for CUDA memory.
  auto grads = trainer_->gradients();
  if (!grads) {
    reply.fail(grads.error());
    return reply;
  }
  collective(CollectiveKind::allreduce, *grads, n, DType::float32, "gradient allreduce",
             [finish, reduce_start, reply](Status s) mutable {
               if (!s.ok()) return reply.fail(s);
               finish(reduce_start);
             });
  return reply;
}

Result<std::vector<std::vector<float>>> TrainerRank::handle(const ScoreValues& m) {
  std::vector<std::vector<float>> out;
  if (m.sequences.empty()) return out;
  auto batch = wire_batch(m.sequences, config_.model.shape.context_length);
  if (!batch) return error(batch.error());
  auto values = trainer_->values(*batch);
  if (!values) return error(values.error());
  // Completion token k of sequence i is predicted at position
  // prompt.size() - 1 + k of row i (train/batch.h).
  for (size_t i = 0; i < m.sequences.size(); ++i) {
    const auto& w = m.sequences[i];
    const float* row = values->data() + i * batch->T + (w.prompt.size() - 1);
    out.emplace_back(row, row + w.completion.size());
  }
  return out;
}

void TrainerRank::sharded_step(Deferred<RankStepStats> reply, RankStepStats out, train::StepStats st, bool snapshot,
                               Clock::time_point reduce_start) {
  // The gradient's sum, each rank's segment only; then the global norm
  // from every rank's part; then each rank's update of its segment; then
  // every segment to every rank. The parts travel as the bits of doubles
  // (an allgather of int32 pairs) and are added in rank order on every
  // rank: the same norm, to the bit, everywhere.
  const size_t n = trainer_->layout().total();
  const size_t ranks = group_->size;
  collective(CollectiveKind::reduce_scatter, trainer_->edit_model().grads(), n, DType::float32,
             "gradient reduce-scatter", [this, reply, out, st, snapshot, reduce_start, n, ranks](Status s) mutable {
               if (!s.ok()) return reply.fail(s);
               norm_parts_.assign(ranks, 0.0);
               norm_parts_[group_->rank] = trainer_->squared_norm();
               collective(CollectiveKind::allgather, norm_parts_.data(), 2 * ranks, DType::int32,
                          "gradient norm allgather", [this, reply, out, st, snapshot, reduce_start, n](Status s) mutable {
                            if (!s.ok()) return reply.fail(s);
                            double sumsq = 0;
                            for (double p : norm_parts_) sumsq += p;
                            trainer_->apply_gradients(st, std::sqrt(sumsq));
                            out.grad_norm = st.grad_norm;
                            out.learning_rate = st.learning_rate;
                            auto done = [this, reply, out, snapshot, reduce_start](Status s) mutable {
                              if (!s.ok()) return reply.fail(s);
                              out.allreduce_seconds = seconds_since(reduce_start);
                              if (snapshot) {
                                auto snap = take_snapshot();
                                if (!snap) return reply.fail(snap.error());
                                out.snapshot.push_back(std::move(*snap));
                              }
                              reply.complete(out);
                            };
                            // A NaN or infinite norm updated nothing, on every rank.
                            if (!std::isfinite(st.grad_norm)) return done(Status());
                            collective(CollectiveKind::allgather, trainer_->edit_model().params(), n, DType::float32,
                                       "parameter allgather", std::move(done));
                          });
             });
}

PublishedWeights TrainerRank::handle(const PublishWeights& m) {
  const size_t n = trainer_->layout().policy_count();
  if (!published_.handle() && config_.rollout.weight_sync == config::WeightSync::broadcast) {
    auto memory = CollectiveBuffer::allocate(n * sizeof(float));
    if (!memory) fail("trainer: cannot allocate the published weights: " + memory.error().message());
    auto reg = register_buffer(memory->data(), n * sizeof(float));
    if (!reg) fail("trainer: cannot register the published weights: " + reg.error().message());
    published_memory_ = std::move(*memory);
    published_ = std::move(*reg);
  } else if (!published_.handle()) {
    auto reg = allocate_buffer(n * sizeof(float));
    if (!reg) fail("trainer: cannot register the published weights: " + reg.error().message());
    published_ = std::move(*reg);
  }
  // From a resident device straight into the registered buffer.
  if (Status s = trainer_->copy_params(static_cast<float*>(published_.data()), n); !s.ok()) {
    fail("trainer: cannot copy the weights to publish: " + s.message());
  }
  PublishedWeights out{published_.handle(), m.version, n, static_cast<int64_t>(::getpid()), {}};
  if (trainer_->resident()) {
    // An engine on the same device copies from there (the same floats: a
    // device model has no value head). Not shared: it reads the buffer.
    auto shared = trainer_->share_params();
    if (shared && shared->floats == n) out.device = std::move(*shared);
  }
  return out;
}

void TrainerRank::handle(const JoinWeightSyncGroup& m) { sync_group_ = m.group; }

Deferred<WeightsBroadcast> TrainerRank::handle(const BroadcastWeights& m) {
  auto reply = defer<WeightsBroadcast>();
  WeightsBroadcast out;
  out.published = handle(PublishWeights{m.version});
  if (!sync_group_ || sync_group_->id != m.group) {
    out.failed = "trainer: not in weight-sync group " + m.group + " (it restarted since the group was made?)";
    out.failed_code = static_cast<int32_t>(ErrorCode::not_found);
    reply.complete(std::move(out));
    return reply;
  }
  const auto start = Clock::now();
  // The published buffer is not written again before the next
  // PublishWeights or BroadcastWeights, which the driver sends once this
  // one is answered; nor are a resident device's parameters (no step
  // before then either).
  float* from = static_cast<float*>(published_.data());
  if (config::device_weight_broadcast(config_)) {
    // Straight from the device's parameters into the engines' decoders
    // (NCCL between GPUs). The published copy above stays the fallback
    // for engines that miss the broadcast.
    auto on_device = trainer_->device_params();
    if (!on_device) {
      out.failed = "trainer rank 0: the device's parameters: " + on_device.error().message();
      out.failed_code = static_cast<int32_t>(on_device.error().code());
      reply.complete(std::move(out));
      return reply;
    }
    from = *on_device;
    out.from_device = true;
  }
  Collective c{sync_group_->id, sync_group_->rank,         from,      out.published.floats, DType::float32,
               ReduceOp::sum,   CollectiveKind::broadcast, /*root=*/0};
  ask<void>(sync_group_->engine(self()), c, std::chrono::milliseconds(sync_group_->timeout_ms) + std::chrono::seconds(5))
      .then([reply, out, start](Result<void> r) mutable {
        out.seconds = seconds_since(start);
        if (!r) {
          out.failed = "trainer rank 0: weight broadcast failed: " + r.error().message();
          out.failed_code = static_cast<int32_t>(r.error().code());
        }
        reply.complete(std::move(out));
      });
  return reply;
}

void TrainerRank::handle(const StartRlPhase&) {
  if (config_.algorithm.loss.kl_coef > 0) reference_.emplace(trainer_->model());
  reference_on_device_ = false;
  // The warm-up's optimizer state is not the RL phase's: start it afresh
  // (what a job started from a checkpoint of the warm-up would do).
  make_trainer(std::move(trainer_->edit_model()), config_.algorithm.optim);
  rl_phase_ = true;
}

Deferred<void> TrainerRank::handle(const SaveTrainerState& m) {
  auto reply = defer<void>();
  model::SafetensorsMetadata meta(m.metadata.begin(), m.metadata.end());
  const auto& gpt = trainer_->model();
  if (!shard_) {
    Status s = model::save_training_state(m.path, gpt.layout(), gpt.params(), trainer_->optimizer(), meta);
    if (s.ok()) s = save_reference(m.reference_path);
    s.ok() ? reply.complete() : reply.fail(s);
    return reply;
  }
  // ZeRO-1: every rank gets the message; the moments are gathered from
  // every rank's segment (for the save only), then rank 0 writes them.
  const size_t n = gpt.layout().total();
  auto gathered = std::make_shared<std::pair<std::vector<float>, std::vector<float>>>();
  gathered->first.assign(n, 0.0f);
  gathered->second.assign(n, 0.0f);
  const auto& opt = trainer_->optimizer();
  std::copy(opt.m().begin(), opt.m().end(), gathered->first.begin() + shard_->begin);
  std::copy(opt.v().begin(), opt.v().end(), gathered->second.begin() + shard_->begin);
  const std::string path = m.path, reference_path = m.reference_path;
  collective(CollectiveKind::allgather, gathered->first.data(), n, DType::float32, "optimizer state gather",
             [this, reply, gathered, path, reference_path, meta, n](Status s) mutable {
               if (!s.ok()) return reply.fail(s);
               collective(CollectiveKind::allgather, gathered->second.data(), n, DType::float32,
                          "optimizer state gather",
                          [this, reply, gathered, path, reference_path, meta](Status s) mutable {
                            if (!s.ok()) return reply.fail(s);
                            if (group_->rank != 0) return reply.complete();
                            const auto& gpt = trainer_->model();
                            s = model::save_training_state(path, gpt.layout(), gpt.params(), gathered->first.data(),
                                                           gathered->second.data(), trainer_->optimizer().steps(),
                                                           meta);
                            if (s.ok()) s = save_reference(reference_path);
                            s.ok() ? reply.complete() : reply.fail(s);
                          });
             });
  return reply;
}

Deferred<std::vector<std::pair<std::string, std::string>>> TrainerRank::handle(const LoadTrainerState& m) {
  auto reply = defer<std::vector<std::pair<std::string, std::string>>>();
  // Into a copy: a state that does not fit leaves this rank as it was.
  train::PolicyTrainer loaded(trainer_->model(), config_.algorithm.optim, shard_, device_.get());
  auto meta = model::load_training_state(m.path, loaded.layout(), loaded.edit_model().params(),
                                         loaded.edit_optimizer());
  if (!meta) {
    reply.fail(Status(meta.error().code(), "trainer: resume: " + meta.error().message()));
    return reply;
  }
  std::optional<model::Gpt<float>> reference;
  std::error_code ec;
  if (config_.algorithm.loss.kl_coef > 0 && !m.reference_path.empty() &&
      std::filesystem::exists(m.reference_path, ec)) {
    reference.emplace(loaded.model());  // the shape; its weights are the file's
    if (Status s = model::load_model(m.reference_path, reference->layout(), reference->params()); !s.ok()) {
      reply.fail(Status(s.code(), "trainer: resume: the reference policy: " + s.message()));
      return reply;
    }
  }
  trainer_.emplace(std::move(loaded));
  rl_phase_ = true;
  // Without a saved reference (kl_coef was 0 when it was written), the
  // loaded weights become it at the next step.
  reference_ = std::move(reference);
  reference_on_device_ = false;
  reply.complete({meta->begin(), meta->end()});
  return reply;
}

Status TrainerRank::reference_logprobs(const train::TrainBatch& batch) {
  if (!reference_) {
    reference_.emplace(trainer_->model());
    reference_on_device_ = false;
  }
  const size_t n = batch.B * batch.T;
  ref_logprobs_.resize(n);
  if (device_ != nullptr) {
    if (!reference_device_) {
      auto dev = model::make_device_model(config_.trainer_shape(), {.kind = device_kind(),
                                                                     .device = device_->device(),
                                                                     .precision = config_.trainer.precision});
      if (!dev) return Status(dev.error().code(), "trainer: the reference policy's device model: " + dev.error().message());
      reference_device_ = std::move(*dev);
      reference_on_device_ = false;  // a new device model (the rank moved to its own GPU) holds nothing yet
    }
    // Again whenever reference_ changed (a resume, a copied state).
    if (!reference_on_device_) {
      if (Status s = reference_device_->upload_params(reference_->params()); !s.ok()) return s;
      reference_on_device_ = true;
    }
    if (Status s = reference_device_->forward(batch.tokens.data(), batch.targets.data(), batch.B, batch.T,
                                              ref_logprobs_.data());
        !s.ok()) {
      return s;
    }
    for (float& l : ref_logprobs_) l = -l;
    return {};
  }
  if (Status s = reference_->forward(batch.tokens.data(), batch.targets.data(), batch.B, batch.T); !s.ok()) return s;
  for (size_t i = 0; i < n; ++i) ref_logprobs_[i] = -reference_->losses()[i];
  return {};
}

Status TrainerRank::save_reference(const std::string& path) {
  if (path.empty() || config_.algorithm.loss.kl_coef <= 0) return {};
  // Made now if no step made it yet: the weights the next step would take.
  if (!reference_) {
    reference_.emplace(trainer_->model());
    reference_on_device_ = false;
  }
  Status s = model::save_model(path, reference_->layout(), reference_->params());
  if (!s.ok()) return Status(s.code(), "trainer: the reference policy: " + s.message());
  return {};
}

Result<TrainerStateHandles> TrainerRank::handle(const ExportTrainerState&) {
  if (shard_) {
    return error(ErrorCode::unsupported,
                 "trainer: with shard_optimizer each rank holds only its segment of the optimizer state, and a lost "
                 "rank's segment is gone: recover from the last checkpoint");
  }
  const auto& gpt = trainer_->model();
  const size_t n = gpt.layout().total();
  auto copy = [&](BufferRegistration& reg, const float* src) {
    if (!reg.handle()) {
      auto r = allocate_buffer(n * sizeof(float));
      if (!r) fail("trainer: cannot register the exported state: " + r.error().message());
      reg = std::move(*r);
    }
    std::memcpy(reg.data(), src, n * sizeof(float));
  };
  copy(exported_params_, gpt.params());
  copy(exported_m_, trainer_->optimizer().m().data());
  copy(exported_v_, trainer_->optimizer().v().data());
  RemoteBuffer reference;
  if (reference_) {
    copy(exported_reference_, reference_->params());
    reference = exported_reference_.handle();
  }
  return TrainerStateHandles{exported_params_.handle(), exported_m_.handle(), exported_v_.handle(),
                             trainer_->optimizer().steps(), n, reference};
}

Deferred<uint64_t> TrainerRank::handle(const ImportTrainerState& m) {
  auto reply = defer<uint64_t>();
  const size_t n = trainer_->layout().total();
  if (m.from.floats != n) {
    reply.fail(Status(ErrorCode::invalid_argument, "trainer: the exported state has " + std::to_string(m.from.floats) +
                                                       " parameters, this model " + std::to_string(n)));
    return reply;
  }
  // Three reads into buffers the reads own; the state changes only once
  // all three are in.
  struct Incoming {
    std::vector<float> params, m, v, reference;
    int left = 3;
    Status failed;
  };
  auto in = std::make_shared<Incoming>();
  in->params.resize(n);
  in->m.resize(n);
  in->v.resize(n);
  const bool has_reference = static_cast<bool>(m.from.reference);
  if (has_reference) {
    in->reference.resize(n);
    in->left = 4;
  }
  const uint64_t steps = m.from.optimizer_steps;
  const bool rl_phase = m.rl_phase;
  auto done = [this, in, reply, steps, rl_phase](Result<void> r) mutable {
    if (!r && in->failed.ok()) in->failed = r.error();
    if (--in->left > 0) return;
    if (!in->failed.ok()) return reply.fail(Status(in->failed.code(), "trainer: state copy: " + in->failed.message()));
    if (rl_phase) make_trainer(std::move(trainer_->edit_model()), config_.algorithm.optim);
    rl_phase_ = rl_phase;
    std::memcpy(trainer_->edit_model().params(), in->params.data(), in->params.size() * sizeof(float));
    // The survivor's reference policy, or none (then the copied weights
    // become it at the next step, as the survivor's would have).
    reference_.reset();
    reference_on_device_ = false;
    if (!in->reference.empty()) {
      reference_.emplace(trainer_->model());
      std::memcpy(reference_->params(), in->reference.data(), in->reference.size() * sizeof(float));
    }
    if (Status s = trainer_->edit_optimizer().restore(std::move(in->m), std::move(in->v), steps); !s.ok()) {
      return reply.fail(s);
    }
    reply.complete(steps);
  };
  read_buffer_into(m.from.params, in, in->params.data(), n * sizeof(float)).then(done);
  read_buffer_into(m.from.m, in, in->m.data(), n * sizeof(float)).then(done);
  read_buffer_into(m.from.v, in, in->v.data(), n * sizeof(float)).then(done);
  if (has_reference) read_buffer_into(m.from.reference, in, in->reference.data(), n * sizeof(float)).then(done);
  return reply;
}

TrainerInfo TrainerRank::handle(const GetTrainerInfo&) {
  const auto& gpt = trainer_->model();
  TrainerInfo info{static_cast<int64_t>(::getpid()), tasks::fnv1a(gpt.params(), gpt.layout().total() * sizeof(float)),
                   trainer_->optimizer_steps(), rl_phase_, optimizer_floats(),
                   device_ ? device_->describe() : "cpu", {}, {}};
  for (const ShardCopy& c : snaps_) {
    if (c.meta) info.snapshots.push_back({c.meta->optimizer_steps, c.meta->rl_phase});
  }
  for (const ShardCopy& c : backups_) {
    if (c.meta) info.backups.push_back({c.meta->optimizer_steps, c.meta->rl_phase});
  }
  return info;
}

Status TrainerRank::registered_copy(BufferRegistration& reg, const float* src, size_t floats) {
  const size_t bytes = floats * sizeof(float);
  if (!reg.handle() || reg.handle().size() != bytes) {
    reg = BufferRegistration();  // the old one goes first
    auto r = allocate_buffer(std::max<size_t>(bytes, 1));
    if (!r) return Status(r.error().code(), "trainer: cannot register a shard snapshot: " + r.error().message());
    reg = std::move(*r);
  }
  if (bytes > 0 && src != nullptr) std::memcpy(reg.data(), src, bytes);
  return {};
}

namespace {

// A shard's floats read from another rank, held until all are in.
struct IncomingShard {
  std::vector<float> params, m, v, reference;
  int left = 0;
  Status failed;
};

// Errors of a snapshot that cannot be this model's.
Status check_snapshot(const ShardSnapshot& s, size_t P) {
  const uint64_t bytes = (s.end - s.begin) * sizeof(float);
  if (s.floats != P || s.begin > s.end || s.end > P || s.params.size() < bytes || s.m.size() < bytes ||
      s.v.size() < bytes) {
    return Status(ErrorCode::invalid_argument, "trainer: a shard snapshot of [" + std::to_string(s.begin) + ", " +
                                                   std::to_string(s.end) + ") of " + std::to_string(s.floats) +
                                                   " parameters does not fit this model's " + std::to_string(P));
  }
  return {};
}

// Reads `snap`'s segment (and `reference`, when given) into `in`; `then`
// runs once all reads are done.
template <class Read>
void read_shard(Read read, const ShardSnapshot& snap, const RemoteBuffer& reference, size_t P,
                const std::shared_ptr<IncomingShard>& in, std::function<void()> then) {
  const size_t seg = snap.end - snap.begin;
  in->params.resize(seg);
  in->m.resize(seg);
  in->v.resize(seg);
  in->left = reference ? 4 : 3;
  if (reference) in->reference.resize(P);
  auto done = [in, then = std::move(then)](Result<void> r) {
    if (!r && in->failed.ok()) in->failed = r.error();
    if (--in->left == 0) then();
  };
  read(snap.params, in->params.data(), seg * sizeof(float)).then(done);
  read(snap.m, in->m.data(), seg * sizeof(float)).then(done);
  read(snap.v, in->v.data(), seg * sizeof(float)).then(done);
  if (reference) read(reference, in->reference.data(), P * sizeof(float)).then(done);
}

}  // namespace

Status TrainerRank::store_copy(ShardCopy& c, const ShardSnapshot& meta, const float* params, const float* m,
                               const float* v) {
  c.meta.reset();  // invalid until all of it is in
  const size_t seg = meta.end - meta.begin;
  ShardRegistrations& r = *c.regs;
  for (Status s : {registered_copy(r.params, params, seg), registered_copy(r.m, m, seg), registered_copy(r.v, v, seg)}) {
    if (!s.ok()) return s;
  }
  ShardSnapshot stored = meta;
  stored.params = r.params.handle();
  stored.m = r.m.handle();
  stored.v = r.v.handle();
  c.meta = stored;
  return {};
}

Result<ShardSnapshot> TrainerRank::handle(const SnapshotShard&) { return take_snapshot(); }

Result<ShardSnapshot> TrainerRank::take_snapshot() {
  if (!shard_ || shard_->begin == shard_->end || !group_) {
    return error(ErrorCode::invalid_argument, "trainer: no optimizer shard to snapshot (trainer.shard_optimizer with "
                                              "2 or more ranks, once the rank has joined its group)");
  }
  const auto& gpt = trainer_->model();
  const auto& opt = trainer_->optimizer();
  const size_t P = gpt.layout().total();
  ShardSnapshot meta{{}, {}, {}, shard_->begin, shard_->end, opt.steps(), rl_phase_, RemoteBuffer(), P};
  if (reference_) {
    if (Status s = registered_copy(snap_reference_, reference_->params(), P); !s.ok()) return error(s);
    meta.reference = snap_reference_.handle();
  }
  ShardCopy& c = snaps_[next_snap_];
  if (Status s = store_copy(c, meta, gpt.params() + shard_->begin, opt.m().data(), opt.v().data()); !s.ok()) {
    return error(s);
  }
  next_snap_ ^= 1;
  return *c.meta;
}

Deferred<void> TrainerRank::handle(const BackUpShard& m) {
  auto reply = defer<void>();
  const size_t P = trainer_->layout().total();
  if (Status s = check_snapshot(m.from, P); !s.ok()) {
    reply.fail(s);
    return reply;
  }
  if (backup_reading_) {
    reply.fail(Status(ErrorCode::already_exists, "trainer: a backup is already being read; wait for its reply"));
    return reply;
  }
  // Straight into the older backup's registrations (invalid while they
  // fill): the newer one stays whole until this one is in.
  const size_t slot = next_backup_, seg = m.from.end - m.from.begin;
  ShardCopy& c = backups_[slot];
  c.meta.reset();
  ShardRegistrations& regs = *c.regs;
  for (Status s : {registered_copy(regs.params, nullptr, seg), registered_copy(regs.m, nullptr, seg),
                   registered_copy(regs.v, nullptr, seg)}) {
    if (!s.ok()) {
      reply.fail(s);
      return reply;
    }
  }
  backup_reading_ = true;
  struct Left {
    int reads = 3;
    Status failed;
  };
  auto left = std::make_shared<Left>();
  ShardSnapshot meta = m.from;
  meta.reference = RemoteBuffer();
  meta.params = regs.params.handle();
  meta.m = regs.m.handle();
  meta.v = regs.v.handle();
  auto done = [this, left, meta, slot, reply](Result<void> r) mutable {
    if (!r && left->failed.ok()) left->failed = r.error();
    if (--left->reads > 0) return;
    backup_reading_ = false;
    if (!left->failed.ok()) {
      return reply.fail(Status(left->failed.code(), "trainer: backing up the shard [" + std::to_string(meta.begin) +
                                                        ", " + std::to_string(meta.end) + "): " + left->failed.message()));
    }
    backups_[slot].meta = meta;
    next_backup_ = slot ^ 1;
    reply.complete();
  };
  // The reads keep the registrations alive (c.regs), whatever happens here.
  const size_t bytes = seg * sizeof(float);
  read_buffer_into(m.from.params, c.regs, regs.params.data(), bytes).then(done);
  read_buffer_into(m.from.m, c.regs, regs.m.data(), bytes).then(done);
  read_buffer_into(m.from.v, c.regs, regs.v.data(), bytes).then(done);
  return reply;
}

Result<ShardSnapshot> TrainerRank::handle(const ExportBackup& m) {
  for (const ShardCopy& c : backups_) {
    if (c.meta && ShardVersion{c.meta->optimizer_steps, c.meta->rl_phase} == m.version) return *c.meta;
  }
  return error(ErrorCode::not_found, "trainer: this rank holds no backup of the previous rank's shard after " +
                                         std::to_string(m.version.optimizer_steps) + " steps");
}

void TrainerRank::restore_shard(const ShardSnapshot& at, const float* params, std::vector<float> m,
                                std::vector<float> v, const std::vector<float>* reference) {
  if (at.rl_phase != rl_phase_) {
    rl_phase_ = at.rl_phase;
    make_trainer(std::move(trainer_->edit_model()), optim_now());
  }
  std::memcpy(trainer_->edit_model().params() + at.begin, params, (at.end - at.begin) * sizeof(float));
  if (reference != nullptr) {
    reference_.emplace(trainer_->model());
    reference_on_device_ = false;
    std::memcpy(reference_->params(), reference->data(), reference->size() * sizeof(float));
  }
  if (Status s = trainer_->edit_optimizer().restore(std::move(m), std::move(v), at.optimizer_steps); !s.ok()) {
    fail("trainer: restoring a shard snapshot: " + s.message());  // checked against the segment: a broken invariant
  }
}

Deferred<void> TrainerRank::handle(const RestoreShard& m) {
  auto reply = defer<void>();
  const size_t P = trainer_->layout().total();
  const bool own = !m.from.params;
  if (own && trainer_->optimizer().steps() == m.version.optimizer_steps && rl_phase_ == m.version.rl_phase) {
    reply.complete();  // its segment and moments are at the version (the parameter allgather does the rest)
    return reply;
  }
  const ShardCopy* mine = nullptr;
  for (const ShardCopy& c : snaps_) {
    if (c.meta && ShardVersion{c.meta->optimizer_steps, c.meta->rl_phase} == m.version) mine = &c;
  }
  if (own && mine == nullptr) {
    reply.fail(Status(ErrorCode::not_found, "trainer: this rank has no snapshot of its shard after " +
                                                std::to_string(m.version.optimizer_steps) + " steps"));
    return reply;
  }
  const ShardSnapshot at = own ? *mine->meta : m.from;
  if (Status s = check_snapshot(at, P); !s.ok()) {
    reply.fail(s);
    return reply;
  }
  if (!shard_ || shard_->begin != at.begin || shard_->end != at.end) {
    reply.fail(Status(ErrorCode::invalid_argument,
                      "trainer: the snapshot is of segment [" + std::to_string(at.begin) + ", " +
                          std::to_string(at.end) + "), not this rank's (join the group first)"));
    return reply;
  }
  if (m.reference && m.reference.size() != P * sizeof(float)) {
    reply.fail(Status(ErrorCode::invalid_argument, "trainer: the reference policy to restore is not this model's"));
    return reply;
  }
  const size_t seg = at.end - at.begin;
  if (own) {
    // A rank going back to its own snapshot keeps its reference policy
    // (the phase's: the driver restores to a version of the phase it is in).
    auto floats = [](const BufferRegistration& r) { return static_cast<const float*>(r.data()); };
    const ShardRegistrations& r = *mine->regs;
    restore_shard(at, floats(r.params), std::vector<float>(floats(r.m), floats(r.m) + seg),
                  std::vector<float>(floats(r.v), floats(r.v) + seg), nullptr);
    reply.complete();
    return reply;
  }
  auto in = std::make_shared<IncomingShard>();
  auto read = [this, in](const RemoteBuffer& b, void* dst, size_t n) { return read_buffer_into(b, in, dst, n); };
  read_shard(read, at, m.reference, P, in, [this, in, at, reply]() mutable {
    if (!in->failed.ok()) {
      return reply.fail(Status(in->failed.code(), "trainer: reading a shard snapshot: " + in->failed.message()));
    }
    restore_shard(at, in->params.data(), std::move(in->m), std::move(in->v),
                  in->reference.empty() ? nullptr : &in->reference);
    reply.complete();
  });
  return reply;
}

Deferred<void> TrainerRank::handle(const GatherParams&) {
  auto reply = defer<void>();
  if (!group_) {
    reply.fail(Status(ErrorCode::invalid_argument, "trainer: no collective group yet (send JoinTrainerGroup)"));
    return reply;
  }
  collective(CollectiveKind::allgather, trainer_->edit_model().params(), trainer_->layout().total(), DType::float32,
             "parameter allgather", [reply](Status s) mutable { s.ok() ? reply.complete() : reply.fail(s); });
  return reply;
}

}  // namespace troupe::rl::trainer
