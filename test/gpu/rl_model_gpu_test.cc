// The policy model's CUDA path (rl/model/cuda/gpt_cuda.h) against the CPU
// model (gpt.h) on the same parameters: the per-position losses and every
// gradient tensor (tied and untied embeddings; float32, TF32 and bf16
// products, each to its tolerance), the gradient accumulating over two
// backwards, a second batch shape; AdamW's step against the CPU AdamW on the
// same gradients (clipping, schedule, moments, a NaN gradient refused);
// training lowering the loss; bit-exact parameter round trips; bad inputs
// refused; an inference-only model's memory and refusals.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "model/adamw.h"
#include "model/cuda/gpt_cuda.h"
#include "model/gpt.h"

using namespace troupe::rl::model;

namespace {

GptConfig small(bool tied) {
  return GptConfig{
      .vocab_size = 259, .context_length = 32, .layers = 2, .heads = 4, .channels = 64, .tied_embeddings = tied};
}

/// How GptCuda computes, and how close to the float32 CPU model that is.
struct Mode {
  const char* name;
  GptCudaOptions options;
  double loss_tol;  // per position, relative
  double grad_tol;  // per tensor, relative L2 error
};

const Mode kFp32{"fp32", {.device = 0, .bf16_matmuls = false, .tf32 = false}, 1e-5, 1e-4};
const Mode kTf32{"tf32", {.device = 0, .bf16_matmuls = false, .tf32 = true}, 5e-3, 2e-2};
// bf16 rounds every product's inputs (8 significant bits): gradients agree
// to about 1% (0.6% on a CPU emulation); layout or index bugs give errors
// of order 1.
const Mode kBf16{"bf16", {.device = 0, .bf16_matmuls = true, .tf32 = false}, 2e-2, 5e-2};

struct Batch {
  std::vector<int32_t> tokens, targets;
  std::vector<float> dlosses;
};

Batch random_batch(size_t B, size_t T, size_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V) - 1);
  std::uniform_real_distribution<float> w(-1.0f, 1.0f);
  Batch b;
  for (size_t i = 0; i < B * T; ++i) {
    b.tokens.push_back(tok(rng));
    b.targets.push_back(tok(rng));
    b.dlosses.push_back(i % 7 == 3 ? 0.0f : w(rng));  // some positions masked out
  }
  return b;
}

/// ||a - b|| / ||b|| over n values; 0 when both are zero, infinity when
/// only b is.
double relative_l2(const float* a, const float* b, size_t n) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    ref += static_cast<double>(b[i]) * b[i];
  }
  if (ref == 0) return diff == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / ref);
}

/// The tensor of `layout` whose gradients differ most, relatively. The
/// attention's qkv weight counts as three (q, k, v): the values' gradient
/// is the largest at initialisation and would hide an error in the others.
std::pair<double, std::string> worst_tensor(const ParamLayout& layout, const float* gpu, const float* cpu) {
  double worst = 0;
  std::string at = "none";
  auto consider = [&](size_t offset, size_t count, const std::string& name) {
    double e = relative_l2(gpu + offset, cpu + offset, count);
    if (!(e <= worst)) {  // NaN counts as worst
      worst = e;
      at = name;
    }
  };
  for (const TensorSpec& t : layout.tensors()) {
    if (t.name.ends_with("attn.qkv.weight")) {
      const size_t third = t.count / 3;
      consider(t.offset, third, t.name + " (q)");
      consider(t.offset + third, third, t.name + " (k)");
      consider(t.offset + 2 * third, third, t.name + " (v)");
    } else {
      consider(t.offset, t.count, t.name);
    }
  }
  return {worst, at};
}

double worst_loss_error(const std::vector<float>& gpu, const float* cpu) {
  double worst = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    double e = std::abs(static_cast<double>(gpu[i]) - cpu[i]) / std::max(1e-6, std::abs(static_cast<double>(cpu[i])));
    if (!(e <= worst)) worst = e;
  }
  return worst;
}

