// The trainer's device path (model/device_model.h) on a machine without a
// GPU: a PolicyTrainer on a device model takes the same steps as on the CPU
// model (the device here is the CPU model behind the interface, so the bits
// must agree), resident or offloaded, and moves between host and device
// only what each way promises; it refuses what the device cannot compute,
// and a job asking for a GPU where there is none is refused with the
// reason. The CUDA model itself: test/gpu.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "config/rl_config.h"
#include "controller/rl_job.h"
#include "model/device_model.h"
#include "model/gpt.h"
#include "model/kv_cache.h"
#include "support/counting_device.h"
#include "support/decoder_standby.h"
#include "support/scoped_env.h"
#include "train/policy_trainer.h"
#include "troupe/init.h"

using namespace troupe::rl;
using troupe::ErrorCode;
using troupe::Status;
using troupe::test::CountingDevice;

namespace {

model::GptConfig tiny() {
  return model::GptConfig{.vocab_size = 20, .context_length = 12, .layers = 2, .heads = 2, .channels = 16};
}

model::Gpt<float> seeded(const model::GptConfig& c) {
  auto m = model::Gpt<float>::make(c).value();
  m.init_random(11);
  return m;
}

// Two prompt groups' worth of sequences with logprobs and advantages.
train::TrainBatch policy_batch(const model::GptConfig& c) {
  std::vector<train::TrainSequence> seqs;
  for (int i = 0; i < 6; ++i) {
    train::TrainSequence s;
    s.prompt = {1, static_cast<int32_t>(2 + i), 3};
    s.completion = {static_cast<int32_t>(4 + i % 3), static_cast<int32_t>(7 + i), 2};
    s.completion_logprobs = {-1.5f - 0.1f * static_cast<float>(i), -2.0f, -0.7f};
    s.advantage = (i % 2 == 0 ? 1.0 : -1.0) * (0.5 + 0.1 * i);
    seqs.push_back(s);
  }
  return train::make_train_batch(seqs, c.context_length, 0).value();
}

model::AdamWConfig optim() {
  model::AdamWConfig o;
  o.learning_rate = 1e-2;
  return o;
}

// `steps` policy steps of each trainer on `batch`: the same losses, norms
// and learning rates, bit for bit.
void check_same_policy_steps(train::PolicyTrainer& cpu, train::PolicyTrainer& on_device,
                             const train::TrainBatch& batch, const model::PolicyLossConfig& loss, int steps) {
  for (int step = 0; step < steps; ++step) {
    INFO("step " << step);
    auto a = cpu.policy_step(batch, loss);
    auto b = on_device.policy_step(batch, loss);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->loss == b->loss);
    CHECK(a->grad_norm == b->grad_norm);
    CHECK(a->learning_rate == b->learning_rate);
    CHECK(a->grad_norm > 0);
    CHECK(on_device.optimizer_steps() == cpu.optimizer_steps());
  }
}

// A CPU trainer, and a counted host-kind device model for the other.
struct Pair {
  model::GptConfig c = tiny();
  train::TrainBatch batch = policy_batch(c);
  model::PolicyLossConfig loss;  // no KL penalty
  train::PolicyTrainer cpu{seeded(c), optim()};
  CountingDevice dev{model::make_device_model(c, {.kind = model::DeviceKind::host}).value()};
};

}  // namespace

TEST_CASE("policy trainer: offloaded to a device model (a ZeRO-1 range) it takes the CPU model's steps, bit for "
          "bit, re-uploading the host's weights each step",
          "[rl][train]") {
  Pair p;
  auto& [c, batch, loss, cpu, dev] = p;
  const size_t n = cpu.layout().total();
  train::PolicyTrainer on_device(seeded(c), optim(), model::ParamRange{0, n}, &dev);
  CHECK_FALSE(on_device.resident());
  check_same_policy_steps(cpu, on_device, batch, loss, 3);
  CHECK(std::memcmp(cpu.model().params(), on_device.model().params(), n * sizeof(float)) == 0);
  CHECK(dev.uploads == 3);
  CHECK(dev.gradient_downloads == 3);
  CHECK(dev.device_steps == 0);  // the host's optimizer
  // Weights replaced on the host (a copied state, a collective) are the
  // ones the next step computes with.
  auto other = seeded(c);
  for (size_t i = 0; i < n; ++i) other.params()[i] *= 0.5f;
  std::memcpy(cpu.edit_model().params(), other.params(), n * sizeof(float));
  std::memcpy(on_device.edit_model().params(), other.params(), n * sizeof(float));
  auto a = cpu.supervised_step(batch);
  auto b = on_device.supervised_step(batch);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->loss == b->loss);
  CHECK(std::memcmp(cpu.model().params(), on_device.model().params(), n * sizeof(float)) == 0);
}

