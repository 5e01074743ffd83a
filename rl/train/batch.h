// Training batches: sequences of prompt + completion laid out as the model
// takes them, (B, T) tokens and next-token targets padded with PAD, a mask
// that counts only the completion's tokens, and per-token arrays for the
// policy-gradient loss (the sampling policy's log-probabilities, the
// sequence's advantage).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "troupe/status.h"

namespace troupe::rl::train {

/// One sequence to train on.
struct TrainSequence {
  std::vector<int32_t> prompt;      // at least one token (BOS)
  std::vector<int32_t> completion;  // the tokens trained on
  /// The sampling policy's log-probability of each completion token (empty
  /// for supervised data).
  std::vector<float> completion_logprobs;
  double advantage = 0;
  /// Which completion tokens are trained on (empty: all). A multi-turn
  /// episode's completion holds the environment's observations between
  /// the model's turns: those are context, not the policy's tokens (0).
  std::vector<uint8_t> completion_mask;
  /// PPO: the critic's value at each completion token's position before
  /// this step's updates (empty: the values of the forward that trains).
  std::vector<float> completion_values;
};

/// A batch in the model's layout: position t of row b predicts
/// targets[b*T + t] from tokens[b*T + 0..t].
struct TrainBatch {
  size_t B = 0, T = 0;
  std::vector<int32_t> tokens, targets;
  /// 1 where the target is a completion token.
  std::vector<float> mask;
  /// Where the mask is 1: that token's sampling log-probability and the
  /// sequence's advantage; 0 elsewhere.
  std::vector<float> old_logprobs, advantages;
  /// Where the mask is 1: the sequence's completion_values (0 elsewhere);
  /// empty when no sequence has them.
  std::vector<float> old_values;
  /// Completion tokens in the batch (the mask's sum).
  size_t completion_tokens = 0;
};

/// Lays out `sequences` with T = the longest prompt + completion - 1,
/// padding with `pad_token`. Errors: no sequences, an empty prompt or
/// completion, a sequence longer than `context_length` + 1 tokens,
/// logprobs, values or a mask given for some tokens but not all, values
/// given for some sequences but not all.
Result<TrainBatch> make_train_batch(std::span<const TrainSequence> sequences, size_t context_length,
                                    int32_t pad_token);

}  // namespace troupe::rl::train