/// Forward + backward on both models from the same state; checks losses
/// and gradients. Gradients are not zeroed first: they accumulate.
void check_step(Gpt<float>& cpu, GptCuda& gpu, const Batch& b, size_t B, size_t T, const Mode& mode) {
  REQUIRE(cpu.forward(b.tokens.data(), b.targets.data(), B, T).ok());
  REQUIRE(gpu.forward(b.tokens.data(), b.targets.data(), B, T).ok());
  std::vector<float> losses(B * T);
  REQUIRE(gpu.losses(losses.data()).ok());
  double loss_err = worst_loss_error(losses, cpu.losses());
  INFO("worst per-position loss error " << loss_err);
  CHECK(loss_err <= mode.loss_tol);

  cpu.backward(b.dlosses.data());
  REQUIRE(gpu.backward(b.dlosses.data()).ok());
  std::vector<float> grads(cpu.layout().total());
  REQUIRE(gpu.download_grads(grads.data()).ok());
  auto [err, at] = worst_tensor(cpu.layout(), grads.data(), cpu.grads());
  INFO("worst gradient tensor " << at << ": relative L2 error " << err);
  CHECK(err <= mode.grad_tol);
}

GptCuda make_gpu(const GptConfig& config, const GptCudaOptions& options) {
  auto gpu = GptCuda::make(config, options);
  INFO((gpu ? std::string("ok") : gpu.error().to_string()));
  REQUIRE(gpu.has_value());
  return std::move(*gpu);
}

/// A CPU model of `config` with random parameters (`seed`) and a GPU
/// model holding the same, both with zero gradients.
struct ModelPair {
  Gpt<float> cpu;
  GptCuda gpu;
};
ModelPair same_models(const GptConfig& config, const GptCudaOptions& options, uint64_t seed) {
  auto cpu = Gpt<float>::make(config).value();
  cpu.init_random(seed);
  GptCuda gpu = make_gpu(config, options);
  REQUIRE(gpu.init_from(cpu).ok());
  cpu.zero_grad();
  REQUIRE(gpu.zero_grad().ok());
  return {std::move(cpu), std::move(gpu)};
}

}  // namespace

TEST_CASE("gpu model: losses and every gradient match the CPU model (tied and untied, fp32/tf32/bf16)", "[gpu][rl]") {
  for (bool tied : {true, false}) {
    for (const Mode& mode : {kFp32, kTf32, kBf16}) {
      INFO("tied embeddings " << tied << ", mode " << mode.name);
      const GptConfig config = small(tied);
      auto [cpu, gpu] = same_models(config, mode.options, 11);

      // The full context, then (gradients accumulating) a smaller batch of
      // fewer positions, which reuses the activations.
      check_step(cpu, gpu, random_batch(4, 32, config.vocab_size, 5), 4, 32, mode);
      check_step(cpu, gpu, random_batch(3, 17, config.vocab_size, 6), 3, 17, mode);
      // A larger batch again: the activations grow.
      check_step(cpu, gpu, random_batch(6, 32, config.vocab_size, 7), 6, 32, mode);
    }
  }
}

TEST_CASE("gpu model: bf16's fused attention matches the CPU model over many 64-position tiles", "[gpu][rl]") {
  // Head sizes 64 and 96 (the kernels' tiles are 64 positions and their
  // products 16 wide); contexts of whole tiles, a partial last tile, and
  // less than one.
  for (size_t heads : {size_t{2}, size_t{3}}) {
    const GptConfig config{
        .vocab_size = 259, .context_length = 200, .layers = 2, .heads = heads, .channels = 192, .tied_embeddings = true};
    INFO("heads " << heads);
    auto [cpu, gpu] = same_models(config, kBf16.options, 13);
    CHECK(gpu.attention_fused());
    check_step(cpu, gpu, random_batch(2, 200, config.vocab_size, 8), 2, 200, kBf16);
    check_step(cpu, gpu, random_batch(3, 128, config.vocab_size, 9), 3, 128, kBf16);
    check_step(cpu, gpu, random_batch(4, 40, config.vocab_size, 10), 4, 40, kBf16);
  }
  // The unfused baseline, and a head size the kernels do not take (8): both
  // run unfused, to the same tolerance.
  GptCudaOptions unfused = kBf16.options;
  unfused.fused_attention = false;
  const GptConfig narrow{.vocab_size = 259, .context_length = 32, .layers = 1, .heads = 8, .channels = 64};
  for (auto [config, options] : {std::pair{small(true), unfused}, std::pair{narrow, kBf16.options}}) {
    auto [cpu, gpu] = same_models(config, options, 14);
    CHECK_FALSE(gpu.attention_fused());
    check_step(cpu, gpu, random_batch(3, 32, config.vocab_size, 11), 3, 32, kBf16);
  }
  CHECK(make_gpu(small(true), kBf16.options).attention_fused());
}