TEST_CASE("policy trainer: resident on a device model it takes the CPU model's steps bit for bit, and only the "
          "losses cross per step",
          "[rl][train]") {
  Pair p;
  auto& [c, batch, loss, cpu, dev] = p;
  train::PolicyTrainer on_device(seeded(c), optim(), std::nullopt, &dev);
  REQUIRE(on_device.resident());
  const size_t n = cpu.layout().total();
  check_same_policy_steps(cpu, on_device, batch, loss, 3);
  // The state went in once and nothing came back during the steps.
  CHECK(dev.uploads == 1);
  CHECK(dev.state_uploads == 1);
  CHECK(dev.downloads == 0);
  CHECK(dev.gradient_downloads == 0);
  CHECK(dev.state_downloads == 0);
  CHECK(dev.device_steps == 3);

  // A copy of all the parameters comes straight from the device (a weight
  // sync's); reading the model brings the host's copy up to date, once.
  std::vector<float> whole(n);
  REQUIRE(on_device.copy_params(whole.data(), n).ok());
  CHECK(std::memcmp(whole.data(), cpu.model().params(), n * sizeof(float)) == 0);
  CHECK(dev.downloads == 1);
  CHECK(std::memcmp(cpu.model().params(), on_device.model().params(), n * sizeof(float)) == 0);
  CHECK(dev.downloads == 2);
  std::vector<float> part(n / 2);
  REQUIRE(on_device.copy_params(part.data(), part.size()).ok());
  CHECK(std::memcmp(part.data(), cpu.model().params(), part.size() * sizeof(float)) == 0);
  CHECK(dev.downloads == 2);  // from the host's copy, current now
  CHECK_FALSE(on_device.copy_params(whole.data(), n + 1).ok());
  // The optimizer's state, the same as the CPU's.
  CHECK(on_device.optimizer().steps() == 3);
  CHECK(on_device.optimizer().m() == cpu.optimizer().m());
  CHECK(on_device.optimizer().v() == cpu.optimizer().v());
  CHECK(dev.state_downloads == 1);

  // What the host writes (a copied state, a checkpoint) is what the next
  // step computes with, sent once.
  auto other = seeded(c);
  for (size_t i = 0; i < n; ++i) other.params()[i] *= 0.5f;
  std::memcpy(cpu.edit_model().params(), other.params(), n * sizeof(float));
  std::memcpy(on_device.edit_model().params(), other.params(), n * sizeof(float));
  std::vector<float> m(n, 1e-3f), v(n, 1e-4f);
  REQUIRE(cpu.edit_optimizer().restore(m, v, 7).ok());
  REQUIRE(on_device.edit_optimizer().restore(m, v, 7).ok());
  for (int step = 0; step < 2; ++step) {
    auto a = cpu.supervised_step(batch);
    auto b = on_device.supervised_step(batch);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->loss == b->loss);
    CHECK(a->grad_norm == b->grad_norm);
    CHECK(a->learning_rate == b->learning_rate);
  }
  CHECK(dev.uploads == 2);
  CHECK(dev.state_uploads == 2);
  CHECK(on_device.optimizer_steps() == 9);
  CHECK(std::memcmp(cpu.model().params(), on_device.model().params(), n * sizeof(float)) == 0);
  CHECK(on_device.optimizer().m() == cpu.optimizer().m());

  // Data parallelism's pieces: the gradients to reduce are the device's.
  auto g = on_device.gradients();
  REQUIRE(g);
  CHECK(*g != on_device.model().grads());
  REQUIRE(on_device.zero_gradients().ok());
  auto zeroed = on_device.gradients();
  REQUIRE(zeroed);
  CHECK(std::all_of(*zeroed, *zeroed + n, [](float x) { return x == 0.0f; }));
}

TEST_CASE("policy trainer: the device path refuses PPO (no value head there), naming the CPU model", "[rl][train]") {
  auto c = tiny();
  const auto batch = policy_batch(c);
  model::PolicyLossConfig loss;
  c.value_head = true;
  CountingDevice critic_dev(model::make_device_model(c, {.kind = model::DeviceKind::host}).value());
  train::PolicyTrainer ppo(seeded(c), optim(), std::nullopt, &critic_dev);
  std::vector<double> rewards(batch.B, 1.0);
  auto p = ppo.ppo_gradients(batch, rewards, loss, {});
  REQUIRE_FALSE(p);
  CHECK(p.error().code() == ErrorCode::unsupported);
  CHECK_THAT(p.error().message(), Catch::Contains("CPU model"));
  CHECK(critic_dev.uploads == 0);
}

