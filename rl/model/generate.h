// Batched generation and scoring over a Decoder (decoder.h): the CPU's KV
// cache (kv_cache.h) or a device's.
//
// generate() prefills every prompt in one step (all prompt tokens of all
// sequences as rows), then decodes one token per live sequence per step,
// each sequence with its own random stream (sampler.h), until it emits the
// stop token, reaches max_new_tokens, or fills the context. score() runs
// given sequences through the cache in one pass and returns the model's
// log-probability of each token after the first: what the trainer needs
// from the reference model and the old policy.
//
// The log-probabilities returned by both are the model's own (temperature
// 1, nothing truncated), whatever the sampling settings: generate()'s match
// score()'s on the same tokens, and they are what the policy-gradient
// loss's importance ratio is taken against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/decoder.h"
#include "model/gpt.h"
#include "model/kv_cache.h"
#include "model/sampler.h"
#include "troupe/status.h"

namespace troupe::rl::model {

/// Why a sequence stopped.
enum class StopReason : uint8_t {
  /// It emitted SamplingParams::stop_token (the last token).
  stop_token,
  /// It generated max_new_tokens.
  max_tokens,
  /// Its prompt plus its tokens reached the context length.
  context,
};

/// One generated continuation.
struct Completion {
  /// The new tokens (the prompt not included).
  std::vector<int32_t> tokens;
  /// log p(token) under the model, one per token.
  std::vector<float> logprobs;
  StopReason stop = StopReason::max_tokens;
};

/// Continues each of `prompts` (each 1 to context_length - 1 tokens) under
/// `params`; sequence i draws from the stream (params.seed, i). Uses
/// `cache` (made for the model's config; its slots are cleared and reused,
/// so more prompts than slots run in waves of cache.slots()). Errors: bad
/// params, an empty or too long prompt, a token outside the vocabulary, a
/// cache of another shape.
Result<std::vector<Completion>> generate(const Gpt<float>& model, KvCache& cache,
                                         std::span<const std::vector<int32_t>> prompts,
                                         const SamplingParams& params);

/// For each of `sequences` (each 1 to context_length tokens), log p(token
/// t | tokens before it) for t = 1..size-1 under the model. Uses `cache`
/// as generate() does. Errors as generate().
Result<std::vector<std::vector<float>>> score(const Gpt<float>& model, KvCache& cache,
                                              std::span<const std::vector<int32_t>> sequences);

/// generate() with the weights `decoder` was last given (set_weights).
Result<std::vector<Completion>> generate(Decoder& decoder, std::span<const std::vector<int32_t>> prompts,
                                         const SamplingParams& params);
/// score() with the weights `decoder` was last given (set_weights).
Result<std::vector<std::vector<float>>> score(Decoder& decoder, std::span<const std::vector<int32_t>> sequences);

}  // namespace troupe::rl::model