TEST_CASE("gpu model: zero_grad clears, and parameters and gradients round-trip bit-exactly", "[gpu][rl]") {
  const GptConfig config = small(false);
  GptCuda gpu = make_gpu(config, kFp32.options);
  const size_t P = gpu.layout().total();
  std::mt19937 rng(3);
  std::vector<float> host(P);
  for (size_t i = 0; i < P; ++i) {
    uint32_t bits = rng();
    std::memcpy(&host[i], &bits, sizeof bits);  // any bit pattern: NaNs, denormals, -0
  }
  REQUIRE(gpu.upload_params(host.data()).ok());
  std::vector<float> back(P, 1.0f);
  REQUIRE(gpu.download_params(back.data()).ok());
  CHECK(std::memcmp(host.data(), back.data(), P * sizeof(float)) == 0);

  REQUIRE(gpu.upload_grads(host.data()).ok());
  REQUIRE(gpu.download_grads(back.data()).ok());
  CHECK(std::memcmp(host.data(), back.data(), P * sizeof(float)) == 0);
  REQUIRE(gpu.zero_grad().ok());
  REQUIRE(gpu.download_grads(back.data()).ok());
  CHECK(std::all_of(back.begin(), back.end(), [](float x) { return x == 0.0f && !std::signbit(x); }));

  // A CPU checkpoint moves over unchanged.
  auto cpu = Gpt<float>::make(config).value();
  cpu.init_random(9);
  REQUIRE(gpu.init_from(cpu).ok());
  REQUIRE(gpu.download_params(back.data()).ok());
  CHECK(std::memcmp(cpu.params(), back.data(), P * sizeof(float)) == 0);
}

TEST_CASE("gpu model: the AdamW step matches the CPU AdamW on the same gradients", "[gpu][rl]") {
  const GptConfig config = small(true);
  auto cpu = Gpt<float>::make(config).value();
  cpu.init_random(21);
  GptCuda gpu = make_gpu(config, kFp32.options);
  REQUIRE(gpu.init_from(cpu).ok());
  const size_t P = cpu.layout().total();
  const AdamWConfig opt_config{.learning_rate = 1e-2,
                               .weight_decay = 0.1,
                               .clip_norm = 1.0,
                               .warmup_steps = 2,
                               .decay_steps = 6,
                               .min_lr_fraction = 0.1};
  AdamW opt(cpu.layout(), opt_config);
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  std::vector<float> g(P), cpu_g(P), back(P), m(P), v(P);
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    // Step 2 has small gradients (no clipping); the others are clipped.
    float scale = step == 2 ? 1e-4f : 1.0f;
    for (float& x : g) x = normal(rng) * scale;
    cpu_g = g;
    double cpu_norm = opt.step(cpu.params(), cpu_g.data());
    REQUIRE(gpu.upload_grads(g.data()).ok());
    auto gpu_norm = gpu.adamw_step(opt_config);
    REQUIRE(gpu_norm.has_value());
    CHECK(*gpu_norm == Approx(cpu_norm).epsilon(1e-9));
    CHECK(gpu.adamw_steps() == opt.steps());
    // The gradients as clipped in place.
    REQUIRE(gpu.download_grads(back.data()).ok());
    CHECK(relative_l2(back.data(), cpu_g.data(), P) <= 1e-6);
    REQUIRE(gpu.download_params(back.data()).ok());
    double worst = 0;
    for (size_t i = 0; i < P; ++i) worst = std::max(worst, std::abs(static_cast<double>(back[i]) - cpu.params()[i]));
    INFO("worst parameter difference " << worst);
    CHECK(worst <= 1e-5);  // a few float roundings apart (the GPU fuses multiply-adds)
    REQUIRE(gpu.download_adamw_state(m.data(), v.data()).ok());
    CHECK(relative_l2(m.data(), opt.m().data(), P) <= 1e-5);
    CHECK(relative_l2(v.data(), opt.v().data(), P) <= 1e-5);
  }

  // A NaN gradient: the norm says so and nothing changes, the step count
  // included.
  REQUIRE(gpu.download_params(back.data()).ok());
  std::vector<float> before = back;
  g[12345 % P] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE(gpu.upload_grads(g.data()).ok());
  auto nan_norm = gpu.adamw_step(opt_config);
  REQUIRE(nan_norm.has_value());
  CHECK(std::isnan(*nan_norm));
  CHECK(gpu.adamw_steps() == 4);
  REQUIRE(gpu.download_params(back.data()).ok());
  CHECK(std::memcmp(before.data(), back.data(), P * sizeof(float)) == 0);

  // The optimizer's state moves to another model and continues the same.
  GptCuda other = make_gpu(config, kFp32.options);
  REQUIRE(other.upload_params(before.data()).ok());
  REQUIRE(gpu.download_adamw_state(m.data(), v.data()).ok());
  REQUIRE(other.restore_adamw_state(m.data(), v.data(), gpu.adamw_steps()).ok());
  for (float& x : g) x = normal(rng);
  REQUIRE(gpu.upload_grads(g.data()).ok());
  REQUIRE(other.upload_grads(g.data()).ok());
  REQUIRE(gpu.adamw_step(opt_config).has_value());
  REQUIRE(other.adamw_step(opt_config).has_value());
  std::vector<float> a(P), b(P);
  REQUIRE(gpu.download_params(a.data()).ok());
  REQUIRE(other.download_params(b.data()).ok());
  CHECK(std::memcmp(a.data(), b.data(), P * sizeof(float)) == 0);
}

