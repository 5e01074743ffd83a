#include "model/generate.h"

#include <algorithm>
#include <string>

namespace troupe::rl::model {
namespace {

// Every sequence is non-empty, fits `limit` tokens, and has tokens of the
// vocabulary.
Status check_sequences(std::span<const std::vector<int32_t>> seqs, size_t limit, size_t V, const char* what) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].empty() || seqs[i].size() > limit) {
      return Status(ErrorCode::invalid_argument, std::string(what) + " " + std::to_string(i) + " has " +
                                                     std::to_string(seqs[i].size()) + " tokens; it must have 1 to " +
                                                     std::to_string(limit));
    }
    for (int32_t t : seqs[i]) {
      if (t < 0 || static_cast<size_t>(t) >= V) {
        return Status(ErrorCode::invalid_argument, std::string(what) + " " + std::to_string(i) + " has token " +
                                                       std::to_string(t) + " outside the vocabulary of " +
                                                       std::to_string(V));
      }
    }
  }
  return {};
}

Status check_cache(const Gpt<float>& model, const KvCache& cache) {
  if (model.config() == cache.config()) return {};
  return Status(ErrorCode::invalid_argument,
                "generation: the cache was made for another model shape; make it from the model's config");
}

}  // namespace

Result<std::vector<Completion>> generate(const Gpt<float>& model, KvCache& cache,
                                         std::span<const std::vector<int32_t>> prompts,
                                         const SamplingParams& params) {
  if (Status s = check_cache(model, cache); !s.ok()) return error(s);
  if (Status s = cache.set_weights(model); !s.ok()) return error(s);
  return generate(cache, prompts, params);
}

Result<std::vector<std::vector<float>>> score(const Gpt<float>& model, KvCache& cache,
                                              std::span<const std::vector<int32_t>> sequences) {
  if (Status s = check_cache(model, cache); !s.ok()) return error(s);
  if (Status s = cache.set_weights(model); !s.ok()) return error(s);
  return score(cache, sequences);
}

Result<std::vector<Completion>> generate(Decoder& cache, std::span<const std::vector<int32_t>> prompts,
                                         const SamplingParams& params) {
  const GptConfig& c = cache.config();
  const size_t V = c.vocab_size;
  if (Status s = params.validate(); !s.ok()) return error(s);
  if (Status s = check_sequences(prompts, c.context_length - 1, V, "prompt"); !s.ok()) return error(s);

  std::vector<Completion> out(prompts.size());
  std::vector<float> logits, scratch(V);
  std::vector<int32_t> order(V);
  std::vector<DecodeRow> rows;
  for (size_t wave = 0; wave < prompts.size(); wave += cache.slots()) {
    const size_t n = std::min(cache.slots(), prompts.size() - wave);
    cache.clear_all();
    std::vector<SampleRng> rngs;
    rngs.reserve(n);
    for (size_t i = 0; i < n; ++i) rngs.emplace_back(params.seed, wave + i);
    // Prefill: every prompt's tokens; the last row of each gives its first
    // new token.
    rows.clear();
    std::vector<size_t> last_row(n);
    for (size_t i = 0; i < n; ++i) {
      for (int32_t t : prompts[wave + i]) rows.push_back({static_cast<uint32_t>(i), t});
      last_row[i] = rows.size() - 1;
    }
    std::vector<size_t> live;  // slots still generating
    for (size_t i = 0; i < n; ++i) {
      if (params.max_new_tokens > 0) live.push_back(i);
    }
    logits.resize(rows.size() * V);
    if (Status s = cache.append(rows, logits.data()); !s.ok()) return error(s);
    std::vector<const float*> next_logits(n);
    for (size_t i = 0; i < n; ++i) next_logits[i] = logits.data() + last_row[i] * V;

    std::vector<float> step_logits;
    while (!live.empty()) {
      // Sample each live sequence's next token; those that go on feed it
      // back in the next step.
      rows.clear();
      std::vector<size_t> still;
      for (size_t i : live) {
        Completion& comp = out[wave + i];
        const float* l = next_logits[i];
        int32_t token = sample_token(l, V, params, rngs[i], scratch.data(), order.data());
        comp.tokens.push_back(token);
        comp.logprobs.push_back(static_cast<float>(token_logprob(l, V, token)));
        if (params.stop_token >= 0 && token == params.stop_token) {
          comp.stop = StopReason::stop_token;
        } else if (comp.tokens.size() >= params.max_new_tokens) {
          comp.stop = StopReason::max_tokens;
        } else if (cache.length(i) >= c.context_length) {
          comp.stop = StopReason::context;  // the sampled token has no position to go in
        } else {
          still.push_back(i);
          rows.push_back({static_cast<uint32_t>(i), token});
        }
      }
      live = std::move(still);
      if (live.empty()) break;
      step_logits.resize(rows.size() * V);
      if (Status s = cache.append(rows, step_logits.data()); !s.ok()) return error(s);
      for (size_t r = 0; r < live.size(); ++r) next_logits[live[r]] = step_logits.data() + r * V;
    }
  }
  return out;
}

Result<std::vector<std::vector<float>>> score(Decoder& cache, std::span<const std::vector<int32_t>> sequences) {
  const GptConfig& c = cache.config();
  const size_t V = c.vocab_size;
  if (Status s = check_sequences(sequences, c.context_length, V, "sequence"); !s.ok()) return error(s);
  std::vector<std::vector<float>> out(sequences.size());
  std::vector<DecodeRow> rows;
  std::vector<float> logits;
  for (size_t wave = 0; wave < sequences.size(); wave += cache.slots()) {
    const size_t n = std::min(cache.slots(), sequences.size() - wave);
    cache.clear_all();
    rows.clear();
    for (size_t i = 0; i < n; ++i) {
      for (int32_t t : sequences[wave + i]) rows.push_back({static_cast<uint32_t>(i), t});
    }
    logits.resize(rows.size() * V);
    if (Status s = cache.append(rows, logits.data()); !s.ok()) return error(s);
    size_t row = 0;
    for (size_t i = 0; i < n; ++i) {
      const std::vector<int32_t>& seq = sequences[wave + i];
      std::vector<float>& lp = out[wave + i];
      lp.reserve(seq.size() - 1);
      for (size_t t = 1; t < seq.size(); ++t) {
        lp.push_back(static_cast<float>(token_logprob(logits.data() + (row + t - 1) * V, V, seq[t])));
      }
      row += seq.size();
    }
  }
  return out;
}

}  // namespace troupe::rl::model