TEST_CASE("device model: the CUDA model is made where a GPU is, and refused with what to use instead where none is",
          "[rl][train]") {
  auto made = model::make_device_model(tiny(), {.kind = model::DeviceKind::cuda});
  if (made) {
    CHECK_THAT((*made)->describe(), Catch::StartsWith("cuda:"));
    CHECK((*made)->device() >= 0);
  } else {
    CHECK(made.error().code() == ErrorCode::unsupported);
    CHECK_THAT(made.error().message(), Catch::Contains("CPU"));
  }
  // A bad config is the config's error, before any device is looked for.
  auto bad = tiny();
  bad.heads = 3;
  auto refused = model::make_device_model(bad, {});
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == ErrorCode::invalid_argument);
}

namespace {

// Runs a 2-step job of `section` (a TOML table asking for a GPU) in a
// cluster that offers a GPU its processes cannot see, and returns its error.
std::string job_error_without_gpus(const std::string& section) {
  // The job's worker processes inherit this: CUDA shows them no device,
  // on a GPU machine too.
  troupe::test::ScopedEnv hide("CUDA_VISIBLE_DEVICES", "");
  troupe::InitOptions options;
  options.runtime.log_level = "error";
  options.resources["CPU"] = 4;
  // The cluster offers a GPU its processes cannot use (a wrong --gpus).
  options.resources["GPU"] = 1;
  auto s = troupe::init(options);
  REQUIRE(s.has_value());
  const std::string text =
      "[run]\nsteps = 2\n[model]\ninit = \"random\"\n[algorithm]\nprompts_per_step = 2\n" + section;
  controller::JobOptions o;
  o.run_dir = (std::filesystem::temp_directory_path() / ("troupe-rl-dev-" + std::to_string(::getpid()))).string();
  o.progress = [](const std::string&) {};
  auto r = controller::run_rl_job((*s)->runtime(), (*s)->cluster(), text, o);
  std::error_code ec;
  std::filesystem::remove_all(o.run_dir, ec);
  REQUIRE_FALSE(r);
  return r.error().message();
}

}  // namespace

TEST_CASE("rl job: trainer.device = cuda where the processes see no GPU fails at the start, with the reason",
          "[rl][job]") {
  const std::string why = job_error_without_gpus("[trainer]\ndevice = \"cuda\"\n");
  INFO(why);
  // No GPU seen, or (a build without CUDA) no CUDA model at all.
  CHECK_THAT(why, Catch::Contains("trainer.device") &&
                      (Catch::Contains("no CUDA device") || Catch::Contains("not in this build")));
  CHECK_THAT(why, Catch::Contains("failed to start"));
}

TEST_CASE("rl job: rollout.device = cuda where the processes see no GPU fails at the start, with the reason",
          "[rl][job]") {
  const std::string why = job_error_without_gpus("[rollout]\ndevice = \"cuda\"\nbatch_invariant = false\n");
  INFO(why);
  CHECK_THAT(why, Catch::Contains("rollout.device") &&
                      (Catch::Contains("no CUDA device") || Catch::Contains("not in this build")));
  CHECK_THAT(why, Catch::Contains("rollout mesh") && Catch::Contains("failed to start"));
}

TEST_CASE("device decoder: the CUDA decoder is made where a GPU is, and refused with what to use instead where none is",
          "[rl][generate]") {
  auto made = model::make_device_decoder(tiny(), 4, {.kind = model::DeviceKind::cuda});
  if (made) {
    CHECK_THAT((*made)->describe(), Catch::StartsWith("cuda:"));
    CHECK((*made)->slots() == 4);
  } else {
    CHECK(made.error().code() == ErrorCode::unsupported);
    CHECK_THAT(made.error().message(), Catch::Contains("rollout.device = \"cpu\"") ||
                                           Catch::Contains("not in this build"));
  }
  // Bad configs and zero slots are refused before any device is looked for.
  auto bad = tiny();
  bad.heads = 3;
  auto refused = model::make_device_decoder(bad, 4, {});
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == ErrorCode::invalid_argument);
  auto none = model::make_device_decoder(tiny(), 0, {});
  REQUIRE_FALSE(none);
  CHECK(none.error().code() == ErrorCode::invalid_argument);
}