TEST_CASE("gpu model: AdamW steps on a fixed batch lower its loss (fp32 and bf16)", "[gpu][rl]") {
  for (const Mode& mode : {kFp32, kBf16}) {
    INFO("mode " << mode.name);
    const GptConfig config = small(true);
    auto cpu = Gpt<float>::make(config).value();
    cpu.init_random(5);
    GptCuda gpu = make_gpu(config, mode.options);
    REQUIRE(gpu.init_from(cpu).ok());
    // A sequence with structure to fit: each target is the next token.
    const size_t B = 4, T = 32, N = B * T;
    std::vector<int32_t> tokens(N), targets(N);
    for (size_t i = 0; i < N; ++i) {
      tokens[i] = static_cast<int32_t>((i * 7 + i / T) % 50);
      targets[i] = static_cast<int32_t>(((i + 1) * 7 + i / T) % 50);
    }
    std::vector<float> dlosses(N, 1.0f / static_cast<float>(N)), losses(N);
    const AdamWConfig opt{.learning_rate = 1e-2, .weight_decay = 0.0};
    auto mean_loss = [&] {
      REQUIRE(gpu.forward(tokens.data(), targets.data(), B, T).ok());
      REQUIRE(gpu.losses(losses.data()).ok());
      double s = 0;
      for (float x : losses) s += x;
      return s / static_cast<double>(N);
    };
    const double first = mean_loss();
    double last = first;
    for (int step = 0; step < 30; ++step) {
      REQUIRE(gpu.zero_grad().ok());
      REQUIRE(gpu.backward(dlosses.data()).ok());
      auto norm = gpu.adamw_step(opt);
      REQUIRE(norm.has_value());
      REQUIRE(std::isfinite(*norm));
      last = mean_loss();
    }
    INFO("mean loss " << first << " -> " << last);
    CHECK(std::isfinite(last));
    CHECK(last < 0.7 * first);
  }
}

TEST_CASE("gpu model: bad configs, devices and inputs are refused", "[gpu][rl]") {
  GptConfig bad = small(true);
  bad.heads = 5;  // 64 channels do not split into 5 heads
  auto refused = GptCuda::make(bad);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code() == troupe::ErrorCode::invalid_argument);
  GptConfig with_value_head = small(true);
  with_value_head.value_head = true;  // CPU-only
  auto no_head = GptCuda::make(with_value_head);
  REQUIRE_FALSE(no_head.has_value());
  CHECK(no_head.error().code() == troupe::ErrorCode::unsupported);
  CHECK_THAT(no_head.error().message(), Catch::Contains("value head"));
  auto no_device = GptCuda::make(small(true), {.device = 1 << 20});
  REQUIRE_FALSE(no_device.has_value());
  CHECK(no_device.error().code() == troupe::ErrorCode::unsupported);

  const GptConfig config = small(true);
  GptCuda gpu = make_gpu(config, kFp32.options);
  std::vector<float> dlosses(64 * 33, 1.0f), losses(64 * 33);
  CHECK(gpu.backward(dlosses.data()).code() == troupe::ErrorCode::invalid_argument);  // no forward yet
  CHECK(gpu.losses(losses.data()).code() == troupe::ErrorCode::invalid_argument);

  std::vector<int32_t> tokens(64 * 33, 1), targets(64 * 33, 2);
  CHECK(gpu.forward(tokens.data(), targets.data(), 2, 33).code() ==
        troupe::ErrorCode::invalid_argument);  // T > context
  CHECK(gpu.forward(tokens.data(), targets.data(), 0, 8).code() == troupe::ErrorCode::invalid_argument);
  CHECK(gpu.forward(tokens.data(), targets.data(), 2, 0).code() == troupe::ErrorCode::invalid_argument);
  CHECK(gpu.forward(nullptr, targets.data(), 2, 8).code() == troupe::ErrorCode::invalid_argument);
  CHECK(gpu.forward(tokens.data(), targets.data(), static_cast<size_t>(1) << 62, 32).code() ==
        troupe::ErrorCode::invalid_argument);  // too many positions
  REQUIRE(gpu.forward(tokens.data(), targets.data(), 2, 8).ok());
  tokens[5] = 259;  // one past the vocabulary
  CHECK(gpu.forward(tokens.data(), targets.data(), 2, 8).code() == troupe::ErrorCode::invalid_argument);
  tokens[5] = -1;
  CHECK(gpu.forward(tokens.data(), targets.data(), 2, 8).code() == troupe::ErrorCode::invalid_argument);
  tokens[5] = 1;
  targets[15] = 259;
  CHECK(gpu.forward(tokens.data(), targets.data(), 2, 8).code() == troupe::ErrorCode::invalid_argument);
  // A refused forward leaves the last good one usable.
  REQUIRE(gpu.backward(dlosses.data()).ok());
  REQUIRE(gpu.losses(losses.data()).ok());
  CHECK(std::isfinite(losses[0]));

  CHECK(gpu.upload_params(nullptr).code() == troupe::ErrorCode::invalid_argument);
  CHECK(gpu.download_grads(nullptr).code() == troupe::ErrorCode::invalid_argument);
  auto other = Gpt<float>::make(small(false)).value();
  CHECK(gpu.init_from(other).code() == troupe::ErrorCode::invalid_argument);  // untied: another layout
}

