// The policy model's inference path on the CPU: a key/value cache of
// `slots` sequences, and a step that appends tokens to any of them at once
// (the Decoder of decoder.h).
//
// A step takes rows (slot, token): each row's token goes at its slot's next
// position, and the step returns the next-token logits of every row. The
// matrix products run over all rows of the step together, whatever slot
// they belong to; attention runs per row over its own slot's cached keys
// and values. One shape serves the prefill (a prompt's tokens as
// consecutive rows of one slot), the decode (one row per live sequence),
// and continuous batching (new prompts' rows beside other sequences'
// decode rows in the same step).
//
//   KvCache cache = KvCache::make(model.config(), 64).value();
//   DecodeRow rows[] = {{0, bos}, {0, '1'}, {1, bos}};
//   cache.append(model, rows, logits);   // logits: 3 rows of vocab_size
//
// The cache refers to the model of the last set_weights or append(model,
// ...): the caller keeps it alive and unchanged while the cache uses it.
//
// Not thread-safe: one caller at a time (BLAS uses its own threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/decoder.h"
#include "model/gpt.h"
#include "troupe/status.h"

namespace troupe::rl::model {

/// Keys and values of every layer for `slots` sequences of up to the
/// context length, in float.
class KvCache final : public Decoder {
 public:
  /// A cache for models of `config`, `slots` sequences (at least 1). Its
  /// memory is 2 * layers * slots * context_length * channels floats, all
  /// allocated here. Fails on a bad config or zero slots.
  static Result<KvCache> make(const GptConfig& config, size_t slots);

  std::string describe() const override { return "cpu"; }
  const GptConfig& config() const override { return config_; }
  size_t slots() const override { return lengths_.size(); }
  size_t length(size_t slot) const override { return lengths_[slot]; }
  void clear(size_t slot) override { lengths_[slot] = 0; }
  void clear_all() override;
  /// Refers to `model` (no copy).
  Status set_weights(const Gpt<float>& model) override;
  Status append(std::span<const DecodeRow> rows, float* logits) override;
  Status read_weights(float* host) override;
  /// set_weights(model), then append(rows, logits).
  Status append(const Gpt<float>& model, std::span<const DecodeRow> rows, float* logits);

  /// Batch-invariant (the default): a row's logits have the same bits
  /// whatever other rows share its step (matmul_forward_invariant: one
  /// matrix-vector product per row), so continuous batching never changes
  /// a sequence's log-probabilities and a seeded job is reproducible (a
  /// resumed one included). Off: the rows' products go to BLAS as one
  /// matrix product (measured 1.8x the tokens/s at batch 64 on a 3.2M
  /// model; the same on the main job's tiny one), and the last bits of a
  /// log-probability depend on the batch.
  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }

 private:
  explicit KvCache(const GptConfig& config, size_t slots);
  // Sizes the per-row scratch for `n` rows.
  void size_scratch(size_t n);
  // The cached key (or value) vector of (layer, slot, position): C floats.
  float* key(size_t layer, size_t slot, size_t pos) { return keys_.data() + index(layer, slot, pos); }
  float* value(size_t layer, size_t slot, size_t pos) { return values_.data() + index(layer, slot, pos); }
  size_t index(size_t layer, size_t slot, size_t pos) const {
    return ((layer * slots() + slot) * config_.context_length + pos) * config_.channels;
  }

  GptConfig config_;
  const Gpt<float>* model_ = nullptr;
  std::vector<float> keys_, values_;  // (layers, slots, context_length, C)
  std::vector<size_t> lengths_;       // per slot
  bool batch_invariant_ = true;
  // Per-row scratch of the last step.
  std::vector<size_t> positions_;
  std::vector<float> x_, ln_, mean_, rstd_, qkv_, atty_, proj_, fch_, fch_gelu_, scores_;
};

}  // namespace troupe::rl::model