TEST_CASE(
    "device decoder: the host kind decodes with its weights while its standby is filled and runs the standby "
    "once taken, the CPU cache's logits bit for bit",
    "[rl][generate]") {
  const model::GptConfig config{.vocab_size = 259, .context_length = 32, .layers = 2, .heads = 4, .channels = 64};
  for (bool invariant : {true, false}) {
    INFO("batch_invariant " << invariant);
    auto d = model::make_device_decoder(config, 4, {.kind = model::DeviceKind::host, .batch_invariant = invariant});
    INFO((d ? std::string("ok") : d.error().to_string()));
    REQUIRE(d.has_value());
    CHECK_THAT((*d)->describe(), Catch::StartsWith("host"));
    troupe::test::check_decoder_standby(
        **d, [](float* standby, const float* host, size_t n) { std::memcpy(standby, host, n * sizeof(float)); },
        /*tol=*/0, invariant);
  }
  // The CPU cache runs a host model: it has no standby, and says what to use.
  auto cache = model::KvCache::make(config, 2).value();
  auto none = cache.standby_weights();
  REQUIRE_FALSE(none.has_value());
  CHECK(none.error().code() == ErrorCode::unsupported);
  CHECK_THAT(none.error().message(), Catch::Contains("set_weights"));
  CHECK(cache.take_standby().code() == ErrorCode::unsupported);
}

TEST_CASE(
    "device decoder: the host kind copies a device model's shared parameters of its own process into its "
    "standby, and refuses those out of its reach",
    "[rl][generate]") {
  const model::GptConfig config{.vocab_size = 259, .context_length = 32, .layers = 2, .heads = 4, .channels = 64};
  auto trainer = model::make_device_model(config, {.kind = model::DeviceKind::host}).value();
  auto weights = model::Gpt<float>::make(config).value();
  weights.init_random(7);
  REQUIRE(trainer->upload_params(weights.params()).ok());
  auto shared = trainer->share_params();
  REQUIRE(shared.has_value());
  CHECK(shared->device == "host");
  CHECK(shared->process == model::process_nonce());
  CHECK(shared->floats == weights.layout().total());

  auto d = model::make_device_decoder(config, 2, {.kind = model::DeviceKind::host}).value();
  REQUIRE(d->set_weights(model::Gpt<float>::make(config).value()).ok());  // zeros
  REQUIRE(d->copy_into_standby(*shared).ok());
  REQUIRE(d->take_standby().ok());
  auto cpu = model::KvCache::make(config, 2).value();
  REQUIRE(cpu.set_weights(weights).ok());
  troupe::test::check_same_step(*d, cpu, {{0, 256}, {0, 4}, {1, 256}}, /*tol=*/0, "after the copy");

  // Another process's, another device's, another model's: refused, the
  // standby untouched.
  auto elsewhere = *shared;
  elsewhere.process += 1;  // another process (pids repeat across PID namespaces: not the test)
  Status s = d->copy_into_standby(elsewhere);
  CHECK(s.code() == ErrorCode::unsupported);
  CHECK_THAT(s.message(), Catch::Contains("out of reach"));
  auto gpu = *shared;
  gpu.device = "cuda:0123";
  CHECK(d->copy_into_standby(gpu).code() == ErrorCode::unsupported);
  auto bigger = *shared;
  bigger.floats += 1;
  CHECK(d->copy_into_standby(bigger).code() == ErrorCode::invalid_argument);
  // The CPU cache takes nothing that way.
  CHECK(cpu.copy_into_standby(*shared).code() == ErrorCode::unsupported);
}

