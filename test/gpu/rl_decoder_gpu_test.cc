// The inference path on the GPU (make_device_decoder: GptCuda's KV cache
// and decode step) against the CPU's KV cache (kv_cache.h) on the same
// weights and rows: prompts prefilled whole, decode steps, a prompt joining
// between steps (continuous batching), a slot cleared and refilled, new
// weights, and new weights written into its standby on the device; greedy
// generation's tokens and log-probabilities; bad rows refused without
// changing the cache.
#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "model/device_model.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "model/kv_cache.h"
#include "support/decoder_standby.h"

using namespace troupe::rl::model;

constexpr auto step = troupe::test::check_same_step;

namespace {

GptConfig small(bool tied) {
  return GptConfig{
      .vocab_size = 259, .context_length = 32, .layers = 2, .heads = 4, .channels = 64, .tied_embeddings = tied};
}

std::unique_ptr<Decoder> make_gpu_decoder(const GptConfig& config, size_t slots, MatmulPrecision precision) {
  auto d = make_device_decoder(config, slots, {.kind = DeviceKind::cuda, .device = 0, .precision = precision});
  INFO((d ? std::string("ok") : d.error().to_string()));
  REQUIRE(d.has_value());
  return std::move(*d);
}

std::vector<DecodeRow> prompt(uint32_t slot, std::initializer_list<int32_t> tokens) {
  std::vector<DecodeRow> rows;
  for (int32_t t : tokens) rows.push_back({slot, t});
  return rows;
}

}  // namespace

TEST_CASE("gpu decoder: prefill, decode, a prompt joining and new weights give the CPU cache's logits",
          "[gpu][rl]") {
  struct Mode {
    MatmulPrecision precision;
    double tol;
  };
  for (bool tied : {true, false}) {
    for (Mode mode : {Mode{MatmulPrecision::fp32, 1e-4}, Mode{MatmulPrecision::tf32, 2e-2},
                      Mode{MatmulPrecision::bf16, 5e-2}}) {
      INFO("tied " << tied << ", precision " << static_cast<int>(mode.precision));
      const GptConfig config = small(tied);
      auto model = Gpt<float>::make(config).value();
      model.init_random(3);
      auto cpu = KvCache::make(config, 4).value();
      auto gpu = make_gpu_decoder(config, 4, mode.precision);
      CHECK_THAT(gpu->describe(), Catch::StartsWith("cuda:0"));
      REQUIRE(cpu.set_weights(model).ok());
      REQUIRE(gpu->set_weights(model).ok());

      // Two prompts prefilled in one step (rows of a slot attend to the
      // earlier rows of the same step).
      std::vector<DecodeRow> rows = prompt(0, {256, 1, 2, 3, 4});
      for (DecodeRow r : prompt(2, {256, 9, 8})) rows.push_back(r);
      step(*gpu, cpu, rows, mode.tol, "prefill");
      // A decode step of both, with a third prompt joining.
      rows = {{0, 17}, {2, 42}};
      for (DecodeRow r : prompt(1, {256, 5, 5, 5})) rows.push_back(r);
      step(*gpu, cpu, rows, mode.tol, "decode + join");
      for (int i = 0; i < 8; ++i) {
        step(*gpu, cpu, {{1, 30 + i}, {0, 60 + i}, {2, 90 + i}}, mode.tol, "decode");
      }
      // A slot cleared and refilled: its old keys must not be seen.
      cpu.clear(2);
      gpu->clear(2);
      step(*gpu, cpu, prompt(2, {256, 7}), mode.tol, "refill");
      // New weights: the device copies them (and rounds them again for bf16).
      auto other = Gpt<float>::make(config).value();
      other.init_random(4);
      REQUIRE(cpu.set_weights(other).ok());
      REQUIRE(gpu->set_weights(other).ok());
      cpu.clear_all();
      gpu->clear_all();
      step(*gpu, cpu, prompt(3, {256, 1, 1, 2, 3, 5, 8, 13}), mode.tol, "new weights");
    }
  }
}

