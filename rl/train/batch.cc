#include "train/batch.h"

#include <algorithm>
#include <string>

namespace troupe::rl::train {

Result<TrainBatch> make_train_batch(std::span<const TrainSequence> sequences, size_t context_length,
                                    int32_t pad_token) {
  if (sequences.empty()) return error(ErrorCode::invalid_argument, "train batch: no sequences");
  size_t longest = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const TrainSequence& s = sequences[i];
    const size_t len = s.prompt.size() + s.completion.size();
    if (s.prompt.empty() || s.completion.empty() || len > context_length + 1) {
      return error(ErrorCode::invalid_argument,
                   "train batch: sequence " + std::to_string(i) + " has a prompt of " +
                       std::to_string(s.prompt.size()) + " and a completion of " + std::to_string(s.completion.size()) +
                       " tokens; both must be non-empty and together at most " + std::to_string(context_length + 1));
    }
    if (!s.completion_logprobs.empty() && s.completion_logprobs.size() != s.completion.size()) {
      return error(ErrorCode::invalid_argument, "train batch: sequence " + std::to_string(i) + " has " +
                                                    std::to_string(s.completion_logprobs.size()) +
                                                    " logprobs for " + std::to_string(s.completion.size()) +
                                                    " completion tokens");
    }
    if (!s.completion_values.empty() && s.completion_values.size() != s.completion.size()) {
      return error(ErrorCode::invalid_argument, "train batch: sequence " + std::to_string(i) + " has " +
                                                    std::to_string(s.completion_values.size()) + " values for " +
                                                    std::to_string(s.completion.size()) + " completion tokens");
    }
    if (s.completion_values.empty() != sequences[0].completion_values.empty()) {
      return error(ErrorCode::invalid_argument, "train batch: sequence " + std::to_string(i) +
                                                    (s.completion_values.empty() ? " has no" : " has") +
                                                    " old values and sequence 0" +
                                                    (s.completion_values.empty() ? " has" : " has none"));
    }
    if (!s.completion_mask.empty() && s.completion_mask.size() != s.completion.size()) {
      return error(ErrorCode::invalid_argument, "train batch: sequence " + std::to_string(i) + " has a mask of " +
                                                    std::to_string(s.completion_mask.size()) + " for " +
                                                    std::to_string(s.completion.size()) + " completion tokens");
    }
    longest = std::max(longest, len);
  }
  TrainBatch b;
  b.B = sequences.size();
  b.T = longest - 1;
  const size_t n = b.B * b.T;
  b.tokens.assign(n, pad_token);
  b.targets.assign(n, pad_token);
  b.mask.assign(n, 0.0f);
  b.old_logprobs.assign(n, 0.0f);
  b.advantages.assign(n, 0.0f);
  if (!sequences[0].completion_values.empty()) b.old_values.assign(n, 0.0f);
  for (size_t i = 0; i < b.B; ++i) {
    const TrainSequence& s = sequences[i];
    std::vector<int32_t> seq(s.prompt);
    seq.insert(seq.end(), s.completion.begin(), s.completion.end());
    const size_t row = i * b.T;
    for (size_t t = 0; t + 1 < seq.size(); ++t) {
      b.tokens[row + t] = seq[t];
      b.targets[row + t] = seq[t + 1];
    }
    // Completion token k is predicted at position prompt.size() - 1 + k.
    for (size_t k = 0; k < s.completion.size(); ++k) {
      if (!s.completion_mask.empty() && s.completion_mask[k] == 0) continue;
      const size_t at = row + s.prompt.size() - 1 + k;
      b.mask[at] = 1.0f;
      b.advantages[at] = static_cast<float>(s.advantage);
      if (!s.completion_logprobs.empty()) b.old_logprobs[at] = s.completion_logprobs[k];
      if (!s.completion_values.empty()) b.old_values[at] = s.completion_values[k];
      ++b.completion_tokens;
    }
  }
  return b;
}

}  // namespace troupe::rl::train