TEST_CASE("gpu model: an inference-only model allocates no gradients, runs forward, and refuses to train",
          "[gpu][rl]") {
  // Large enough that the gradients (50 MB) stand out from the allocator's
  // 2 MiB granularity and cuBLAS's workspace, which both models have.
  const GptConfig config{.vocab_size = 259, .context_length = 64, .layers = 4, .heads = 8, .channels = 512};
  const size_t grad_bytes = ParamLayout::make(config).value().total() * sizeof(float);
  auto device_bytes_of = [&](bool gradients) {
    size_t free_before = 0, free_after = 0, total = 0;
    REQUIRE(cudaMemGetInfo(&free_before, &total) == cudaSuccess);
    GptCuda gpu = make_gpu(config, {.gradients = gradients});
    REQUIRE(cudaMemGetInfo(&free_after, &total) == cudaSuccess);
    return static_cast<double>(free_before) - static_cast<double>(free_after);
  };
  const double trainable = device_bytes_of(true), inference = device_bytes_of(false);
  INFO("device memory: " << trainable << " bytes with gradients, " << inference << " without; gradients " << grad_bytes
                         << " bytes");
  CHECK(trainable - inference >= 0.95 * static_cast<double>(grad_bytes));
  CHECK(trainable - inference <= static_cast<double>(grad_bytes) + (4 << 20));

  auto cpu = Gpt<float>::make(config).value();
  cpu.init_random(3);
  GptCuda gpu = make_gpu(config, {.gradients = false});
  CHECK(gpu.device_grads() == nullptr);
  REQUIRE(gpu.init_from(cpu).ok());
  std::vector<float> back(cpu.layout().total());
  REQUIRE(gpu.download_params(back.data()).ok());
  CHECK(std::memcmp(back.data(), cpu.params(), back.size() * sizeof(float)) == 0);
  std::vector<int32_t> tokens(2 * 8, 5), targets(2 * 8, 6);
  REQUIRE(gpu.forward(tokens.data(), targets.data(), 2, 8).ok());
  std::vector<float> losses(2 * 8);
  REQUIRE(gpu.losses(losses.data()).ok());
  CHECK(std::isfinite(losses[0]));

  auto says_inference = [](const troupe::Status& s) {
    INFO(s.to_string());
    CHECK(s.code() == troupe::ErrorCode::invalid_argument);
    CHECK_THAT(s.message(), Catch::Contains("made for inference"));
  };
  std::vector<float> dlosses(2 * 8, 1.0f);
  says_inference(gpu.zero_grad());
  says_inference(gpu.backward(dlosses.data()));
  says_inference(gpu.upload_grads(back.data()));
  says_inference(gpu.download_grads(back.data()));
  says_inference(gpu.restore_adamw_state(back.data(), back.data(), 1));
  auto step = gpu.adamw_step(AdamWConfig{});
  REQUIRE_FALSE(step.has_value());
  says_inference(step.error());
  // Nothing it refused changed its parameters.
  REQUIRE(gpu.download_params(back.data()).ok());
  CHECK(std::memcmp(back.data(), cpu.params(), back.size() * sizeof(float)) == 0);
}
