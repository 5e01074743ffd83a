// Weight sync by broadcast (rollout.weight_sync = "broadcast"), actor by
// actor in real processes: trainer rank 0 broadcasts its published weights
// over one collective group with the rollout engines (troupe::make_group
// across the two meshes), each engine takes them into its standby copy and
// switches (on devices: the trainer's device parameters into each decoder's
// standby); an engine killed mid-broadcast fails it at once on the trainer
// and the other engines (not at the group's deadline), which keep their
// weights and take the new ones by one-sided reads of the published buffer,
// the job's fallback. The job's own use of it: rl_job_test.cc.
#include <csignal>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <troupe/mesh.h>

#include "config/rl_config.h"
#include "mesh/proc_anchor.h"
#include "rollout/rollout_engine.h"
#include "support/local_cluster.h"
#include "support/rl_session.h"
#include "tasks/task.h"
#include "trainer/trainer_rank.h"

using namespace troupe::rl;
using namespace std::chrono_literals;

namespace {

// `n` processes on a placement group of their own.
troupe::ProcMesh processes(const troupe::ClusterClient& cluster, const std::string& dim, size_t n) {
  troupe::PlacementGroupSpec spec;
  spec.bundles.assign(n, troupe::Bundle{{{"CPU", 1}}});
  auto pg = cluster.create_placement_group(spec).value();
  return troupe::ProcMesh::create(cluster, troupe::Shape::make({{dim, n}}).value(), pg).value();
}

// A supervised step on a few warm-up sequences: the weights change.
void train_once(const troupe::ActorMesh<trainer::TrainerRank>& t, const config::RlConfig& c) {
  auto set = tasks::warmup_set(c);
  std::vector<trainer::WireSequence> seqs(4);
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].prompt = set[i].prompt;
    seqs[i].completion = set[i].completion;
  }
  const auto info = t.member(0).ask(trainer::GetTrainerInfo{}).get().value();
  auto r = t.member(0)
               .ask(trainer::TrainStep{true, std::move(seqs), 1.0, info.optimizer_steps, info.rl_phase, false}, 60s)
               .get();
  INFO((r ? std::string("ok") : r.error().to_string()));
  REQUIRE(r.has_value());
}

// Joins trainer rank 0 and the engines to `groups` (rank 0 first), as
// the job's driver does.
void join(const troupe::ActorMesh<trainer::TrainerRank>& trainers,
          const troupe::ActorMesh<rollout::RolloutEngine>& engines, const std::vector<troupe::CollectiveGroup>& groups) {
  REQUIRE(groups.size() == engines.size() + 1);
  REQUIRE(trainers.member(0).ask(trainer::JoinWeightSyncGroup{groups[0]}).get().has_value());
  for (size_t e = 0; e < engines.size(); ++e) {
    REQUIRE(engines.member(e).ask(trainer::JoinWeightSyncGroup{groups[e + 1]}).get().has_value());
  }
}

// Broadcasts `version` from trainer rank 0 to every engine over group `id`
// and checks that each one took it and now generates with the trainer's
// weights (checksum). Returns the weights' bytes.
uint64_t broadcast_to_all(const troupe::ActorMesh<trainer::TrainerRank>& trainers,
                          const troupe::ActorMesh<rollout::RolloutEngine>& engines, const std::string& id,
                          uint64_t version, bool on_device = false) {
  auto root = trainers.member(0).ask(trainer::BroadcastWeights{version, id}, 60s);
  std::vector<troupe::Future<rollout::SyncReport>> got;
  for (size_t e = 0; e < engines.size(); ++e) {
    got.push_back(engines.member(e).ask(rollout::ReceiveWeights{version, id}, 60s));
  }
  auto sent = root.get();
  REQUIRE(sent.has_value());
  INFO(sent->failed);
  REQUIRE(sent->failed.empty());
  CHECK(sent->from_device == on_device);
  const uint64_t checksum = trainers.member(0).ask(trainer::GetTrainerInfo{}).get().value().checksum;
  for (size_t e = 0; e < engines.size(); ++e) {
    INFO("engine " << e);
    auto r = got[e].get();
    INFO((r ? std::string("ok") : r.error().to_string()));
    REQUIRE(r.has_value());
    CHECK(r->version == version);
    CHECK(r->bytes == sent->published.floats * sizeof(float));
    CHECK(r->into_device == on_device);
    auto rep = engines.member(e).ask(rollout::GetEngineReport{}).get().value();
    CHECK(rep.version == version);
    CHECK(rep.checksum == checksum);
  }
  return sent->published.floats * sizeof(float);
}

