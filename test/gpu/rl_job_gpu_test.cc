// The RL job on a GPU (trainer.device and rollout.device = "cuda",
// rl/model/device_model.h): the device model that make_device_model loads
// from libtroupe_rl_cuda, a PolicyTrainer's steps on it (offloaded and
// resident) against the same steps on the CPU, and the README's main job with its trainer rank and rollout
// engine on the GPU (and with the trainer alone there) learning as it does
// on the CPU.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "controller/rl_job.h"
#include "model/device_model.h"
#include "support/counting_device.h"
#include "model/gpt.h"
#include "train/batch.h"
#include "train/policy_trainer.h"
#include "troupe/init.h"

using namespace troupe::rl;
namespace fs = std::filesystem;

namespace {

model::GptConfig small() {
  return model::GptConfig{.vocab_size = 259, .context_length = 24, .layers = 2, .heads = 4, .channels = 64};
}

model::Gpt<float> seeded(const model::GptConfig& c) {
  auto m = model::Gpt<float>::make(c).value();
  m.init_random(5);
  return m;
}

train::TrainBatch policy_batch(const model::GptConfig& c) {
  std::vector<train::TrainSequence> seqs;
  for (int i = 0; i < 16; ++i) {
    train::TrainSequence s;
    s.prompt = {256, static_cast<int32_t>('0' + i % 10), '+', static_cast<int32_t>('0' + (i * 3) % 10), '='};
    s.completion = {static_cast<int32_t>('0' + (i * 7) % 10), static_cast<int32_t>('0' + i % 4), 257};
    s.completion_logprobs = {-2.0f - 0.05f * static_cast<float>(i), -1.0f, -0.3f};
    s.advantage = (i % 2 == 0 ? 1.0 : -1.0) * (0.2 + 0.05 * i);
    seqs.push_back(s);
  }
  return train::make_train_batch(seqs, c.context_length, 258).value();
}

double relative_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

TEST_CASE("gpu trainer: the CUDA device model's policy steps follow the CPU model's in fp32 offloaded and resident",
          "[gpu][rl]") {
  const auto c = small();
  // Offloaded: the gradients come back to the host's AdamW each step (what
  // ZeRO-1 does); resident: they stay on the GPU with its AdamW.
  const bool resident = GENERATE(false, true);
  INFO((resident ? "resident" : "offloaded"));
  auto made = model::make_device_model(c, {.kind = model::DeviceKind::cuda, .device = 0});
  INFO((made ? (*made)->describe() : made.error().to_string()));
  REQUIRE(made.has_value());
  CHECK_THAT((*made)->describe(), Catch::StartsWith("cuda:0 "));
  troupe::test::CountingDevice dev(std::move(*made));
  model::AdamWConfig optim;
  optim.learning_rate = 1e-3;
  train::PolicyTrainer cpu(seeded(c), optim);
  const size_t n = cpu.layout().total();
  std::optional<model::ParamRange> range;
  if (!resident) range = model::ParamRange{0, n};
  train::PolicyTrainer gpu(seeded(c), optim, range, &dev);
  REQUIRE(gpu.resident() == resident);
  const auto batch = policy_batch(c);
  model::PolicyLossConfig loss;
  std::vector<float> g(n);
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    // The gradient to fp32's tolerance (the GPU sums in another order)...
    auto a = cpu.policy_gradients(batch, loss);
    auto b = gpu.policy_gradients(batch, loss);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(std::abs(a->loss - b->loss) <= 1e-4 * std::max(1.0, std::abs(a->loss)));
    if (!resident) CHECK(relative_l2(gpu.model().grads(), cpu.model().grads(), n) < 1e-4);
    // ...then AdamW on each: an element whose tiny gradient flips sign
    // moves by 2 x lr, so the weights agree more loosely.
    REQUIRE(cpu.apply_gradients(*a).ok());
    REQUIRE(gpu.apply_gradients(*b).ok());
    CHECK(std::abs(a->grad_norm - b->grad_norm) <= 1e-3 * a->grad_norm);
    CHECK(a->learning_rate == b->learning_rate);
    CHECK(relative_l2(gpu.model().params(), cpu.model().params(), n) < 1e-2);
  }
  if (resident) {
    // In once; out only when read (each step's check above); the
    // gradients never.
    CHECK(dev.uploads == 1);
    CHECK(dev.downloads == 3);
    CHECK(dev.gradient_downloads == 0);
    CHECK(dev.device_steps == 3);
    CHECK(gpu.optimizer_steps() == 3);
    // The GPU's moments, against the CPU's.
    CHECK(relative_l2(gpu.optimizer().v().data(), cpu.optimizer().v().data(), n) < 1e-2);
    CHECK(gpu.optimizer().steps() == 3);
    // The gradients for the allreduce are device memory.
    auto grads = gpu.gradients();
    REQUIRE(grads);
    cudaPointerAttributes attr{};
    REQUIRE(cudaPointerGetAttributes(&attr, *grads) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeDevice);
  } else {
    CHECK(dev.uploads == 3);
    CHECK(dev.gradient_downloads == 3);
    CHECK(dev.device_steps == 0);
  }
  // Bad input is the device's error, not a crash.
  train::TrainBatch too_long = batch;
  too_long.T = c.context_length + 1;
  too_long.tokens.assign(too_long.B * too_long.T, 1);
  too_long.targets = too_long.tokens;
  too_long.mask.assign(too_long.B * too_long.T, 1.0f);
  too_long.old_logprobs.assign(too_long.B * too_long.T, -1.0f);
  too_long.advantages.assign(too_long.B * too_long.T, 1.0f);
  CHECK_FALSE(gpu.policy_step(too_long, loss).has_value());
}

