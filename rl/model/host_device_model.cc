// DeviceKind::host (device_model.h): the DeviceModel interface on the CPU
// model, its parameters, gradients and optimizer in memory of its own. Each
// call is what the CPU trainer does with its own model (the same kernels on
// the same bytes), so a trainer on it takes the CPU trainer's steps bit for
// bit: the reference the device paths are tested against where there is no
// GPU. Its gradients are a CollectiveArray (gpt.h), as the CPU model's.
// The host kind's Decoder is the CPU cache with weights of its own and a
// standby, as a device decoder has.
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <unistd.h>

#include "model/adamw.h"
#include "model/device_model.h"
#include "model/gpt.h"
#include "model/kv_cache.h"

namespace troupe::rl::model {
namespace {

class HostDeviceModel final : public DeviceModel {
 public:
  explicit HostDeviceModel(Gpt<float> gpt) : gpt_(std::move(gpt)) {}

  std::string describe() const override { return "host (the CPU model behind the device interface)"; }
  int device() const override { return 0; }
  int devices_seen() const override { return 1; }
  Status upload_params(const float* host) override {
    std::memcpy(gpt_.params(), host, total() * sizeof(float));
    return {};
  }
  Status forward(const int32_t* tokens, const int32_t* targets, size_t B, size_t T, float* losses) override {
    if (Status s = gpt_.forward(tokens, targets, B, T); !s.ok()) return s;
    std::memcpy(losses, gpt_.losses(), B * T * sizeof(float));
    have_forward_ = true;
    return {};
  }
  Status backward(const float* dlosses, float* grads) override {
    if (Status s = zero_grad(); !s.ok()) return s;
    if (Status s = accumulate_grads(dlosses); !s.ok()) return s;
    std::memcpy(grads, gpt_.grads(), total() * sizeof(float));
    return {};
  }
  Status download_params(float* host) override {
    std::memcpy(host, gpt_.params(), total() * sizeof(float));
    return {};
  }
  Status zero_grad() override {
    gpt_.zero_grad();
    return {};
  }
  Status accumulate_grads(const float* dlosses) override {
    if (!have_forward_) {
      return Status(ErrorCode::invalid_argument, "host device model: backward with no forward before it");
    }
    gpt_.backward(dlosses);
    return {};
  }
  Result<float*> device_params() override { return gpt_.params(); }
  Result<SharedParams> share_params() override {
    SharedParams out;
    out.device = "host";
    out.process = process_nonce();
    out.pid = static_cast<int64_t>(::getpid());
    out.address = reinterpret_cast<uint64_t>(gpt_.params());
    out.floats = total();
    return out;
  }
  Result<float*> device_grads() override { return gpt_.grads(); }
  Result<double> adamw_step(const AdamWConfig& config) override {
    if (!adamw_ || !(adamw_config_ == config)) {
      // Another phase's settings: the same moments and count under them.
      AdamW next(gpt_.layout(), config);
      if (adamw_) {
        if (Status s = next.restore(adamw_->m(), adamw_->v(), adamw_->steps()); !s.ok()) return error(s);
      }
      adamw_.emplace(std::move(next));
      adamw_config_ = config;
    }
    return adamw_->step(gpt_.params(), gpt_.grads());
  }
  size_t adamw_steps() const override { return adamw_ ? adamw_->steps() : 0; }
  Status download_adamw_state(float* m, float* v) override {
    if (!adamw_) {
      std::memset(m, 0, total() * sizeof(float));
      std::memset(v, 0, total() * sizeof(float));
      return {};
    }
    std::memcpy(m, adamw_->m().data(), total() * sizeof(float));
    std::memcpy(v, adamw_->v().data(), total() * sizeof(float));
    return {};
  }
  Status restore_adamw_state(const float* m, const float* v, size_t steps) override {
    AdamW next(gpt_.layout(), adamw_config_);
    if (Status s = next.restore(std::vector<float>(m, m + total()), std::vector<float>(v, v + total()), steps);
        !s.ok()) {
      return s;
    }
    adamw_.emplace(std::move(next));
    return {};
  }

 private:
  size_t total() const { return gpt_.layout().total(); }

