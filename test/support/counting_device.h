// A DeviceModel (rl/model/device_model.h) that counts the copies between
// host and device of the one it wraps: the tests of what a trainer moves.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "model/device_model.h"

namespace troupe::test {

/// A device model that counts what crosses between it and the host, around
/// another (the host kind, or CUDA's).
class CountingDevice final : public rl::model::DeviceModel {
 public:
  explicit CountingDevice(std::unique_ptr<rl::model::DeviceModel> inner) : inner_(std::move(inner)) {}
  std::string describe() const override { return inner_->describe(); }
  int device() const override { return inner_->device(); }
  int devices_seen() const override { return inner_->devices_seen(); }
  troupe::Status upload_params(const float* host) override {
    ++uploads;
    return inner_->upload_params(host);
  }
  troupe::Status forward(const int32_t* tokens, const int32_t* targets, size_t B, size_t T, float* losses) override {
    return inner_->forward(tokens, targets, B, T, losses);
  }
  troupe::Status backward(const float* dlosses, float* grads) override {
    ++gradient_downloads;
    return inner_->backward(dlosses, grads);
  }
  troupe::Status download_params(float* host) override {
    ++downloads;
    return inner_->download_params(host);
  }
  troupe::Status zero_grad() override { return inner_->zero_grad(); }
  troupe::Status accumulate_grads(const float* dlosses) override { return inner_->accumulate_grads(dlosses); }
  troupe::Result<float*> device_params() override { return inner_->device_params(); }
  troupe::Result<rl::model::SharedParams> share_params() override { return inner_->share_params(); }
  troupe::Result<float*> device_grads() override { return inner_->device_grads(); }
  troupe::Result<double> adamw_step(const rl::model::AdamWConfig& config) override {
    ++device_steps;
    return inner_->adamw_step(config);
  }
  size_t adamw_steps() const override { return inner_->adamw_steps(); }
  troupe::Status download_adamw_state(float* m, float* v) override {
    ++state_downloads;
    return inner_->download_adamw_state(m, v);
  }
  troupe::Status restore_adamw_state(const float* m, const float* v, size_t steps) override {
    ++state_uploads;
    return inner_->restore_adamw_state(m, v, steps);
  }
  int uploads = 0, downloads = 0, gradient_downloads = 0, device_steps = 0, state_downloads = 0, state_uploads = 0;

 private:
  std::unique_ptr<rl::model::DeviceModel> inner_;
};

}  // namespace troupe::test
