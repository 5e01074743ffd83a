// The policy model's shape (a decoder-only transformer, GPT-2's block:
// pre-LayerNorm, causal self-attention, GELU MLP of 4x width) and where each
// of its parameters lives in the one contiguous buffer that holds them all.
// Gradients and the optimizer's moments use the same layout, so weight sync
// between meshes, checkpoints and the optimizer all move one buffer.
//
// Layout, in order (C channels, V vocabulary, T context length, L layers):
//
//   wte.weight                 (V, C)     token embeddings
//   wpe.weight                 (T, C)     position embeddings
//   for each layer l < L, contiguous:
//     h.l.ln_1.weight / bias   (C)
//     h.l.attn.qkv.weight      (3C, C)    rows: q then k then v
//     h.l.attn.qkv.bias        (3C)
//     h.l.attn.proj.weight     (C, C)
//     h.l.attn.proj.bias       (C)
//     h.l.ln_2.weight / bias   (C)
//     h.l.mlp.fc.weight        (4C, C)
//     h.l.mlp.fc.bias          (4C)
//     h.l.mlp.proj.weight      (C, 4C)
//     h.l.mlp.proj.bias        (C)
//   ln_f.weight / bias         (C)
//   lm_head.weight             (V, C)     only when the embeddings are untied
//   value_head.weight          (C)        only with a value head
//   value_head.bias            (1)        only with a value head
//
// Weights are (out, in): a layer computes x W^T + b (matmul_forward).
//
// The value head (PPO's critic on the policy's trunk) comes last so that
// every policy tensor keeps its offset: the first policy_count() elements
// are a policy-only model's whole buffer (what rollout engines, which never
// need values, are synced with, and what a policy checkpoint loads into).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/status.h"

namespace troupe::rl::model {

/// The model's hyperparameters.
struct GptConfig {
  size_t vocab_size = 0;
  size_t context_length = 0;
  size_t layers = 0;
  size_t heads = 0;
  size_t channels = 0;
  /// The output projection is the token embedding matrix (GPT-2); false
  /// gives the model its own lm_head.weight.
  bool tied_embeddings = true;
  /// A value head on the final LayerNorm's output: one scalar per position,
  /// `ln_f(x) . value_head.weight + value_head.bias` (Gpt::values()).
  bool value_head = false;

  /// ok, or what is wrong (a zero size, channels not divisible by heads,
  /// sizes whose parameter count overflows).
  Status validate() const;

  bool operator==(const GptConfig&) const = default;
};

/// One tensor of the layout: `count` values from `offset` (in elements) of
/// the buffer, row-major in `shape`.
struct TensorSpec {
  std::string name;
  std::vector<size_t> shape;
  size_t offset = 0;
  size_t count = 0;
};

/// Where a layer's tensors start (element offsets into the buffer).
struct LayerOffsets {
  size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
};

/// The parameter layout of a configuration (see the file comment).
class ParamLayout {
 public:
  /// The layout of `config`; fails as GptConfig::validate does.
  static Result<ParamLayout> make(const GptConfig& config);

  const GptConfig& config() const { return config_; }
  /// Every tensor, in buffer order, without gaps.
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  /// Elements in the whole buffer.
  size_t total() const { return total_; }
  /// The tensor named `name`, or nullptr.
  const TensorSpec* find(std::string_view name) const;

  size_t wte() const { return wte_; }
  size_t wpe() const { return wpe_; }
  const LayerOffsets& layer(size_t l) const { return layers_[l]; }
  size_t lnf_w() const { return lnf_w_; }
  size_t lnf_b() const { return lnf_b_; }
  /// The output projection: wte() when the embeddings are tied.
  size_t lm_head() const { return lm_head_; }
  /// Elements before the value head: the policy's tensors (total() without
  /// a value head).
  size_t policy_count() const { return policy_count_; }
  /// The value head's weight (C) and bias (1).
  /// REQUIRES: config().value_head.
  size_t value_head_w() const { return value_head_w_; }
  size_t value_head_b() const { return value_head_b_; }

 private:
  GptConfig config_;
  std::vector<TensorSpec> tensors_;
  size_t total_ = 0;
  size_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0, lm_head_ = 0, policy_count_ = 0;
  size_t value_head_w_ = 0, value_head_b_ = 0;
  std::vector<LayerOffsets> layers_;
};

}  // namespace troupe::rl::model