TEST_CASE("rl config: trainer.device and trainer.precision are checked against what the device runs", "[rl][config]") {
  auto refusal = [](const std::string& toml) {
    auto c = config::parse_rl_config(toml, "test.toml");
    REQUIRE_FALSE(c);
    return c.error().message();
  };
  CHECK_THAT(refusal("[trainer]\ndevice = \"tpu\"\n"), Catch::Contains("'trainer.device'") && Catch::Contains("cuda"));
  CHECK_THAT(refusal("[trainer]\ndevice = \"cuda\"\n[algorithm]\nname = \"ppo\"\n"),
             Catch::Contains("'trainer.device'") && Catch::Contains("PPO"));
  CHECK_THAT(refusal("[trainer]\ndevice = \"cuda\"\n[algorithm]\nentropy_coef = 0.01\n"),
             Catch::Contains("'algorithm.entropy_coef'"));
  CHECK_THAT(refusal("[trainer]\nprecision = \"bf16\"\n"), Catch::Contains("'trainer.precision'"));
  CHECK_THAT(refusal("[trainer]\ndevice = \"cuda\"\nprecision = \"fp8\"\n"), Catch::Contains("'trainer.precision'"));
  CHECK_THAT(refusal("[trainer]\ndevice = \"cuda\"\ngpus_per_rank = 0\n"), Catch::Contains("'trainer.gpus_per_rank'"));
  // The rollout engines' device: a GPU's products are not batch-invariant.
  CHECK_THAT(refusal("[rollout]\ndevice = \"cuda\"\n"),
             Catch::Contains("'rollout.batch_invariant'") && Catch::Contains("false"));
  CHECK_THAT(refusal("[rollout]\ndevice = \"gpu\"\n"), Catch::Contains("'rollout.device'"));
  CHECK_THAT(refusal("[rollout]\nprecision = \"tf32\"\n"), Catch::Contains("'rollout.precision'"));
  CHECK_THAT(refusal("[rollout]\ndevice = \"cuda\"\nbatch_invariant = false\ngpus_per_engine = 100\n"),
             Catch::Contains("'rollout.gpus_per_engine'"));
  auto engines = config::parse_rl_config(
      "[rollout]\ndevice = \"cuda\"\nbatch_invariant = false\nprecision = \"tf32\"\ngpus_per_engine = 0.25\n", "t");
  REQUIRE(engines);
  CHECK(engines->rollout.device == config::Device::cuda);
  CHECK(engines->rollout.precision == model::MatmulPrecision::tf32);
  CHECK(engines->rollout.gpus_per_engine == 0.25);
  auto ok = config::parse_rl_config("[trainer]\ndevice = \"cuda\"\nprecision = \"bf16\"\ngpus_per_rank = 0.5\n", "t");
  REQUIRE(ok);
  CHECK(ok->trainer.device == config::TrainerConfig::Device::cuda);
  CHECK(ok->trainer.precision == model::MatmulPrecision::bf16);
  CHECK(ok->trainer.gpus_per_rank == 0.5);
  // The host kind decodes as the CPU does (batch-invariant or not), in float32.
  CHECK_THAT(refusal("[rollout]\ndevice = \"host\"\nprecision = \"bf16\"\n"), Catch::Contains("'rollout.precision'"));
  auto host = config::parse_rl_config("[rollout]\ndevice = \"host\"\n", "t");
  REQUIRE(host);
  CHECK(host->rollout.device == config::Device::host);
  CHECK(host->rollout.batch_invariant);
}

TEST_CASE(
    "rl config: a broadcast goes from the trainer's device into the engines' decoders only when both are on the "
    "same kind of device and the trainer's state is resident",
    "[rl][config]") {
  auto direct = [](const std::string& extra) {
    auto c = config::parse_rl_config("[run]\nplacement = \"disaggregated\"\n" + extra, "t");
    INFO((c ? std::string("ok") : c.error().message()));
    REQUIRE(c);
    return config::device_weight_broadcast(*c);
  };
  const std::string both = "[trainer]\ndevice = \"host\"\n[rollout]\ndevice = \"host\"\n";
  CHECK(direct(both + "weight_sync = \"broadcast\"\n"));
  CHECK_FALSE(direct(both));  // by reads
  CHECK_FALSE(direct("[trainer]\ndevice = \"host\"\n[rollout]\nweight_sync = \"broadcast\"\n"));
  CHECK_FALSE(direct("[rollout]\ndevice = \"host\"\nweight_sync = \"broadcast\"\n"));
  CHECK_FALSE(
      direct("[trainer]\ndevice = \"host\"\n[rollout]\ndevice = \"cuda\"\nbatch_invariant = false\n"
             "weight_sync = \"broadcast\"\n"));
  // ZeRO-1 keeps the parameters on the host.
  CHECK_FALSE(
      direct("[trainer]\ndevice = \"host\"\nranks = 2\nshard_optimizer = true\n[rollout]\nengines = 2\n"
             "device = \"host\"\nweight_sync = \"broadcast\"\n"));
  CHECK(
      direct("[trainer]\ndevice = \"cuda\"\n[rollout]\ndevice = \"cuda\"\nbatch_invariant = false\n"
             "weight_sync = \"broadcast\"\n"));
}
