// The rollout engine alone, in one process: continuous batching gives each
// sample what generate() gives it alone (the sample depends on its seed and
// index, not on its batch), a group waits for weights of its min_version,
// and new weights that arrive mid-generation are taken between decode steps
// by the sequences in flight (partial rollouts), each sample saying which
// versions made it.
#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "model/generate.h"
#include "rollout/rollout_engine.h"
#include "support/remote_actors.h"
#include "tasks/task.h"
#include "trainer/trainer_rank.h"

using namespace troupe::rl;
using troupe::test::test_config;

namespace {

// An engine and a trainer rank (the weights' publisher) in one runtime that
// listens (remote buffers need its node).
struct Engine {
  explicit Engine(const std::string& text)
      : config(config::parse_rl_config(text).value()),
        rt(test_config()),
        trainer(rt.spawn<trainer::TrainerRank>(text)),
        engine(rt.spawn<rollout::RolloutEngine>(text)) {}
  trainer::PublishedWeights publish(uint64_t version) {
    return trainer.ask(trainer::PublishWeights{version}).get().value();
  }
  config::RlConfig config;
  troupe::Runtime rt;
  troupe::ActorRef<trainer::TrainerRank> trainer;
  troupe::ActorRef<rollout::RolloutEngine> engine;
};

rollout::PromptGroup group(const config::RlConfig& c, uint64_t g, uint32_t samples) {
  return {g, tasks::prompt_tokens(tasks::rl_prompt(c, g).prompt), samples, tasks::group_seed(c, g)};
}

}  // namespace

TEST_CASE("rollout engine: continuous batching gives each sample what generate() gives it alone, bit for bit",
          "[rl][rollout]") {
  // 12 slots for 6 groups of 4: later groups join as earlier sequences end.
  Engine e("[run]\nseed = 5\n[model]\ninit = \"random\"\n[rollout]\nmax_sequences = 12\n");
  REQUIRE(e.engine.ask(rollout::SyncWeights{e.publish(0)}).get().has_value());
  std::vector<troupe::Future<std::vector<rollout::GroupSamples>>> replies;
  for (uint64_t g = 0; g < 6; ++g) replies.push_back(e.engine.ask(rollout::Generate{{group(e.config, g, 4)}, 0, -1}));
  // The same weights, each group generated alone in this thread.
  auto gpt = model::Gpt<float>::make(e.config.trainer_shape()).value();
  gpt.init_random(e.config.run.seed);
  auto cache = model::KvCache::make(e.config.model.shape, 4).value();
  size_t tokens = 0;
  for (uint64_t g = 0; g < 6; ++g) {
    auto got = replies[g].get().value();
    REQUIRE(got.size() == 1);
    REQUIRE(got[0].samples.size() == 4);
    const auto pg = group(e.config, g, 4);
    auto params = e.config.rollout_sampling();
    params.seed = pg.seed;
    std::vector<std::vector<int32_t>> prompts(4, pg.prompt);
    auto want = model::generate(gpt, cache, prompts, params).value();
    for (size_t i = 0; i < 4; ++i) {
      INFO("group " << g << " sample " << i);
      CHECK(got[0].samples[i].tokens == want[i].tokens);
      // Bit for bit: the decode's products are batch-invariant
      // (matmul_forward_invariant), so the batch a sample shared changes
      // nothing, and a resumed job trains on the same numbers.
      CHECK(got[0].samples[i].logprobs == want[i].logprobs);
      CHECK(got[0].samples[i].stop == static_cast<uint8_t>(want[i].stop));
      CHECK(got[0].samples[i].version_first == 0);
      tokens += want[i].tokens.size();
    }
  }
  auto report = e.engine.ask(rollout::GetEngineReport{}).get().value();
  CHECK(report.tokens_generated == tokens);
  CHECK(report.live == 0);
  CHECK(report.queued == 0);
}

