// AdamW over the model's one parameter buffer (Loshchilov & Hutter):
// decoupled weight decay, global gradient-norm clipping, and a learning
// rate that warms up linearly and then decays on a cosine to a floor. The
// two moments are buffers of the parameters' layout too, so an optimizer's
// state moves (checkpoints, resharding) like the parameters do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace troupe::rl::model {

/// The optimizer's settings.
struct AdamWConfig {
  double learning_rate = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  /// Decoupled decay, applied to the matrices (2-D tensors) only: biases,
  /// LayerNorm weights and nothing else of one dimension decay.
  double weight_decay = 0.1;
  /// The gradient's global L2 norm is scaled down to this when above it
  /// (0: no clipping).
  double clip_norm = 1.0;
  /// Steps of linear warm-up from 0, then a cosine from learning_rate down
  /// to min_lr_fraction * learning_rate at decay_steps (constant after).
  size_t warmup_steps = 0;
  size_t decay_steps = 0;  // 0: no decay
  double min_lr_fraction = 0.1;
  bool operator==(const AdamWConfig&) const = default;
};

/// The learning rate of step `step` (0-based) under `config`'s schedule:
/// AdamW::learning_rate, shared with the CUDA model's optimizer.
double adamw_learning_rate(const AdamWConfig& config, size_t step);

/// The part of the parameters an optimizer owns: [begin, end).
struct ParamRange {
  size_t begin = 0;
  size_t end = 0;
};

/// AdamW state for one model (its layout), or for one shard of it (ZeRO-1:
/// each data-parallel rank keeps the moments of its range only, updates
/// those parameters, and the ranks gather the rest). Not thread-safe.
class AdamW {
 public:
  /// The whole model.
  AdamW(const ParamLayout& layout, AdamWConfig config);
  /// The parameters in `range` of the layout only (moments of that size).
  AdamW(const ParamLayout& layout, AdamWConfig config, ParamRange range);

  /// The learning rate of step `step` (0-based) under the schedule.
  double learning_rate(size_t step) const;
  /// One update of `params` with `grads` (layout().total() each; the
  /// gradients are scaled in place when clipped). Returns the gradient's
  /// global norm before clipping (a NaN or infinity there is returned and
  /// nothing is updated: a bad batch must not ruin the model). For a
  /// shard, the norm is the shard's: use squared_norm and apply instead.
  double step(float* params, float* grads);
  /// The squared L2 norm of the gradient's elements in range() (summed over
  /// fixed blocks in order: the same bits whatever the thread count).
  double squared_norm(const float* grads) const;
  /// The update of the parameters in range() given the gradient's global
  /// norm (clipping scales the range's gradients in place). A norm that is
  /// NaN or infinite updates nothing. Returns `norm`.
  double apply(float* params, float* grads, double norm);
  /// Steps taken so far.
  size_t steps() const { return step_; }
  /// The parameters this optimizer updates (the whole layout by default).
  ParamRange range() const { return range_; }
  /// The moments of range(), in the parameters' layout order.
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }
  /// Replaces the state with a saved one (a checkpoint's): the moments, in
  /// the layout's order, and the steps taken, so that the next step is the
  /// one that would have followed. Moments of the whole layout are cut to
  /// range(). Errors: invalid_argument when a moment is neither range()'s
  /// size nor the layout's (nothing changes then).
  Status restore(std::vector<float> m, std::vector<float> v, size_t steps);

 private:
  AdamWConfig config_;
  size_t total_ = 0;  // the layout's parameters
  ParamRange range_;
  std::vector<float> m_, v_;
  std::vector<uint8_t> decays_;  // per element of range_: 1 where weight decay applies
  size_t step_ = 0;
};

}  // namespace troupe::rl::model
