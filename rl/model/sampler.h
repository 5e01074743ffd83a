// Picking the next token from a row of logits: temperature, top-k, top-p
// (nucleus), or greedy, with a random stream per sequence so that a
// sequence's sample depends only on the seed, its index and the model,
// never on which other sequences share its batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "troupe/status.h"

namespace troupe::rl::model {

/// How generation samples.
struct SamplingParams {
  /// Logits are divided by this before the softmax; 0 is greedy (argmax).
  double temperature = 1.0;
  /// Only the k most likely tokens are kept (0: all).
  size_t top_k = 0;
  /// Only the smallest set of most likely tokens whose probability reaches
  /// top_p is kept (1: all). Applied after top_k.
  double top_p = 1.0;
  /// Tokens generated per sequence at most (the context length also stops
  /// a sequence).
  size_t max_new_tokens = 64;
  /// Generation of a sequence stops after this token (kept in the output);
  /// negative: never.
  int32_t stop_token = -1;
  /// The random streams' seed: sequence i of a call draws from a stream of
  /// (seed, i).
  uint64_t seed = 0;

  /// ok, or which field is out of range (a negative or NaN temperature,
  /// top_p outside (0, 1]).
  Status validate() const;
};

/// A random stream (splitmix64-seeded xoshiro256**): the same numbers on
/// every platform, unlike the standard distributions.
class SampleRng {
 public:
  /// The stream of sequence `index` under `seed`.
  SampleRng(uint64_t seed, uint64_t index);
  /// Uniform in [0, 1), 53 bits.
  double uniform();

 private:
  uint64_t next();
  uint64_t s_[4];
};

/// Samples a token from `logits` (V values) under `params` (validated),
/// drawing from `rng`. Scratch: V values of `scratch` and V entries of
/// `order` (the caller keeps them: no allocation per token).
int32_t sample_token(const float* logits, size_t V, const SamplingParams& params, SampleRng& rng, float* scratch,
                     int32_t* order);

/// log softmax(logits)[token]: the model's own log-probability of `token`
/// (temperature 1, nothing truncated), in double for accuracy.
double token_logprob(const float* logits, size_t V, int32_t token);

}  // namespace troupe::rl::model