  Gpt<float> gpt_;
  std::optional<AdamW> adamw_;
  AdamWConfig adamw_config_;
  bool have_forward_ = false;
};

// The device decoder's interface on the CPU cache: weights of its own (a
// copy, as a device's) and a standby to fill while it decodes.
class HostDecoder final : public Decoder {
 public:
  HostDecoder(KvCache cache, Gpt<float> active, Gpt<float> standby)
      : cache_(std::move(cache)),
        active_(std::make_unique<Gpt<float>>(std::move(active))),
        standby_(std::make_unique<Gpt<float>>(std::move(standby))) {
    (void)cache_.set_weights(*active_);  // the same config: cannot fail
  }

  std::string describe() const override { return "host (the CPU cache behind the device decoder's interface)"; }
  const GptConfig& config() const override { return cache_.config(); }
  size_t slots() const override { return cache_.slots(); }
  size_t length(size_t slot) const override { return cache_.length(slot); }
  void clear(size_t slot) override { cache_.clear(slot); }
  void clear_all() override { cache_.clear_all(); }
  Status set_weights(const Gpt<float>& model) override {
    if (Status s = check_decoder_shape(config(), model); !s.ok()) return s;
    // A value-head model's policy parameters come first (policy_count).
    std::memcpy(active_->params(), model.params(), total() * sizeof(float));
    have_weights_ = true;
    return {};
  }
  Status append(std::span<const DecodeRow> rows, float* logits) override {
    if (!have_weights_) {
      return Status(ErrorCode::invalid_argument, "host decoder: no weights; call set_weights(model) first");
    }
    return cache_.append(rows, logits);
  }
  Result<float*> standby_weights() override {
    standby_asked_ = true;
    return standby_->params();
  }
  Status take_standby() override {
    if (!standby_asked_) {
      return Status(ErrorCode::invalid_argument,
                    "host decoder: take_standby with no standby; fill standby_weights() first");
    }
    std::swap(active_, standby_);
    (void)cache_.set_weights(*active_);
    have_weights_ = true;
    standby_asked_ = false;  // it holds the old weights now: filled again before the next take
    return {};
  }
  Status copy_into_standby(const SharedParams& from) override {
    if (from.device != "host" || from.process != process_nonce()) {
      return Status(ErrorCode::unsupported, "host decoder: parameters on " +
                                                (from.device.empty() ? std::string("no device") : from.device) +
                                                " in process " + std::to_string(from.pid) +
                                                " are out of reach (the host kind copies within its own process "
                                                "only); read them another way");
    }
    if (from.floats != total()) {
      return Status(ErrorCode::invalid_argument, "host decoder: " + std::to_string(from.floats) +
                                                     " parameters shared, this model has " + std::to_string(total()));
    }
    std::memcpy(standby_->params(), reinterpret_cast<const float*>(from.address), total() * sizeof(float));
    standby_asked_ = true;
    return {};
  }
  Status read_weights(float* host) override {
    if (!have_weights_) {
      return Status(ErrorCode::invalid_argument, "host decoder: no weights; call set_weights(model) first");
    }
    std::memcpy(host, active_->params(), total() * sizeof(float));
    return {};
  }

 private:
  size_t total() const { return active_->layout().total(); }

  KvCache cache_;
  std::unique_ptr<Gpt<float>> active_, standby_;
  bool have_weights_ = false;
  bool standby_asked_ = false;
};

}  // namespace

Result<std::unique_ptr<DeviceModel>> make_host_device_model(const GptConfig& config) {
  auto gpt = Gpt<float>::make(config);
  if (!gpt) return error(gpt.error());
  return std::unique_ptr<DeviceModel>(new HostDeviceModel(std::move(*gpt)));
}

Result<std::unique_ptr<Decoder>> make_host_decoder(const GptConfig& config, size_t slots, bool batch_invariant) {
  GptConfig policy = config;
  policy.value_head = false;  // a decoder runs the policy alone
  auto cache = KvCache::make(policy, slots);
  if (!cache) return error(cache.error());
  cache->set_batch_invariant(batch_invariant);
  auto active = Gpt<float>::make(policy);
  if (!active) return error(active.error());
  auto standby = Gpt<float>::make(policy);
  if (!standby) return error(standby.error());
  return std::unique_ptr<Decoder>(new HostDecoder(std::move(*cache), std::move(*active), std::move(*standby)));
}

}  // namespace troupe::rl::model
