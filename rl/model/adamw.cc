#include "model/adamw.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <utility>

#include "model/threads.h"

namespace troupe::rl::model {

AdamW::AdamW(const ParamLayout& layout, AdamWConfig config)
    : config_(config), m_(layout.total(), 0.0f), v_(layout.total(), 0.0f), decays_(layout.total(), 0) {
  for (const TensorSpec& t : layout.tensors()) {
    if (t.shape.size() >= 2) std::fill(decays_.begin() + t.offset, decays_.begin() + t.offset + t.count, 1);
  }
}

double adamw_learning_rate(const AdamWConfig& config, size_t step) {
  const double lr = config.learning_rate;
  if (step < config.warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(config.warmup_steps);
  if (config.decay_steps == 0) return lr;
  const double floor = lr * config.min_lr_fraction;
  if (step >= config.decay_steps) return floor;
  double progress = static_cast<double>(step - config.warmup_steps) /
                    static_cast<double>(std::max<size_t>(1, config.decay_steps - config.warmup_steps));
  return floor + 0.5 * (lr - floor) * (1.0 + std::cos(std::numbers::pi * progress));
}

double AdamW::learning_rate(size_t step) const { return adamw_learning_rate(config_, step); }

double AdamW::step(float* params, float* grads) {
  const size_t n = m_.size();
  // The squared norm as partial sums over fixed blocks, added in order: the
  // same bits whatever the thread count.
  constexpr size_t kNormBlock = 16384;
  const size_t blocks = (n + kNormBlock - 1) / kNormBlock;
  std::vector<double> partial(blocks, 0.0);
  parallel_for(blocks, 4, [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) {
      double sum = 0;
      for (size_t i = b * kNormBlock; i < std::min(n, (b + 1) * kNormBlock); ++i) {
        sum += static_cast<double>(grads[i]) * grads[i];
      }
      partial[b] = sum;
    }
  });
  double sumsq = 0;
  for (double p : partial) sumsq += p;
  double norm = std::sqrt(sumsq);
  if (!std::isfinite(norm)) return norm;
  const float scale =
      config_.clip_norm > 0 && norm > config_.clip_norm ? static_cast<float>(config_.clip_norm / norm) : 1.0f;
  const double lr = learning_rate(step_);
  ++step_;
  const auto b1 = static_cast<float>(config_.beta1), b2 = static_cast<float>(config_.beta2);
  // Bias corrections of the moments' zero start.
  const auto c1 = static_cast<float>(1.0 - std::pow(config_.beta1, static_cast<double>(step_)));
  const auto c2 = static_cast<float>(1.0 - std::pow(config_.beta2, static_cast<double>(step_)));
  const auto lr_f = static_cast<float>(lr), wd = static_cast<float>(config_.weight_decay),
             eps = static_cast<float>(config_.eps);
  // Elementwise: any split gives the same bits.
  parallel_for(n, kNormBlock, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      if (scale != 1.0f) grads[i] *= scale;  // clipped in place, as documented
      float g = grads[i];
      m_[i] = b1 * m_[i] + (1 - b1) * g;
      v_[i] = b2 * v_[i] + (1 - b2) * g * g;
      float mhat = m_[i] / c1, vhat = v_[i] / c2;
      params[i] -= lr_f * (mhat / (std::sqrt(vhat) + eps) + (decays_[i] ? wd * params[i] : 0.0f));
    }
  });
  return norm;
}

Status AdamW::restore(std::vector<float> m, std::vector<float> v, size_t steps) {
  if (m.size() != m_.size() || v.size() != v_.size()) {
    return Status(ErrorCode::invalid_argument, "adamw restore: moments of " + std::to_string(m.size()) + " and " +
                                                   std::to_string(v.size()) + " values, the model has " +
                                                   std::to_string(m_.size()) + " parameters");
  }
  m_ = std::move(m);
  v_ = std::move(v);
  step_ = steps;
  return {};
}

}  // namespace troupe::rl::model