TEST_CASE("rollout engine: a group waits for its weights, weights that arrive mid-generation go on in the "
          "sequences in flight",
          "[rl][rollout]") {
  // Long completions (24 tokens: a random model rarely says EOS) so that
  // the new weights arrive while they are in flight.
  Engine e("[run]\nseed = 5\n[model]\ninit = \"random\"\ncontext_length = 32\n[algorithm]\nmax_new_tokens = 24\n");
  // No weights yet: the group waits in the queue.
  auto waiting = e.engine.ask(rollout::Generate{{group(e.config, 0, 2)}, 0, -1});
  auto before = e.engine.ask(rollout::GetEngineReport{}).get().value();
  CHECK(before.version == rollout::kNoVersion);
  CHECK(before.queued == 2);
  CHECK_FALSE(waiting.ready());
  REQUIRE(e.engine.ask(rollout::SyncWeights{e.publish(0)}).get().has_value());
  auto first = waiting.get().value();
  CHECK(first[0].samples[0].version_first == 0);

  // A generation, then new weights right behind it in the mailbox: the
  // engine starts decoding, the reads complete between decode steps, and
  // the sequences go on with version 1.
  const auto v1 = e.publish(1);
  auto running = e.engine.ask(rollout::Generate{{group(e.config, 1, 8)}, 0, -1});
  auto sync = e.engine.ask(rollout::SyncWeights{v1});
  auto report = sync.get().value();
  CHECK(report.version == 1);
  CHECK(report.bytes > 0);
  auto got = running.get().value();
  size_t switched = 0;
  for (const auto& s : got[0].samples) {
    CHECK(s.version_first <= s.version_last);
    CHECK(s.version_last == 1);
    if (s.version_first == 0) ++switched;
  }
  CHECK(report.interrupted == switched);
  CHECK(switched > 0);
  // A group asking for version 2 waits until the engine has it.
  auto later = e.engine.ask(rollout::Generate{{group(e.config, 2, 1)}, 2, -1});
  CHECK(e.engine.ask(rollout::GetEngineReport{}).get().value().queued == 1);
  REQUIRE(e.engine.ask(rollout::SyncWeights{e.publish(2)}).get().has_value());
  CHECK(later.get().value()[0].samples[0].version_first == 2);
}

TEST_CASE("rollout engine: bad prompts and weights of another model are refused", "[rl][rollout]") {
  Engine e("[model]\ninit = \"random\"\n");
  auto bad = e.engine.ask(rollout::Generate{{{0, {}, 1, 0}}, 0, -1}).get();
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message(), Catch::Contains("prompt has 0 tokens"));
  auto oov = e.engine.ask(rollout::Generate{{{0, {256, 9999}, 1, 0}}, 0, -1}).get();
  REQUIRE_FALSE(oov);
  CHECK_THAT(oov.error().message(), Catch::Contains("outside the vocabulary"));
  auto pub = e.publish(0);
  pub.floats += 1;
  auto wrong = e.engine.ask(rollout::SyncWeights{pub}).get();
  REQUIRE_FALSE(wrong);
  CHECK_THAT(wrong.error().message(), Catch::Contains("parameters"));
}

TEST_CASE(
    "rollout engine: the trainer's device parameters in its process go into the decoder's standby while "
    "offered, and the published buffer is read once the offer has passed or without one",
    "[rl][rollout][weight_sync]") {
  const std::string devices =
      "[run]\nseed = 5\n[model]\ninit = \"random\"\n[trainer]\ndevice = \"host\"\n"
      "[rollout]\ndevice = \"host\"\n";
  Engine e(devices);
  const uint64_t trainer_sum = e.trainer.ask(trainer::GetTrainerInfo{}).get().value().checksum;
  auto unix_ms = [](std::chrono::milliseconds from_now) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               (std::chrono::system_clock::now() + from_now).time_since_epoch())
        .count();
  };
  auto sync = [&](trainer::PublishedWeights w) {
    auto r = e.engine.ask(rollout::SyncWeights{std::move(w)}).get();
    INFO((r ? std::string("ok") : r.error().to_string()));
    REQUIRE(r.has_value());
    CHECK(e.engine.ask(rollout::GetEngineReport{}).get().value().checksum == trainer_sum);
    return *r;
  };
  // Offered for a minute: copied.
  auto offered = e.publish(1);
  REQUIRE(offered.device.device == "host");
  offered.device.valid_until_unix_ms = unix_ms(std::chrono::seconds(60));
  auto r = sync(offered);
  CHECK(r.into_device);
  CHECK(r.device_copy_failed.empty());
  // Not offered (as the driver keeps it for restarted engines): read.
  auto kept = e.publish(2);
  r = sync(kept);
  CHECK_FALSE(r.into_device);
  CHECK(r.device_copy_failed.empty());
  // The offer passed (the sync came after its ask timed out): read, and said.
  auto late = e.publish(3);
  late.device.valid_until_unix_ms = unix_ms(-std::chrono::seconds(1));
  r = sync(late);
  CHECK_FALSE(r.into_device);
  CHECK_THAT(r.device_copy_failed, Catch::Contains("offered until"));
  CHECK(r.version == 3);

  // An engine decoding on the CPU reads, and nothing is said.
  Engine cpu("[run]\nseed = 5\n[model]\ninit = \"random\"\n[trainer]\ndevice = \"host\"\n");
  auto w = cpu.publish(1);
  REQUIRE(w.device.device == "host");
  w.device.valid_until_unix_ms = unix_ms(std::chrono::seconds(60));
  auto on_cpu = cpu.engine.ask(rollout::SyncWeights{w}).get().value();
  CHECK_FALSE(on_cpu.into_device);
  CHECK(on_cpu.device_copy_failed.empty());
}
