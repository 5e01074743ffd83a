// DeviceKind::host (device_model.h): the DeviceModel interface on the CPU
// model, its parameters, gradients and optimizer in memory of its own. Each
// call is what the CPU trainer does with its own model (the same kernels on
// the same bytes), so a trainer on it takes the CPU trainer's steps bit for
// bit: the reference the device paths are tested against where there is no
// GPU. Its gradients are a CollectiveArray (gpt.h), as the CPU model's.
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "model/adamw.h"
#include "model/device_model.h"
#include "model/gpt.h"

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

}  // namespace

Result<std::unique_ptr<DeviceModel>> make_host_device_model(const GptConfig& config) {
  auto gpt = Gpt<float>::make(config);
  if (!gpt) return error(gpt.error());
  return std::unique_ptr<DeviceModel>(new HostDeviceModel(std::move(*gpt)));
}

}  // namespace troupe::rl::model
