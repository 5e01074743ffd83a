#include "rollout/rollout_engine.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include <unistd.h>

#include "model/device_model.h"
#include "model/generate.h"
#include "model/kv_cache.h"
#include "model/threads.h"
#include "tasks/draw.h"

namespace troupe::rl::rollout {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

struct RolloutEngine::SyncState {
  trainer::PublishedWeights weights;
  Deferred<SyncReport> reply;
  Clock::time_point start;
  uint64_t total_bytes = 0, next_offset = 0;
  size_t in_flight = 0;
  Status failed;
  std::string device_copy_failed;
};

RolloutEngine::RolloutEngine(std::string config_toml)
    : config_(config::job_config_or_throw(config_toml, "rollout engine")) {
  model::set_compute_threads(config_.rollout.threads);
  auto gpt = model::Gpt<float>::make(config_.model.shape);
  if (!gpt) throw std::runtime_error("rollout engine: " + gpt.error().message());
  active_ = std::make_shared<model::Gpt<float>>(*gpt);
  standby_ = std::make_shared<model::Gpt<float>>(std::move(*gpt));
  if (config_.rollout.device != config::Device::cpu) {
    const bool cuda = config_.rollout.device == config::Device::cuda;
    auto dev = model::make_device_decoder(config_.model.shape, config_.rollout.max_sequences,
                                          {.kind = cuda ? model::DeviceKind::cuda : model::DeviceKind::host,
                                           .precision = config_.rollout.precision,
                                           .batch_invariant = config_.rollout.batch_invariant});
    if (!dev) {
      throw std::runtime_error(std::string("rollout engine: 'rollout.device' \"") + (cuda ? "cuda" : "host") +
                               "\": " + dev.error().message());
    }
    decoder_ = std::move(*dev);
    broadcast_into_decoder_ = config::device_weight_broadcast(config_);
  } else {
    auto cache = model::KvCache::make(config_.model.shape, config_.rollout.max_sequences);
    if (!cache) throw std::runtime_error("rollout engine: " + cache.error().message());
    cache->set_batch_invariant(config_.rollout.batch_invariant);
    decoder_ = std::make_unique<model::KvCache>(std::move(*cache));
  }
  // Nothing decodes before the first sync (admit() waits for a version);
  // the decoder starts with the zero weights all the same.
  if (Status s = decoder_->set_weights(*active_); !s.ok()) throw std::runtime_error("rollout engine: " + s.message());
  for (size_t s = config_.rollout.max_sequences; s-- > 0;) free_slots_.push_back(static_cast<uint32_t>(s));
  const size_t V = config_.model.shape.vocab_size;
  scratch_.resize(V);
  order_.resize(V);
}

Deferred<std::vector<GroupSamples>> RolloutEngine::handle(const Generate& m) {
  auto reply = defer<std::vector<GroupSamples>>();
  const auto& shape = config_.model.shape;
  auto req = std::make_shared<Request>();
  req->min_version = m.min_version;
  req->sampling = config_.rollout_sampling();
  if (m.temperature >= 0) req->sampling.temperature = m.temperature;
  for (const auto& g : m.groups) {
    if (g.prompt.empty() || g.prompt.size() >= shape.context_length) {
      reply.fail(Status(ErrorCode::invalid_argument, "rollout engine: group " + std::to_string(g.id) + "'s prompt has " +
                                                         std::to_string(g.prompt.size()) + " tokens; it must have 1 to " +
                                                         std::to_string(shape.context_length - 1)));
      return reply;
    }
    for (int32_t t : g.prompt) {
      if (t < 0 || static_cast<size_t>(t) >= shape.vocab_size) {
        reply.fail(Status(ErrorCode::invalid_argument, "rollout engine: group " + std::to_string(g.id) +
                                                           " has token " + std::to_string(t) +
                                                           " outside the vocabulary"));
        return reply;
      }
    }
    req->left += g.samples;
  }
  req->groups.resize(m.groups.size());
  for (size_t i = 0; i < m.groups.size(); ++i) {
    req->groups[i].id = m.groups[i].id;
    req->groups[i].samples.resize(m.groups[i].samples);
  }
  req->reply = reply;
  if (req->left == 0) {
    reply.complete(std::move(req->groups));
    return reply;
  }
  for (size_t g = 0; g < m.groups.size(); ++g) {
    for (uint32_t i = 0; i < m.groups[g].samples; ++i) {
      queued_.push_back(Sequence{req, g, i, m.groups[g].prompt, model::SampleRng(m.groups[g].seed, i), 0, 0});
    }
  }
  admit();
  schedule_tick();
  return reply;
}

void RolloutEngine::schedule_tick() {
  if (tick_scheduled_ || (live_.empty() && queued_.empty())) return;
  tick_scheduled_ = true;
  if (!self().tell(EngineTick{}).ok()) {
    // A full mailbox: come back shortly rather than stall.
    after(std::chrono::milliseconds(1), [this] {
      tick_scheduled_ = false;
      schedule_tick();
    });
  }
}

void RolloutEngine::admit() {
  while (!free_slots_.empty() && !queued_.empty() && version_ != kNoVersion &&
         version_ >= queued_.front().request->min_version) {
    Sequence s = std::move(queued_.front());
    queued_.pop_front();
    s.slot = free_slots_.back();
    free_slots_.pop_back();
    decoder_->clear(s.slot);
    s.fed = 0;
    live_.push_back(std::move(s));
  }
}

void RolloutEngine::handle(const EngineTick&) {
  tick_scheduled_ = false;
  admit();
  if (live_.empty()) return;
  const auto start = Clock::now();
  const size_t V = config_.model.shape.vocab_size;
  const size_t context = config_.model.shape.context_length;
  // Each live sequence feeds what the cache lacks: its whole prompt (and
  // tokens, after a weight switch) when new, its last token otherwise.
  rows_.clear();
  last_row_.resize(live_.size());
  auto& last_row = last_row_;
  for (size_t i = 0; i < live_.size(); ++i) {
    Sequence& s = live_[i];
    const auto& tokens = s.request->groups[s.group].samples[s.sample].tokens;
    const size_t total = s.prompt.size() + tokens.size();
    for (size_t t = s.fed; t < total; ++t) {
      rows_.push_back({s.slot, t < s.prompt.size() ? s.prompt[t] : tokens[t - s.prompt.size()]});
    }
    s.fed = total;
    last_row[i] = rows_.size() - 1;
  }
  logits_.resize(rows_.size() * V);
  if (Status st = decoder_->append(rows_, logits_.data()); !st.ok()) {
    // Inputs were checked: a broken invariant, or a device fault (which
    // leaves a CUDA context unusable). The driver requeues this engine's
    // prompts and the engine restarts.
    fail("rollout engine: decode step: " + st.message());
  }
  size_t tokens_out = 0;
  auto& still = still_;
  still.clear();
  for (size_t i = 0; i < live_.size(); ++i) {
    Sequence& s = live_[i];
    Sample& out = s.request->groups[s.group].samples[s.sample];
    const float* l = logits_.data() + last_row[i] * V;
    const int32_t token = model::sample_token(l, V, s.request->sampling, s.rng, scratch_.data(), order_.data());
    if (out.tokens.empty()) out.version_first = version_;
    out.version_last = version_;
    out.tokens.push_back(token);
    out.logprobs.push_back(static_cast<float>(model::token_logprob(l, V, token)));
    ++tokens_out;
    const auto& p = s.request->sampling;
    if (p.stop_token >= 0 && token == p.stop_token) {
      finish(s, model::StopReason::stop_token);
    } else if (out.tokens.size() >= p.max_new_tokens) {
      finish(s, model::StopReason::max_tokens);
    } else if (s.fed >= context) {
      finish(s, model::StopReason::context);  // the sampled token has no position to go in
    } else {
      still.push_back(std::move(s));
    }
  }
  std::swap(live_, still);  // the old vector's storage serves the next step
  report_.tokens_generated += tokens_out;
  ++report_.decode_steps;
  report_.busy_seconds += seconds_since(start);
  admit();
  schedule_tick();
}

void RolloutEngine::finish(Sequence& s, model::StopReason why) {
  s.request->groups[s.group].samples[s.sample].stop = static_cast<uint8_t>(why);
  free_slots_.push_back(s.slot);
  if (--s.request->left == 0) s.request->reply.complete(std::move(s.request->groups));
}

Deferred<SyncReport> RolloutEngine::handle(const SyncWeights& m) {
  auto reply = defer<SyncReport>();
  const size_t n = active_->layout().total();
  if (m.weights.floats != n || m.weights.buffer.size() < n * sizeof(float)) {
    reply.fail(Status(ErrorCode::invalid_argument, "rollout engine: the published weights have " +
                                                       std::to_string(m.weights.floats) + " parameters, this model " +
                                                       std::to_string(n)));
    return reply;
  }
  if (syncing_) {
    reply.fail(Status(ErrorCode::already_exists, "rollout engine: a weight sync is already in progress; wait for it"));
    return reply;
  }
  std::string device_copy_failed;
  const model::SharedParams& from = m.weights.device;
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  if (!from.device.empty() && from.valid_until_unix_ms > 0 && now_ms > from.valid_until_unix_ms) {
    // The sync came late (its ask timed out): the trainer may be training
    // on them by now. The published buffer changes only at a publish.
    device_copy_failed = "the trainer's device parameters were offered until " +
                         std::to_string(from.valid_until_unix_ms) + " ms (Unix time), and it is " +
                         std::to_string(now_ms) + " ms";
  } else if (!from.device.empty() && from.valid_until_unix_ms > 0) {
    // The trainer's device parameters, on this decoder's device: copied
    // device to device into its standby. Anything else reads the buffer.
    const auto start = Clock::now();
    Status s = decoder_->copy_into_standby(from);
    if (s.ok()) {
      const uint32_t interrupted = static_cast<uint32_t>(live_.size());
      s = switch_weights(m.weights.version, /*in_decoder=*/true);
      if (s.ok()) {
        reply.complete(SyncReport{m.weights.version, n * sizeof(float), seconds_since(start), interrupted, true, {}});
        return reply;
      }
    }
    if (s.code() != ErrorCode::unsupported) device_copy_failed = s.message();
  }
  syncing_ = true;
  auto st = std::make_shared<SyncState>();
  st->device_copy_failed = std::move(device_copy_failed);
  st->weights = m.weights;
  st->reply = reply;
  st->start = Clock::now();
  st->total_bytes = n * sizeof(float);
  pump(st);
  return reply;
}

void RolloutEngine::handle(const trainer::JoinWeightSyncGroup& m) { sync_group_ = m.group; }

Deferred<SyncReport> RolloutEngine::handle(const ReceiveWeights& m) {
  auto reply = defer<SyncReport>();
  const size_t n = active_->layout().total();
  const std::string what = "rollout engine: weight broadcast of version " + std::to_string(m.version);
  if (!sync_group_ || sync_group_->id != m.group) {
    reply.fail(Status(ErrorCode::not_found, what + ": not in weight-sync group " + m.group +
                                                " (it restarted since the group was made?); sync it by reads"));
    return reply;
  }
  if (syncing_) {
    reply.fail(Status(ErrorCode::already_exists, what + ": a weight sync is already in progress; wait for it"));
    return reply;
  }
  // The standby copy is the engine's alone until the switch: the decode
  // steps in between read the active one. A failed broadcast leaves the
  // standby half written, which the next sync writes over whole.
  float* into = standby_->params();
  if (broadcast_into_decoder_) {
    auto standby = decoder_->standby_weights();
    if (!standby) {
      reply.fail(Status(standby.error().code(), what + ": the decoder's standby: " + standby.error().message()));
      return reply;
    }
    into = *standby;
  }
  syncing_ = true;
  const auto start = Clock::now();
  Collective c{sync_group_->id, sync_group_->rank, into, n, DType::float32, ReduceOp::sum, CollectiveKind::broadcast,
               /*root=*/0};
  ask<void>(sync_group_->engine(self()), c,
            std::chrono::milliseconds(sync_group_->timeout_ms) + std::chrono::seconds(5))
      // `keep`: the standby stays alive while the collective may write into
      // it, whatever happens to this actor meanwhile.
      .then([this, reply, what, version = m.version, n, start, direct = broadcast_into_decoder_,
             keep = std::make_pair(standby_, decoder_)](Result<void> r) mutable {
        syncing_ = false;
        if (!r) return reply.fail(Status(r.error().code(), what + " failed: " + r.error().message()));
        const uint32_t interrupted = static_cast<uint32_t>(live_.size());
        if (Status s = switch_weights(version, direct); !s.ok()) {
          return reply.fail(Status(s.code(), what + " failed: " + s.message()));
        }
        reply.complete(SyncReport{version, n * sizeof(float), seconds_since(start), interrupted, direct, {}});
      });
  return reply;
}

void RolloutEngine::pump(const std::shared_ptr<SyncState>& st) {
  const size_t bucket = config_.rollout.sync_bucket_bytes;
  while (st->failed.ok() && st->in_flight < config_.rollout.sync_reads_in_flight && st->next_offset < st->total_bytes) {
    const uint64_t offset = st->next_offset;
    const uint64_t len = std::min<uint64_t>(bucket, st->total_bytes - offset);
    st->next_offset += len;
    ++st->in_flight;
    auto* dst = reinterpret_cast<std::byte*>(standby_->params()) + offset;
    read_buffer_into(st->weights.buffer, standby_, dst, len, offset).then([this, st](Result<void> r) {
      --st->in_flight;
      if (!r && st->failed.ok()) st->failed = r.error();
      if (st->in_flight > 0) {
        if (st->failed.ok()) pump(st);
        return;
      }
      if (!st->failed.ok()) {
        syncing_ = false;
        return st->reply.fail(Status(st->failed.code(), "rollout engine: weight sync to version " +
                                                            std::to_string(st->weights.version) +
                                                            " failed: " + st->failed.message()));
      }
      if (st->next_offset < st->total_bytes) return pump(st);
      const uint32_t interrupted = static_cast<uint32_t>(live_.size());
      syncing_ = false;
      if (Status s = switch_weights(st->weights.version); !s.ok()) {
        return st->reply.fail(Status(s.code(), "rollout engine: weight sync to version " +
                                                   std::to_string(st->weights.version) + " failed: " + s.message()));
      }
      st->reply.complete(SyncReport{st->weights.version, st->total_bytes, seconds_since(st->start), interrupted, false,
                                    st->device_copy_failed});
    });
  }
}

Status RolloutEngine::switch_weights(uint64_t version, bool in_decoder) {
  if (in_decoder) {
    if (Status s = decoder_->take_standby(); !s.ok()) return s;
    host_current_ = false;
  } else {
    if (Status s = decoder_->set_weights(*standby_); !s.ok()) return s;
    std::swap(active_, standby_);
    host_current_ = true;
  }
  version_ = version;
  report_.version = version;
  // Sequences in flight go on with the new weights: their keys and values
  // are recomputed at the next step (a partial rollout).
  for (Sequence& s : live_) {
    decoder_->clear(s.slot);
    s.fed = 0;
  }
  admit();
  schedule_tick();
  return {};
}

Result<EngineReport> RolloutEngine::handle(const GetEngineReport&) {
  EngineReport r = report_;
  r.version = version_;
  r.live = static_cast<uint32_t>(live_.size());
  r.queued = static_cast<uint32_t>(queued_.size());
  r.pid = static_cast<int64_t>(::getpid());
  if (host_current_) {
    r.checksum = tasks::fnv1a(active_->params(), active_->layout().total() * sizeof(float));
  } else {
    // A device broadcast's weights are in the decoder alone (a device
    // model has no value head: the policy's parameters are all of them).
    std::vector<float> in_use(active_->layout().total());
    if (Status s = decoder_->read_weights(in_use.data()); !s.ok()) {
      return error(s.code(),
                   "rollout engine: reading its weights back from " + decoder_->describe() + ": " + s.message());
    }
    r.checksum = tasks::fnv1a(in_use.data(), in_use.size() * sizeof(float));
  }
  r.device = decoder_->describe();
  return r;
}

}  // namespace troupe::rl::rollout