namespace {

/// Text replacements in a config: each `first` by its `second`.
using Edits = std::vector<std::pair<std::string, std::string>>;

/// The "event" lines of `kind` in a metrics file.
std::vector<nlohmann::json> events_of(const fs::path& metrics, const std::string& kind) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("event", "") == kind) out.push_back(std::move(j));
  }
  return out;
}

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/// Runs the GPU example (with `edits` made to its text) and checks that it
/// learns, with the meshes on the devices `expect` names; `check_metrics`
/// then reads its metrics.jsonl.
void check_gpu_example_learns(const Edits& edits, const std::vector<std::string>& expect,
                              const std::function<void(const fs::path&)>& check_metrics = {}) {
  // A bundle run on another machine (scripts/gpu.sh) names where the
  // examples are there.
  const char* examples = std::getenv("TROUPE_EXAMPLES_DIR");
  std::ifstream in(std::string(examples != nullptr ? examples : TROUPE_EXAMPLES_DIR) + "/rl/arithmetic_grpo_cuda.toml");
  std::ostringstream text;
  text << in.rdbuf();
  std::string config = text.str();
  REQUIRE_FALSE(config.empty());
  for (const auto& [from, to] : edits) {
    const size_t at = config.find(from);
    INFO("the example has \"" << from << "\"");
    REQUIRE(at != std::string::npos);
    config.replace(at, from.size(), to);
  }
  const fs::path dir = fs::temp_directory_path() / ("troupe-rl-gpu-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  troupe::InitOptions options;
  options.runtime.log_level = "error";
  auto s = troupe::init(options);
  REQUIRE(s.has_value());
  controller::JobOptions o;
  o.run_dir = dir.string();
  std::vector<std::string> lines;
  o.progress = [&](const std::string& line) { lines.push_back(line); };
  auto r = controller::run_rl_job((*s)->runtime(), (*s)->cluster(), config, o);
  if (r && check_metrics) check_metrics(dir / "metrics.jsonl");
  std::error_code ec;
  fs::remove_all(dir, ec);
  INFO((r ? std::string("ok") : r.error().to_string()));
  REQUIRE(r.has_value());
  for (const auto& want : expect) {
    bool seen = false;
    for (const auto& l : lines) seen |= l.find(want) != std::string::npos;
    INFO("a progress line with \"" << want << "\"");
    CHECK(seen);
  }
  REQUIRE(r->evals.size() >= 2);
  const double before = r->evals.front().second, after = r->evals.back().second;
  INFO("held-out accuracy " << before << " -> " << after);
  CHECK(after > 0.85);
  CHECK(after > before + 0.25);
}

}  // namespace

TEST_CASE("gpu job: the main example with its trainer rank and rollout engine on the GPU learns arithmetic",
          "[gpu][rl][job]") {
  check_gpu_example_learns({}, {"trainer rank 0 on cuda:", "rollout engine 0 on cuda:"}, [](const fs::path& m) {
    // Colocated on one GPU: every sync copies the trainer's parameters
    // into the decoder's standby on the device.
    auto steps = events_of(m, "step");
    REQUIRE(steps.size() == 300);
    for (const auto& st : steps) CHECK(st["synced_into_device"] == 1);
    CHECK(events_of(m, "weight_sync_device_copy").empty());
  });
}

TEST_CASE(
    "gpu job: a weight broadcast goes by NCCL from the trainer's GPU into the engine's decoder on two GPUs, or "
    "on one GPU the engine copies them by CUDA IPC once NCCL has refused twice, and learns either way",
    "[gpu][rl][job][nccl]") {
  // One GPU: the trainer rank and the engine share it (half each), and
  // NCCL refuses two ranks on one device.
  const bool two = device_count() >= 2;
  const std::string share = two ? "1" : "0.5";
  const Edits edits{
      {"placement = \"colocated\"", "placement = \"disaggregated\""},
      {"precision = \"fp32\"", "precision = \"fp32\"\ngpus_per_rank = " + share},
      {"batch_invariant = false", "batch_invariant = false\nweight_sync = \"broadcast\"\ngpus_per_engine = " + share}};
  check_gpu_example_learns(edits, {"trainer rank 0 on cuda:", "rollout engine 0 on cuda:"}, [&](const fs::path& m) {
    auto steps = events_of(m, "step");
    REQUIRE(steps.size() == 300);
    auto faults = events_of(m, "fault");
    if (two) {
      for (const auto& st : steps) {
        CHECK(st["synced_into_device"] == 1);
        CHECK(st["synced_from_device"] == true);
      }
      CHECK(faults.empty());
    } else {
      // Refused twice in a row, with NCCL's reason; from then on the engine
      // copies the trainer's parameters on their shared GPU by CUDA IPC.
      REQUIRE(faults.size() == 2);
      CHECK_THAT(faults[0].dump(), Catch::Contains("NCCL") && Catch::Contains("made again"));
      CHECK_THAT(faults[1].dump(), Catch::Contains("NCCL") && Catch::Contains("read the weights from now on"));
      for (size_t i = 1; i < steps.size(); ++i) {  // step 1's sync was the second refusal
        CHECK(steps[i]["synced_into_device"] == 1);
        CHECK(steps[i]["synced_from_device"] == false);
      }
      CHECK(events_of(m, "weight_sync_device_copy").empty());
    }
  });
}

TEST_CASE("gpu job: the main example with only its trainer rank on the GPU learns arithmetic", "[gpu][rl][job]") {
  check_gpu_example_learns({{"device = \"cuda\"\nbatch_invariant = false", "device = \"cpu\""}},
                           {"trainer rank 0 on cuda:"});
}
