#include "model/adamw.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <utility>

#include "model/threads.h"

namespace troupe::rl::model {

AdamW::AdamW(const ParamLayout& layout, AdamWConfig config) : AdamW(layout, config, {0, layout.total()}) {}

AdamW::AdamW(const ParamLayout& layout, AdamWConfig config, ParamRange range)
    : config_(config), total_(layout.total()), range_(range) {
  if (range_.end > total_) range_.end = total_;
  if (range_.begin > range_.end) range_.begin = range_.end;
  const size_t n = range_.end - range_.begin;
  m_.assign(n, 0.0f);
  v_.assign(n, 0.0f);
  decays_.assign(n, 0);
  for (const TensorSpec& t : layout.tensors()) {
    if (t.shape.size() < 2) continue;
    const size_t lo = std::max(t.offset, range_.begin), hi = std::min(t.offset + t.count, range_.end);
    if (lo < hi) std::fill(decays_.begin() + (lo - range_.begin), decays_.begin() + (hi - range_.begin), 1);
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

namespace {
constexpr size_t kNormBlock = 16384;
}  // namespace

double AdamW::squared_norm(const float* grads) const {
  // Partial sums over fixed blocks of the range, added in order: the same
  // bits whatever the thread count.
  const size_t n = m_.size();
  const float* g = grads + range_.begin;
  const size_t blocks = (n + kNormBlock - 1) / kNormBlock;
  std::vector<double> partial(blocks, 0.0);
  parallel_for(blocks, 4, [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) {
      double sum = 0;
      for (size_t i = b * kNormBlock; i < std::min(n, (b + 1) * kNormBlock); ++i) {
        sum += static_cast<double>(g[i]) * g[i];
      }
      partial[b] = sum;
    }
  });
  double sumsq = 0;
  for (double p : partial) sumsq += p;
  return sumsq;
}

double AdamW::step(float* params, float* grads) { return apply(params, grads, std::sqrt(squared_norm(grads))); }

double AdamW::apply(float* params, float* grads, double norm) {
  if (!std::isfinite(norm)) return norm;
  const size_t n = m_.size();
  float* p = params + range_.begin;
  float* g = grads + range_.begin;
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
      if (scale != 1.0f) g[i] *= scale;  // clipped in place, as documented
      float gi = g[i];
      m_[i] = b1 * m_[i] + (1 - b1) * gi;
      v_[i] = b2 * v_[i] + (1 - b2) * gi * gi;
      float mhat = m_[i] / c1, vhat = v_[i] / c2;
      p[i] -= lr_f * (mhat / (std::sqrt(vhat) + eps) + (decays_[i] ? wd * p[i] : 0.0f));
    }
  });
  return norm;
}

Status AdamW::restore(std::vector<float> m, std::vector<float> v, size_t steps) {
  if (m.size() == total_ && v.size() == total_ && m_.size() != total_) {
    // The whole layout's moments (a checkpoint): keep this range's.
    m = std::vector<float>(m.begin() + range_.begin, m.begin() + range_.end);
    v = std::vector<float>(v.begin() + range_.begin, v.begin() + range_.end);
  }
  if (m.size() != m_.size() || v.size() != v_.size()) {
    return Status(ErrorCode::invalid_argument, "adamw restore: moments of " + std::to_string(m.size()) + " and " +
                                                   std::to_string(v.size()) + " values, the optimizer holds " +
                                                   std::to_string(m_.size()) + " of the model's " +
                                                   std::to_string(total_) + " parameters");
  }
  m_ = std::move(m);
  v_ = std::move(v);
  step_ = steps;
  return {};
}

}  // namespace troupe::rl::model