TEST_CASE(
    "gpu decoder: new weights written into its standby on the device change nothing until taken, then run "
    "(bf16 rounds them anew)",
    "[gpu][rl]") {
  struct Mode {
    MatmulPrecision precision;
    double tol;
  };
  for (Mode mode : {Mode{MatmulPrecision::fp32, 1e-4}, Mode{MatmulPrecision::bf16, 5e-2}}) {
    INFO("precision " << static_cast<int>(mode.precision));
    auto gpu = make_gpu_decoder(small(true), 4, mode.precision);
    troupe::test::check_decoder_standby(
        *gpu,
        [](float* standby, const float* host, size_t n) {
          REQUIRE(cudaMemcpy(standby, host, n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
          REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // from pageable memory it may return before the copy
        },
        mode.tol, /*batch_invariant=*/false);
  }
}

TEST_CASE(
    "gpu decoder: a CUDA device model's shared parameters go device to device into its standby, and those of "
    "another device are refused",
    "[gpu][rl]") {
  const GptConfig config = small(true);
  auto trainer = make_device_model(config, {.kind = DeviceKind::cuda, .device = 0});
  INFO((trainer ? std::string("ok") : trainer.error().to_string()));
  REQUIRE(trainer.has_value());
  auto weights = Gpt<float>::make(config).value();
  weights.init_random(9);
  REQUIRE((*trainer)->upload_params(weights.params()).ok());
  auto shared = (*trainer)->share_params();
  INFO((shared ? std::string("ok") : shared.error().to_string()));
  REQUIRE(shared.has_value());
  CHECK_THAT(shared->device, Catch::StartsWith("cuda:"));
  CHECK(shared->ipc_handle.size() == 64);  // cudaIpcMemHandle_t, for other processes

  auto gpu = make_gpu_decoder(config, 2, MatmulPrecision::fp32);
  REQUIRE(gpu->set_weights(Gpt<float>::make(config).value()).ok());
  troupe::Status s = gpu->copy_into_standby(*shared);  // this process: by address
  INFO(s.to_string());
  REQUIRE(s.ok());
  REQUIRE(gpu->take_standby().ok());
  auto cpu = KvCache::make(config, 2).value();
  REQUIRE(cpu.set_weights(weights).ok());
  step(*gpu, cpu, {{0, 256}, {0, 4}, {1, 256}}, 1e-4, "after the copy");
  std::vector<float> back(weights.layout().total());
  REQUIRE(gpu->read_weights(back.data()).ok());
  CHECK(std::memcmp(back.data(), weights.params(), back.size() * sizeof(float)) == 0);

  auto elsewhere = *shared;
  elsewhere.device = "cuda:not-this-one";
  CHECK(gpu->copy_into_standby(elsewhere).code() == troupe::ErrorCode::unsupported);
}

TEST_CASE("gpu decoder: greedy generation gives the CPU's tokens and log-probabilities (fp32)", "[gpu][rl]") {
  const GptConfig config = small(false);
  auto model = Gpt<float>::make(config).value();
  model.init_random(5);
  auto cpu = KvCache::make(config, 8).value();
  auto gpu = make_gpu_decoder(config, 8, MatmulPrecision::fp32);
  REQUIRE(gpu->set_weights(model).ok());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) prompts.push_back({256, 10 + i, 20 + i % 3});  // 12 prompts: two waves of 8 slots
  SamplingParams greedy{.temperature = 0, .max_new_tokens = 20, .stop_token = -1, .seed = 1};
  auto want = generate(model, cpu, prompts, greedy);
  auto got = generate(*gpu, prompts, greedy);
  REQUIRE(want.has_value());
  REQUIRE(got.has_value());
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i);
    CHECK((*got)[i].tokens == (*want)[i].tokens);
    REQUIRE((*got)[i].logprobs.size() == (*want)[i].logprobs.size());
    for (size_t t = 0; t < (*want)[i].logprobs.size(); ++t) {
      CHECK((*got)[i].logprobs[t] == Approx((*want)[i].logprobs[t]).margin(1e-4));
    }
  }
  // Scoring the generated sequences gives the generation's log-probabilities.
  std::vector<std::vector<int32_t>> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs.push_back(prompts[i]);
    seqs.back().insert(seqs.back().end(), (*got)[i].tokens.begin(), (*got)[i].tokens.end());
  }
  auto scored = score(*gpu, seqs);
  REQUIRE(scored.has_value());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& lp = (*scored)[i];
    const size_t first = prompts[i].size() - 1;  // the first generated token's log-probability
    for (size_t t = 0; t < (*got)[i].logprobs.size(); ++t) {
      CHECK(lp[first + t] == Approx((*got)[i].logprobs[t]).margin(1e-4));
    }
  }
}

TEST_CASE("gpu decoder: bad rows and shapes are refused and leave the cache as it was", "[gpu][rl]") {
  const GptConfig config = small(true);
  auto model = Gpt<float>::make(config).value();
  model.init_random(6);
  auto gpu = make_gpu_decoder(config, 2, MatmulPrecision::fp32);
  std::vector<float> logits(64 * config.vocab_size);
  std::vector<DecodeRow> one = {{0, 1}};
  CHECK(gpu->append(one, logits.data()).code() == troupe::ErrorCode::invalid_argument);  // no weights yet
  REQUIRE(gpu->set_weights(model).ok());
  REQUIRE(gpu->append(prompt(0, {256, 1, 2}), logits.data()).ok());
  std::vector<DecodeRow> bad_slot = {{0, 3}, {2, 1}};
  CHECK(gpu->append(bad_slot, logits.data()).code() == troupe::ErrorCode::invalid_argument);
  std::vector<DecodeRow> bad_token = {{1, 259}};
  CHECK(gpu->append(bad_token, logits.data()).code() == troupe::ErrorCode::invalid_argument);
  CHECK(gpu->length(0) == 3);
  CHECK(gpu->length(1) == 0);
  // Filling a slot to the context: the row past it is refused, naming it.
  std::vector<DecodeRow> fill(config.context_length - 3, DecodeRow{0, 5});
  REQUIRE(gpu->append(fill, logits.data()).ok());
  auto full = gpu->append(one, logits.data());
  CHECK(full.code() == troupe::ErrorCode::invalid_argument);
  CHECK_THAT(full.message(), Catch::Contains("is full"));
  CHECK(gpu->length(0) == config.context_length);
  // Weights of another shape.
  auto other = Gpt<float>::make(small(false)).value();
  CHECK(gpu->set_weights(other).code() == troupe::ErrorCode::invalid_argument);
  // No slots, and a context the attention kernel cannot hold.
  auto none = make_device_decoder(config, 0, {.kind = DeviceKind::cuda});
  REQUIRE_FALSE(none.has_value());
  CHECK(none.error().code() == troupe::ErrorCode::invalid_argument);
  GptConfig long_context = config;
  long_context.context_length = 1 << 15;
  auto too_long = make_device_decoder(long_context, 1, {.kind = DeviceKind::cuda});
  REQUIRE_FALSE(too_long.has_value());
  CHECK(too_long.error().code() == troupe::ErrorCode::unsupported);
}
