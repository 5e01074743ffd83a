#include "model/adamw.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace troupe::rl::model {

AdamW::AdamW(const ParamLayout& layout, AdamWConfig config)
    : config_(config), m_(layout.total(), 0.0f), v_(layout.total(), 0.0f), decays_(layout.total(), 0) {
  for (const TensorSpec& t : layout.tensors()) {
    if (t.shape.size() >= 2) std::fill(decays_.begin() + t.offset, decays_.begin() + t.offset + t.count, 1);
  }
}

double AdamW::learning_rate(size_t step) const {
  const double lr = config_.learning_rate;
  if (step < config_.warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(config_.warmup_steps);
  if (config_.decay_steps == 0) return lr;
  const double floor = lr * config_.min_lr_fraction;
  if (step >= config_.decay_steps) return floor;
  double progress = static_cast<double>(step - config_.warmup_steps) /
                    static_cast<double>(std::max<size_t>(1, config_.decay_steps - config_.warmup_steps));
  return floor + 0.5 * (lr - floor) * (1.0 + std::cos(std::numbers::pi * progress));
}

double AdamW::step(float* params, float* grads) {
  const size_t n = m_.size();
  double sumsq = 0;
  for (size_t i = 0; i < n; ++i) sumsq += static_cast<double>(grads[i]) * grads[i];
  double norm = std::sqrt(sumsq);
  if (!std::isfinite(norm)) return norm;
  if (config_.clip_norm > 0 && norm > config_.clip_norm) {
    auto scale = static_cast<float>(config_.clip_norm / norm);
    for (size_t i = 0; i < n; ++i) grads[i] *= scale;
  }
  const double lr = learning_rate(step_);
  ++step_;
  const auto b1 = static_cast<float>(config_.beta1), b2 = static_cast<float>(config_.beta2);
  // Bias corrections of the moments' zero start.
  const auto c1 = static_cast<float>(1.0 - std::pow(config_.beta1, static_cast<double>(step_)));
  const auto c2 = static_cast<float>(1.0 - std::pow(config_.beta2, static_cast<double>(step_)));
  const auto lr_f = static_cast<float>(lr), wd = static_cast<float>(config_.weight_decay),
             eps = static_cast<float>(config_.eps);
  for (size_t i = 0; i < n; ++i) {
    float g = grads[i];
    m_[i] = b1 * m_[i] + (1 - b1) * g;
    v_[i] = b2 * v_[i] + (1 - b2) * g * g;
    float mhat = m_[i] / c1, vhat = v_[i] / c2;
    params[i] -= lr_f * (mhat / (std::sqrt(vhat) + eps) + (decays_[i] ? wd * params[i] : 0.0f));
  }
  return norm;
}

}  // namespace troupe::rl::model