// The TROUPE_HOST_ID process `pid` runs with (the agents of a LocalCluster
// give their workers theirs).
std::string host_of(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
  std::string entry;
  while (std::getline(in, entry, '\0')) {
    if (entry.starts_with("TROUPE_HOST_ID=")) return entry.substr(15);
  }
  return "";
}

}  // namespace

TEST_CASE(
    "weight sync by broadcast: trainer rank 0's weights reach every engine over one group across the two "
    "meshes and an engine killed mid-broadcast fails it at once on the others which keep their weights and "
    "read the new ones, with the weights on the host or on devices",
    "[rl][weight_sync]") {
  // On devices (the host kind: config::Device): from the trainer's device
  // parameters straight into the decoders' standbys.
  const bool on_device = GENERATE(false, true);
  INFO("on devices: " << on_device);
  const std::string text = "[run]\nseed = 5\nplacement = \"disaggregated\"\n[model]\ninit = \"random\"\n" +
                           std::string(on_device ? "[trainer]\ndevice = \"host\"\n" : "") +
                           "[rollout]\nengines = 3\nweight_sync = \"broadcast\"\n" +
                           (on_device ? "device = \"host\"\n" : "");
  const auto config = config::parse_rl_config(text).value();
  auto s = troupe::test::rl_session();
  auto trainers = processes(s->cluster(), "ranks", 1).spawn<trainer::TrainerRank>({}, text).value();
  auto engines = processes(s->cluster(), "engines", 3).spawn<rollout::RolloutEngine>({}, text).value();
  const std::vector<troupe::GroupRanks> parts{trainers.group_ranks(), engines.group_ranks()};
  // A deadline far past the test's waits: a failure below comes from the
  // lost process, not from the deadline.
  auto groups = troupe::make_group(parts, troupe::GroupOptions{.timeout = 120s}).value();
  join(trainers, engines, groups);
  const std::string id = groups[0].id;
  auto trainer_sum = [&] { return trainers.member(0).ask(trainer::GetTrainerInfo{}).get().value().checksum; };
  auto report = [&](size_t e) { return engines.member(e).ask(rollout::GetEngineReport{}).get().value(); };

  // Version 1 to every engine by broadcast.
  broadcast_to_all(trainers, engines, id, 1, on_device);
  const uint64_t v1 = trainer_sum();

  // Version 2: engine 2 never takes part, and its process is killed.
  train_once(trainers, config);
  const uint64_t v2 = trainer_sum();
  REQUIRE(v2 != v1);
  const int64_t victim = report(2).pid;
  auto root = trainers.member(0).ask(trainer::BroadcastWeights{2, id}, 60s);
  std::vector<troupe::Future<rollout::SyncReport>> got;
  for (size_t e = 0; e < 2; ++e) got.push_back(engines.member(e).ask(rollout::ReceiveWeights{2, id}, 60s));
  REQUIRE(::kill(static_cast<pid_t>(victim), SIGKILL) == 0);
  auto sent = root.get();
  REQUIRE(sent.has_value());
  // The trainer's side says why, and published the weights all the same.
  CHECK_THAT(sent->failed, Catch::Contains("rank 3"));
  CHECK(sent->published.version == 2);
  for (size_t e = 0; e < 2; ++e) {
    INFO("engine " << e);
    auto r = got[e].get();
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == troupe::ErrorCode::peer_lost);
    CHECK_THAT(r.error().message(), Catch::Contains("rank 3"));
    // Nothing changed: it generates with version 1 still.
    auto rep = report(e);
    CHECK(rep.version == 1);
    CHECK(rep.checksum == v1);
    // The fallback: one-sided reads of the published buffer.
    auto read = engines.member(e).ask(rollout::SyncWeights{sent->published}, 60s).get();
    REQUIRE(read.has_value());
    rep = report(e);
    CHECK(rep.version == 2);
    CHECK(rep.checksum == v2);
  }

  // A broadcast on a group the engine is not in is refused at once.
  auto stale = engines.member(0).ask(rollout::ReceiveWeights{3, "no-such-group"}, 60s).get();
  REQUIRE_FALSE(stale.has_value());
  CHECK(stale.error().code() == troupe::ErrorCode::not_found);
  CHECK_THAT(stale.error().message(), Catch::Contains("not in weight-sync group no-such-group"));
  CHECK(troupe::release_group(parts, groups[0]).ok());
}

TEST_CASE("weight sync by broadcast: across two hosts the weights cross between them once, in chunks, and reach the "
          "engines on both",
          "[rl][weight_sync][hierarchical]") {
  // Two agents with different host ids (their processes share no memory):
  // the trainer's process and one engine on one, two engines on the other.
  // The group then runs an arena on each host and, between the two, the
  // trainer's broadcast to the other host's first engine, in 64 KiB chunks
  // (the model is about 0.4 MB).
  troupe::test::LocalCluster local({"host-a", "host-b"});
  const std::string text =
      "[run]\nseed = 5\nplacement = \"disaggregated\"\n[model]\ninit = \"random\"\n"
      "[rollout]\nengines = 3\nweight_sync = \"broadcast\"\n";
  const auto config = config::parse_rl_config(text).value();
  auto trainers = processes(local.cluster, "ranks", 1).spawn<trainer::TrainerRank>({}, text).value();
  auto engines = processes(local.cluster, "engines", 3).spawn<rollout::RolloutEngine>({}, text).value();
  const std::string trainer_host = host_of(trainers.member(0).ask(trainer::GetTrainerInfo{}).get().value().pid);
  size_t beside_trainer = 0;
  for (size_t e = 0; e < 3; ++e) {
    const std::string host = host_of(engines.member(e).ask(rollout::GetEngineReport{}).get().value().pid);
    REQUIRE((host == "host-a" || host == "host-b"));
    beside_trainer += host == trainer_host;
  }
  REQUIRE(beside_trainer == 1);  // each agent has 2 CPUs: 1 + 1 here, 2 there

  const std::vector<troupe::GroupRanks> parts{trainers.group_ranks(), engines.group_ranks()};
  auto groups = troupe::make_group(parts, troupe::GroupOptions{.timeout = 120s, .chunk_bytes = 64 << 10}).value();
  join(trainers, engines, groups);
  // What came to each rank's process in messages, from its engine.
  auto received = [&] {
    std::vector<troupe::mesh::GroupCounters> out;
    for (const auto& g : groups) {
      auto counters = g.engine(trainers.member(0)).ask<troupe::mesh::GroupCounters>(troupe::mesh::GroupStats{g.id});
      out.push_back(counters.get().value());
    }
    return out;
  };
  for (uint64_t version : {1, 2}) {
    if (version == 2) train_once(trainers, config);
    const uint64_t bytes = broadcast_to_all(trainers, engines, groups[0].id, version);
    const uint64_t chunks = (bytes + (64 << 10) - 1) / (64 << 10);
    REQUIRE(chunks > 4);  // more than an edge's window: the acknowledgements pace the trainer
    // The weights crossed between the hosts once, in chunks, to one engine
    // of the other host; every other copy went through a host's arena.
    uint64_t crossed = 0, chunks_crossed = 0, arena = 0;
    for (const auto& c : received()) {
      crossed += c.bytes_in_messages;
      chunks_crossed += c.chunks_in_messages;
      arena += c.arena_collectives;
    }
    CHECK(crossed == version * bytes);
    CHECK(chunks_crossed == version * chunks);
    CHECK(arena == version * 4);  // every rank's broadcast went through its host's arena
  }
  CHECK(troupe::release_group(parts, groups[0]).ok());
}
