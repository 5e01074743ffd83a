// The RL job: its config (every example parses; wrong keys and values are
// refused with the key named), the group queue's staleness gate, the
// replay buffer's staleness bound, and whole jobs on an embedded cluster
// (trainer, rollout and reward meshes in worker processes): the main
// example learns, async mode keeps every sample within max_staleness, and
// a resumed run takes the same steps as an uninterrupted one.
#include <csignal>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/mount.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "config/rl_config.h"
#include "controller/group_queue.h"
#include "controller/replay_buffer.h"
#include "controller/rl_job.h"
#include "env/environment.h"
#include "model/adamw.h"
#include "model/safetensors.h"
#include "trainer/trainer_rank.h"
#include "support/rl_session.h"
#include "troupe/init.h"

using namespace troupe::rl;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string refusal(const std::string& toml) {
  auto c = config::parse_rl_config(toml, "test.toml");
  REQUIRE_FALSE(c);
  return c.error().message();
}

// A fresh directory, removed afterwards.
struct TempDir {
  fs::path path = fs::temp_directory_path() /
                  ("troupe-rl-" + std::to_string(::getpid()) + "-" +
                   std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::vector<nlohmann::json> events(const fs::path& metrics, const std::string& kind) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == kind) out.push_back(j);
  }
  return out;
}

// A small, fast job: a short warm-up and a few steps, on one-digit sums
// that the warm-up gets about right half the time, so that groups score
// unevenly and every step trains.
std::string small_job(const std::string& extra_run, size_t steps, const std::string& extra = "") {
  return "[run]\nseed = 3\nsteps = " + std::to_string(steps) + "\neval_every = 100\n" + extra_run +
         "\n[warmup]\nsteps = 300\nexamples = 2000\nmin_digits = 1\nmax_digits = 1\n"
         "[task]\neval_problems = 50\nmin_digits = 1\nmax_digits = 1\n"
         "[algorithm]\nprompts_per_step = 8\ngroup_size = 4\n" +
         extra;
}

// Steps [from, to) of two runs' "step" events are the same, bit for bit.
void check_same_steps(const std::vector<nlohmann::json>& a, const std::vector<nlohmann::json>& b, size_t from,
                      size_t to) {
  for (size_t i = from; i < to; ++i) {
    INFO("step " << i + 1);
    CHECK(b[i]["step"] == a[i]["step"]);
    CHECK(b[i]["reward_mean"] == a[i]["reward_mean"]);
    CHECK(b[i]["tokens"] == a[i]["tokens"]);
    // Every step of the small job trains (its groups score unevenly).
    REQUIRE(a[i].contains("loss"));
    REQUIRE(b[i].contains("loss"));
    CHECK(b[i]["loss"] == a[i]["loss"]);
    CHECK(b[i]["grad_norm"] == a[i]["grad_norm"]);
  }
}

// The main example on 2 trainer ranks (`trainer_extra` appended to their
// table's ranks line) and 2 engines, colocated or on separate meshes, for
// 100 of its steps: enough to learn past the tests' bar, in a third of the
// time.
std::string main_example_on_two(bool disaggregated, const std::string& trainer_extra) {
  std::string text = read_file(TROUPE_EXAMPLES_DIR "/rl/arithmetic_grpo.toml");
  const size_t steps = text.find("\nsteps = 300\n");
  REQUIRE(steps != std::string::npos);
  text.replace(steps, 13, "\nsteps = 100\n");
  if (disaggregated) text.replace(text.find("placement = \"colocated\""), 23, "placement = \"disaggregated\"");
  text.replace(text.find("ranks = 1"), 9, "ranks = 2" + trainer_extra);
  text.replace(text.find("engines = 1"), 11, "engines = 2");
  return text;
}

controller::JobOptions quiet_options(const fs::path& run_dir) {
  controller::JobOptions o;
  o.run_dir = run_dir.string();
  o.progress = [](const std::string&) {};
  return o;
}

std::unique_ptr<troupe::Session> session() { return troupe::test::rl_session(); }

// A run directory on a tmpfs of its own, `mib` MiB: a disk that fills up
// for real (the trainer's worker process writes the checkpoints, so a file
// size limit on this process would not do). Needs root, as CI runs.
struct SmallDisk {
  TempDir dir;
  explicit SmallDisk(size_t mib) {
    const std::string options = "size=" + std::to_string(mib) + "m";
    INFO("mounting a tmpfs (needs root): " << std::strerror(errno));
    REQUIRE(::mount("tmpfs", dir.path.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) == 0);
  }
  ~SmallDisk() { ::umount2(dir.path.c_str(), MNT_DETACH); }
  // Writes a file until the disk is full.
  void fill(const fs::path& file) const {
    std::ofstream out(file, std::ios::binary);
    const std::string chunk(1 << 16, 'x');
    while (out.write(chunk.data(), static_cast<std::streamsize>(chunk.size()))) {
    }
  }
};

// Progress lines, collected from whichever thread says them.
struct Lines {
  std::mutex mu;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& l) {
      std::lock_guard lock(mu);
      lines.push_back(l);
    };
  }
  size_t count(const std::string& part) {
    std::lock_guard lock(mu);
    auto has = [&](const std::string& l) { return l.find(part) != std::string::npos; };
    return static_cast<size_t>(std::count_if(lines.begin(), lines.end(), has));
  }
};

std::vector<std::string> checkpoint_names(const fs::path& run_dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(run_dir / "checkpoints")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("rl config: every example under examples/rl parses and validates", "[rl][config]") {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(TROUPE_EXAMPLES_DIR "/rl")) {
    if (e.path().extension() != ".toml") continue;
    INFO(e.path());
    auto c = config::load_rl_config(e.path().string());
    CHECK(c.has_value());
    if (!c) FAIL(c.error().message());
    ++n;
  }
  CHECK(n >= 2);
}

TEST_CASE("rl config: defaults fill what a file leaves out, sync mode has no staleness", "[rl][config]") {
  auto c = config::parse_rl_config("[run]\nsteps = 7\nmax_staleness = 4\n").value();
  CHECK(c.run.steps == 7);
  CHECK(c.run.max_staleness == 0);  // sync
  CHECK(c.algorithm.group_size == 8);
  CHECK(c.rollout_sampling().stop_token >= 0);
  CHECK(c.rollout_sampling().max_new_tokens == c.task.problems.max_digits + 3);
  auto a = config::parse_rl_config("[run]\nmode = \"async\"\nplacement = \"disaggregated\"\nmax_staleness = 2\n").value();
  CHECK(a.run.max_staleness == 2);
  CHECK(nlohmann::json::parse(config::rl_config_json(a))["run"]["mode"] == "async");
}

TEST_CASE("rl config: unknown keys, wrong types and values out of range are refused with the key named",
          "[rl][config]") {
  CHECK_THAT(refusal("[rollout]\nenignes = 2\n"), Catch::Contains("unknown key 'rollout.enignes'") &&
                                                      Catch::Contains("engines"));
  CHECK_THAT(refusal("[runn]\nsteps = 2\n"), Catch::Contains("unknown table or key 'runn'"));
  CHECK_THAT(refusal("[algorithm]\ngroup_size = 1\n"), Catch::Contains("'algorithm.group_size'") &&
                                                           Catch::Contains("got 1"));
  CHECK_THAT(refusal("[run]\nsteps = \"ten\"\n"), Catch::Contains("'run.steps'") && Catch::Contains("\"ten\""));
  CHECK_THAT(refusal("[run]\nmode = \"fast\"\n"), Catch::Contains("'run.mode'") && Catch::Contains("\"async\""));
  CHECK_THAT(refusal("[algorithm]\ntemperature = -1.0\n"), Catch::Contains("'algorithm.temperature'"));
  CHECK_THAT(refusal("[run]\nsteps = 3\n[run.extra]\nx = 1\n"), Catch::Contains("'run.extra'"));
  CHECK_THAT(refusal("run = 3\n"), Catch::Contains("'run' must be a table"));
  CHECK_THAT(refusal("[run]\nsteps = = 3\n"), Catch::StartsWith("test.toml:2:"));
  CHECK_THAT(refusal("[model]\ncontext_length = 8\n"), Catch::Contains("'model.context_length'"));
  CHECK_THAT(refusal("[run]\nmode = \"async\"\n"), Catch::Contains("disaggregated"));
  CHECK_THAT(refusal("[trainer]\nranks = 2\n"), Catch::Contains("'rollout.engines'"));
  CHECK_THAT(refusal("[model]\ninit = \"checkpoint\"\n"), Catch::Contains("'model.checkpoint'"));
  CHECK_THAT(refusal("[algorithm]\nepochs = 0\n"), Catch::Contains("'algorithm.epochs'"));
  CHECK_THAT(refusal("[algorithm]\nprompts_per_step = 2\ngroup_size = 4\nmini_batches = 9\n"),
             Catch::Contains("'algorithm.mini_batches' (9)"));
  CHECK_THAT(refusal("[model]\nheads = 3\n"), Catch::Contains("[model]"));
  CHECK_THAT(refusal("[run]\nkeep_checkpoints = -1\n"), Catch::Contains("'run.keep_checkpoints'"));
  CHECK_THAT(refusal("[rollout]\nweight_sync = \"nccl\"\n"),
             Catch::Contains("'rollout.weight_sync'") && Catch::Contains("\"broadcast\""));
  CHECK_THAT(refusal("[run]\nplacement = \"colocated\"\n[rollout]\nweight_sync = \"broadcast\"\n"),
             Catch::Contains("'rollout.weight_sync'") && Catch::Contains("disaggregated"));
  auto missing = config::load_rl_config("/nonexistent/job.toml");
  REQUIRE_FALSE(missing);
  CHECK_THAT(missing.error().message(), Catch::Contains("/nonexistent/job.toml"));
}

TEST_CASE("group queue: a step's groups start only once the weights they may use are published", "[rl][job]") {
  // 4 groups per step, staleness 1: step k's groups need version k - 1.
  controller::GroupQueue q(4, 1, 0, 40);
  CHECK(q.min_version(0) == 0);
  CHECK(q.min_version(8) == 1);
  CHECK(q.min_version(13) == 2);
  std::vector<uint64_t> got;
  std::thread taker([&] {
    while (auto g = q.next()) got.push_back(*g);
  });
  q.publish(0);  // steps 0 and 1: groups 0..7
  q.requeue(3);
  q.stop();
  taker.join();
  // Whatever came before stop() was within steps 0..1 (the gate), in order
  // but for the requeued group.
  for (uint64_t g : got) CHECK(g < 8);
  controller::GroupQueue sync(4, 0, 0, 12);
  sync.publish(0);
  for (uint64_t want = 0; want < 4; ++want) CHECK(sync.next() == want);
  sync.requeue(2);
  CHECK(sync.next() == 2u);  // requeued first
  sync.publish(1);
  CHECK(sync.next() == 4u);
  controller::GroupQueue resumed(4, 0, 4, 12, {5, 6});
  resumed.publish(2);
  CHECK(resumed.next() == 4u);
  CHECK(resumed.next() == 7u);  // 5 and 6 were trained before the resume
}

TEST_CASE("replay buffer: a step takes the lowest groups and drops those older than the staleness bound",
          "[rl][job]") {
  std::vector<uint64_t> requeued;
  controller::ReplayBuffer buf(16, [&](uint64_t g) { requeued.push_back(g); });
  auto rec = [](uint64_t index, uint64_t version) {
    controller::GroupRecord r;
    r.index = index;
    rollout::Sample s;
    s.version_first = version;
    s.version_last = version + 1;
    r.samples = {s, s};
    r.rewards = {0, 1};
    return r;
  };
  buf.push(rec(7, 5));
  buf.push(rec(2, 3));  // too old for step 6 with staleness 2
  buf.push(rec(9, 6));
  buf.push(rec(4, 4));
  auto t = buf.take(2, 6, 2, {});
  REQUIRE(t);
  REQUIRE(t->groups.size() == 2);
  CHECK(t->groups[0].index == 4);
  CHECK(t->groups[1].index == 7);
  CHECK(t->stale == std::vector<uint64_t>{2});
  CHECK(requeued == std::vector<uint64_t>{2});
  // Not enough groups: an interruption returns with none.
  auto none = buf.take(2, 6, 2, [] { return true; });
  REQUIRE(none);
  CHECK(none->groups.empty());
  CHECK(buf.size() == 1);
}

TEST_CASE("rl job: the main example learns arithmetic with GRPO on meshes", "[rl][job][learning]") {
  TempDir dir;
  auto s = session();
  const std::string text = read_file(TROUPE_EXAMPLES_DIR "/rl/arithmetic_grpo.toml");
  controller::JobOptions options = quiet_options(dir.path);
  auto r = controller::run_rl_job(s->runtime(), s->cluster(), text, options);
  REQUIRE(r.has_value());
  REQUIRE(r->evals.size() >= 2);
  const double before = r->evals.front().second, after = r->evals.back().second;
  INFO("held-out accuracy " << before << " -> " << after);
  CHECK(before < 0.75);
  CHECK(after > 0.85);
  CHECK(after > before + 0.25);
  CHECK(events(dir.path / "metrics.jsonl", "step").size() == 300);
  CHECK(fs::exists(dir.path / "checkpoints" / "step-000300" / "manifest.json"));
}

TEST_CASE("rl job: in async mode no sample trained on is older than max_staleness versions", "[rl][job]") {
  TempDir dir;
  auto s = session();
  const std::string text = small_job("mode = \"async\"\nplacement = \"disaggregated\"\nmax_staleness = 1\n", 12,
                                     "[rollout]\nengines = 2\ngroups_in_flight = 4\n");
  controller::JobOptions options = quiet_options(dir.path);
  auto r = controller::run_rl_job(s->runtime(), s->cluster(), text, options);
  REQUIRE(r.has_value());
  auto steps = events(dir.path / "metrics.jsonl", "step");
  REQUIRE(steps.size() == 12);
  uint64_t most = 0;
  for (const auto& st : steps) {
    CHECK(st["staleness_max"].get<uint64_t>() <= 1);
    CHECK(st["samples"].get<size_t>() == 8 * 4);
    most = std::max(most, st["staleness_max"].get<uint64_t>());
  }
  CHECK(events(dir.path / "metrics.jsonl", "run")[0]["mode"] == "async");
}

TEST_CASE("rl job: a run resumed from a checkpoint takes the same next steps as an uninterrupted one, with and "
          "without a KL penalty, and with several updates a step",
          "[rl][job]") {
  // With kl_coef the checkpoint carries the reference policy too.
  // With several updates a step, the checkpoint's optimizer step counts them.
  const std::string algorithm = GENERATE(as<std::string>{}, "", "kl_coef = 0.2\n", "epochs = 2\nmini_batches = 2\n");
  INFO("algorithm " << algorithm);
  TempDir whole, part;
  auto s = session();
  controller::JobOptions quiet = quiet_options({});
  auto full = quiet;
  full.run_dir = whole.path.string();
  REQUIRE(controller::run_rl_job(s->runtime(), s->cluster(), small_job("checkpoint_every = 3\n", 6, algorithm), full));
  auto first = quiet;
  first.run_dir = part.path.string();
  REQUIRE(controller::run_rl_job(s->runtime(), s->cluster(), small_job("", 3, algorithm), first));
  if (algorithm.find("kl_coef") != std::string::npos) {
    CHECK(fs::exists(part.path / "checkpoints" / "step-000003" / "reference.safetensors"));
  }
  auto again = first;
  again.resume = true;
  auto resumed =
      controller::run_rl_job(s->runtime(), s->cluster(), small_job("checkpoint_every = 3\n", 6, algorithm), again);
  REQUIRE(resumed.has_value());
  CHECK(resumed->steps == 3);
  auto a = events(whole.path / "metrics.jsonl", "step");
  auto b = events(part.path / "metrics.jsonl", "step");
  REQUIRE(a.size() == 6);
  REQUIRE(b.size() == 6);  // 3 before the resume, 3 after
  CHECK(events(part.path / "metrics.jsonl", "resume").size() == 1);
  check_same_steps(a, b, 3, 6);
}

TEST_CASE("rl job: a checkpoint on a full disk fails whole and training goes on, later ones complete, the oldest "
          "pruned to keep_checkpoints",
          "[rl][job]") {
  SmallDisk disk(24);
  auto s = session();
  Lines said;
  controller::JobOptions options = quiet_options(disk.dir.path);
  options.progress = said.sink();
  const fs::path filler = disk.dir.path / "filler";
  bool filled = false, freed = false;
  options.after_step = [&](size_t step, const controller::JobProbe&) {
    if (step == 1) {
      disk.fill(filler);  // step 2's checkpoint finds the disk full
      filled = true;
    } else if (step == 2) {
      // Nothing of the failed checkpoint is left to hold the space.
      CHECK_FALSE(fs::exists(disk.dir.path / "checkpoints" / "step-000002"));
      fs::remove(filler);
      freed = true;
    }
  };
  auto r = controller::run_rl_job(s->runtime(), s->cluster(),
                                  small_job("checkpoint_every = 2\nkeep_checkpoints = 2\n", 8), options);
  INFO((r ? std::string() : r.error().message()));
  REQUIRE(r);
  CHECK(filled);
  CHECK(freed);
  CHECK(said.count("warning: checkpoint: ") == 1);
  CHECK(said.count("No space left on device") >= 1);
  CHECK(said.count("partial files were removed") == 1);
  // 4 was complete, then pruned by 8 (the newest two stay); 2 never was.
  CHECK(checkpoint_names(disk.dir.path) == std::vector<std::string>{"step-000006", "step-000008"});
  for (const char* name : {"step-000006", "step-000008"}) {
    CHECK(fs::exists(disk.dir.path / "checkpoints" / name / "manifest.json"));
    CHECK(fs::exists(disk.dir.path / "checkpoints" / name / "trainer.safetensors"));
  }
  // No temporary files left anywhere.
  for (const auto& e : fs::recursive_directory_iterator(disk.dir.path)) {
    CHECK(e.path().filename().string().find(".tmp-") == std::string::npos);
  }
}

TEST_CASE("rl job: resume passes over damaged checkpoints (a manifest that is not one, a truncated state) for the "
          "newest that loads, and with none left says why for each",
          "[rl][job]") {
  TempDir dir;
  auto s = session();
  controller::JobOptions options = quiet_options(dir.path);
  REQUIRE(controller::run_rl_job(s->runtime(), s->cluster(), small_job("checkpoint_every = 2\n", 6), options));
  const fs::path root = dir.path / "checkpoints";
  std::ofstream(root / "step-000006" / "manifest.json", std::ios::trunc) << "{\"step\": 6, \"consu";
  fs::resize_file(root / "step-000004" / "trainer.safetensors", 100);
  Lines said;
  auto again = options;
  again.resume = true;
  again.progress = said.sink();
  auto resumed = controller::run_rl_job(s->runtime(), s->cluster(), small_job("checkpoint_every = 2\n", 8), again);
  INFO((resumed ? std::string() : resumed.error().message()));
  REQUIRE(resumed);
  CHECK(resumed->steps == 6);  // 3 to 8
  auto resumes = events(dir.path / "metrics.jsonl", "resume");
  REQUIRE(resumes.size() == 1);
  CHECK(resumes[0]["step"] == 2);
  REQUIRE(resumes[0]["skipped"].size() == 2);
  CHECK_THAT(resumes[0]["skipped"][0].get<std::string>(), Catch::Contains("step-000006") &&
                                                              Catch::Contains("is not a manifest"));
  CHECK_THAT(resumes[0]["skipped"][1].get<std::string>(), Catch::Contains("step-000004") &&
                                                              Catch::Contains("trainer.safetensors"));
  CHECK(said.count("warning: resume: passed over") == 2);
  // The resumed run wrote its own checkpoints over the damaged ones.
  CHECK(checkpoint_names(dir.path) ==
        std::vector<std::string>{"step-000002", "step-000004", "step-000006", "step-000008"});
  CHECK(events(dir.path / "metrics.jsonl", "step").back()["step"] == 8);

  // Every one damaged: the resume stops, naming each and why.
  for (const auto& name : checkpoint_names(dir.path)) std::ofstream(root / name / "manifest.json") << "[]";
  auto none = controller::run_rl_job(s->runtime(), s->cluster(), small_job("checkpoint_every = 2\n", 10), again);
  REQUIRE_FALSE(none);
  CHECK(none.error().code() == troupe::ErrorCode::not_found);
  CHECK_THAT(none.error().message(), Catch::Contains("no complete checkpoint") && Catch::Contains("step-000002") &&
                                         Catch::Contains("step-000008") && Catch::Contains("without --resume"));
}

TEST_CASE("rl job: trainer.device = host (the GPU path's code: state resident in the device model, the allreduce "
          "on its gradients) takes the CPU trainer's steps bit for bit on 2 ranks, and resumes bit for bit",
          "[rl][job]") {
  TempDir on_cpu, on_host, part;
  auto s = session();
  // A KL penalty: the reference policy's device model too.
  const std::string two = "kl_coef = 0.2\n[trainer]\nranks = 2\n[rollout]\nengines = 2\n";
  controller::JobOptions quiet = quiet_options({});
  auto cpu = quiet;
  cpu.run_dir = on_cpu.path.string();
  REQUIRE(controller::run_rl_job(s->runtime(), s->cluster(), small_job("", 6, two), cpu));
  auto host = quiet;
  host.run_dir = on_host.path.string();
  size_t checked = 0;
  host.after_step = [&](size_t, const controller::JobProbe& probe) {
    auto sums = probe.trainer_checksums();
    REQUIRE(sums.size() == 2);
    CHECK(sums[0] == sums[1]);  // the replicas, brought back from their device models, agree
    ++checked;
  };
  const std::string on_device = "kl_coef = 0.2\n[trainer]\nranks = 2\ndevice = \"host\"\n[rollout]\nengines = 2\n";
  auto ran = controller::run_rl_job(s->runtime(), s->cluster(), small_job("checkpoint_every = 3\n", 6, on_device), host);
  INFO((ran ? std::string() : ran.error().message()));
  REQUIRE(ran);
  CHECK(checked == 6);
  auto a = events(on_cpu.path / "metrics.jsonl", "step");
  auto b = events(on_host.path / "metrics.jsonl", "step");
  REQUIRE(a.size() == 6);
  REQUIRE(b.size() == 6);
  check_same_steps(a, b, 0, 6);
  // The warm-up too (supervised steps through the device model).
  auto wa = events(on_cpu.path / "metrics.jsonl", "warmup");
  auto wb = events(on_host.path / "metrics.jsonl", "warmup");
  REQUIRE(wa.size() == wb.size());
  REQUIRE_FALSE(wa.empty());
  for (size_t i = 0; i < wa.size(); ++i) {
    CHECK(wa[i]["step"] == wb[i]["step"]);
    CHECK(wa[i]["loss"] == wb[i]["loss"]);
  }

  // A checkpoint written from device models, resumed into new ones.
  auto first = quiet;
  first.run_dir = part.path.string();
  REQUIRE(controller::run_rl_job(s->runtime(), s->cluster(), small_job("checkpoint_every = 3\n", 3, on_device), first));
  auto again = first;
  again.resume = true;
  REQUIRE(controller::run_rl_job(s->runtime(), s->cluster(), small_job("checkpoint_every = 3\n", 6, on_device), again));
  auto c = events(part.path / "metrics.jsonl", "step");
  REQUIRE(c.size() == 6);
  check_same_steps(a, c, 3, 6);
}

TEST_CASE("rl job: rollout.weight_sync = broadcast takes the one-sided reads' steps bit for bit, every engine at the "
          "trainer's weights after each step, over one weight-sync group made once",
          "[rl][job][weight_sync]") {
  TempDir by_reads, by_broadcast;
  auto s = session();
  const std::string run = "placement = \"disaggregated\"\n";
  const std::string three = "[trainer]\nranks = 2\n[rollout]\nengines = 3\n";
  controller::JobOptions quiet = quiet_options({});
  auto reads = quiet;
  reads.run_dir = by_reads.path.string();
  REQUIRE(controller::run_rl_job(s->runtime(), s->cluster(), small_job(run, 5, three), reads));
  auto bcast = quiet;
  bcast.run_dir = by_broadcast.path.string();
  size_t checked = 0;
  bcast.after_step = [&](size_t, const controller::JobProbe& probe) {
    auto trainers = probe.trainer_checksums();
    auto engines = probe.engine_checksums();
    REQUIRE(engines.size() == 3);
    for (uint64_t e : engines) CHECK(e == trainers.at(0));
    ++checked;
  };
  auto ran = controller::run_rl_job(s->runtime(), s->cluster(),
                                    small_job(run, 5, three + "weight_sync = \"broadcast\"\n"), bcast);
  INFO((ran ? std::string() : ran.error().message()));
  REQUIRE(ran);
  CHECK(checked == 5);
  const auto metrics = by_broadcast.path / "metrics.jsonl";
  // Made once, used for every sync; nothing fell back to reads.
  auto made = events(metrics, "weight_sync_group");
  REQUIRE(made.size() == 1);
  CHECK(made[0]["made"] == true);
  CHECK(made[0]["ranks"] == 4);
  CHECK(events(metrics, "fault").empty());
  auto a = events(by_reads.path / "metrics.jsonl", "step");
  auto b = events(metrics, "step");
  REQUIRE(a.size() == 5);
  REQUIRE(b.size() == 5);
  check_same_steps(a, b, 0, 5);
  for (const auto& step : b) CHECK(step["sync_gbps"].get<double>() > 0);
}

TEST_CASE(
    "rl job: with trainer and engines on a device kind a broadcast goes from the trainer's device parameters "
    "straight into each engine's decoder standby, and takes the CPU job's steps bit for bit",
    "[rl][job][weight_sync]") {
  // The host kind runs the GPU code paths on the CPU (config::Device): the
  // trainer's resident parameters broadcast into the decoders' standbys, as
  // NCCL does between GPUs, with nothing through the published host copy.
  TempDir on_cpu, on_device;
  auto s = session();
  const std::string run = "placement = \"disaggregated\"\n";
  controller::JobOptions quiet = quiet_options({});
  auto cpu = quiet;
  cpu.run_dir = on_cpu.path.string();
  REQUIRE(controller::run_rl_job(s->runtime(), s->cluster(),
                                 small_job(run, 4, "[trainer]\nranks = 2\n[rollout]\nengines = 2\n"), cpu));
  auto dev = quiet;
  dev.run_dir = on_device.path.string();
  size_t checked = 0;
  dev.after_step = [&](size_t, const controller::JobProbe& probe) {
    auto trainers = probe.trainer_checksums();
    auto engines = probe.engine_checksums();
    REQUIRE(engines.size() == 2);
    for (uint64_t e : engines) CHECK(e == trainers.at(0));  // read back from the decoders
    ++checked;
  };
  auto ran = controller::run_rl_job(
      s->runtime(), s->cluster(),
      small_job(run, 4,
                "[trainer]\nranks = 2\ndevice = \"host\"\n[rollout]\nengines = 2\ndevice = \"host\"\n"
                "weight_sync = \"broadcast\"\n"),
      dev);
  INFO((ran ? std::string() : ran.error().message()));
  REQUIRE(ran);
  CHECK(checked == 4);
  const auto metrics = on_device.path / "metrics.jsonl";
  CHECK(events(metrics, "fault").empty());
  auto a = events(on_cpu.path / "metrics.jsonl", "step");
  auto b = events(metrics, "step");
  REQUIRE(a.size() == 4);
  REQUIRE(b.size() == 4);
  check_same_steps(a, b, 0, 4);
  for (const auto& step : b) {
    CHECK(step["synced_into_device"] == 2);
    CHECK(step["synced_from_device"] == true);
    CHECK(step["sync_gbps"].get<double>() > 0);
  }
  for (const auto& step : a) {
    CHECK(step["synced_into_device"] == 0);
    CHECK(step["synced_from_device"] == false);
  }
}

TEST_CASE(
    "rl job: with trainer and engines on a device kind a sync copies the trainer's device parameters into "
    "each engine's decoder standby where they share a process, reads the published buffer where not, and takes "
    "the CPU job's steps bit for bit",
    "[rl][job][weight_sync]") {
  TempDir on_cpu, colocated, apart;
  auto s = session();
  controller::JobOptions quiet = quiet_options({});
  const std::string two = "[trainer]\nranks = 2\n[rollout]\nengines = 2\n";
  const std::string two_on_host =
      "[trainer]\nranks = 2\ndevice = \"host\"\n[rollout]\nengines = 2\ndevice = \"host\"\n";
  auto cpu = quiet;
  cpu.run_dir = on_cpu.path.string();
  REQUIRE(controller::run_rl_job(s->runtime(), s->cluster(), small_job("", 4, two), cpu));
  // Colocated, engine r shares trainer rank r's process: engine 0 copies
  // from rank 0's device model (the publisher) in its process, engine 1
  // reads. Disaggregated, both read.
  for (const bool together : {true, false}) {
    INFO("colocated: " << together);
    auto dev = quiet;
    dev.run_dir = (together ? colocated : apart).path.string();
    size_t checked = 0;
    dev.after_step = [&](size_t, const controller::JobProbe& probe) {
      auto trainers = probe.trainer_checksums();
      for (uint64_t e : probe.engine_checksums()) CHECK(e == trainers.at(0));
      ++checked;
    };
    auto ran = controller::run_rl_job(
        s->runtime(), s->cluster(), small_job(together ? "" : "placement = \"disaggregated\"\n", 4, two_on_host), dev);
    INFO((ran ? std::string() : ran.error().message()));
    REQUIRE(ran);
    CHECK(checked == 4);
    const auto metrics = (together ? colocated : apart).path / "metrics.jsonl";
    CHECK(events(metrics, "fault").empty());
    // The host kind reaches its own process only, and says nothing when
    // it cannot (that is no failure).
    CHECK(events(metrics, "weight_sync_device_copy").empty());
    auto a = events(on_cpu.path / "metrics.jsonl", "step");
    auto b = events(metrics, "step");
    REQUIRE(b.size() == 4);
    check_same_steps(a, b, 0, 4);
    for (const auto& step : b) CHECK(step["synced_into_device"] == (together ? 1 : 0));
  }
}

TEST_CASE("rl job: several updates a step (epochs x mini-batches) take that many optimizer steps, and the later "
          "ones are clipped against the sampling policy",
          "[rl][job]") {
  // PPO scores its old values before the updates; GRPO needs none.
  const std::string algorithm = GENERATE(as<std::string>{}, "name = \"grpo\"\n", "name = \"ppo\"\n");
  INFO(algorithm);
  TempDir dir;
  auto s = session();
  const std::string text =
      small_job("", 4, "epochs = 2\nmini_batches = 2\n" + algorithm + "[trainer]\nranks = 2\n"
                       "[rollout]\nengines = 2\n");
  auto r = controller::run_rl_job(s->runtime(), s->cluster(), text, quiet_options(dir.path));
  REQUIRE(r.has_value());
  auto steps = events(dir.path / "metrics.jsonl", "step");
  REQUIRE(steps.size() == 4);
  double clipped = 0;
  size_t trained = 0;
  for (const auto& st : steps) {
    INFO(st.dump());
    // A step whose groups all scored alike has nothing to train on.
    if (!st.contains("loss")) {
      CHECK(st["updates"] == 0);
      continue;
    }
    ++trained;
    CHECK(st["updates"] == 4);
    clipped += st["clip_fraction"].get<double>();
  }
  CHECK(trained >= 2);
  // The first update's ratio is 1 (fresh samples); the later ones' are not.
  CHECK(clipped > 0);
  if (algorithm.find("ppo") != std::string::npos) {
    for (const auto& st : steps) CHECK(st.contains("value_loss"));
  }
}

TEST_CASE("trainer rank: with shard_optimizer it holds no optimizer moments until it knows its segment",
          "[rl][job]") {
  troupe::Runtime rt;
  const std::string base = "[model]\ninit = \"random\"\n[rollout]\nengines = 2\n[trainer]\nranks = 2\n";
  auto sharded = rt.spawn<trainer::TrainerRank>(base + "shard_optimizer = true\n");
  auto replicated = rt.spawn<trainer::TrainerRank>(base);
  auto s = sharded.ask(trainer::GetTrainerInfo{}).get();
  auto r = replicated.ask(trainer::GetTrainerInfo{}).get();
  REQUIRE(s);
  REQUIRE(r);
  CHECK(s->optimizer_floats == 0);
  CHECK(r->optimizer_floats > 0);
  CHECK(s->checksum == r->checksum);  // the same weights either way
  CHECK(s->device == "cpu");
}

TEST_CASE("rl job: ZeRO-1 on 2 ranks keeps the replicas equal, checkpoints every rank's optimizer segment, and "
          "resumes bit for bit",
          "[rl][job]") {
  TempDir whole, part;
  auto s = session();
  const std::string zero = "[trainer]\nranks = 2\nshard_optimizer = true\n[rollout]\nengines = 2\n";
  controller::JobOptions quiet = quiet_options({});
  auto full = quiet;
  full.run_dir = whole.path.string();
  size_t checked = 0;
  const size_t layout_total =
      model::ParamLayout::make(config::parse_rl_config(small_job("", 6, zero)).value().trainer_shape())->total();
  full.after_step = [&](size_t, const controller::JobProbe& probe) {
    auto sums = probe.trainer_checksums();
    REQUIRE(sums.size() == 2);
    CHECK(sums[0] == sums[1]);  // each rank updated its segment; the allgather made them one model
    auto held = probe.trainer_optimizer_floats();
    REQUIRE(held.size() == 2);
    CHECK(held[0] + held[1] == layout_total);  // each rank holds its segment's moments only
    CHECK(held[0] - held[1] <= 1);
    ++checked;
  };
  REQUIRE(controller::run_rl_job(s->runtime(), s->cluster(), small_job("checkpoint_every = 3\n", 6, zero), full));
  CHECK(checked == 6);

  // The checkpoint holds the whole optimizer state: both ranks' segments.
  auto c = config::parse_rl_config(small_job("", 6, zero)).value();
  auto layout = model::ParamLayout::make(c.trainer_shape()).value();
  std::vector<float> params(layout.total());
  model::AdamW whole_state(layout, c.algorithm.optim);
  REQUIRE(model::load_training_state(whole.path / "checkpoints" / "step-000003" / "trainer.safetensors", layout,
                                     params.data(), whole_state));
  size_t trained = 0;  // steps whose groups all scored alike train nothing
  for (const auto& e : events(whole.path / "metrics.jsonl", "step")) trained += e["step"] <= 3 && e.contains("loss");
  CHECK(trained == 3);
  CHECK(whole_state.steps() == trained);
  const size_t half = layout.total() / 2;
  auto moved = [&](size_t begin, size_t end) {
    size_t nonzero = 0;
    for (size_t i = begin; i < end; ++i) nonzero += whole_state.v()[i] != 0.0f;
    return nonzero;
  };
  CHECK(moved(0, half) > half / 2);
  CHECK(moved(half, layout.total()) > half / 2);

  // Three steps, then a resume to six: the same steps as the whole run.
  auto first = quiet;
  first.run_dir = part.path.string();
  REQUIRE(controller::run_rl_job(s->runtime(), s->cluster(), small_job("checkpoint_every = 3\n", 3, zero), first));
  auto again = first;
  again.resume = true;
  auto resumed = controller::run_rl_job(s->runtime(), s->cluster(), small_job("checkpoint_every = 3\n", 6, zero), again);
  REQUIRE(resumed.has_value());
  auto a = events(whole.path / "metrics.jsonl", "step");
  auto b = events(part.path / "metrics.jsonl", "step");
  REQUIRE(a.size() == 6);
  REQUIRE(b.size() == 6);
  check_same_steps(a, b, 3, 6);
}

TEST_CASE("rl job: ZeRO-1: kill -9 of a trainer rank is recovered in memory from the next rank's backup, and the "
          "run takes the uninterrupted run's steps bit for bit",
          "[rl][job]") {
  TempDir whole, part;
  auto s = session();
  const std::string zero = "[trainer]\nranks = 2\nshard_optimizer = true\n[rollout]\nengines = 2\n";
  const std::string text = small_job("", 6, zero);
  auto full = quiet_options(whole.path);
  std::vector<uint64_t> want;
  full.after_step = [&](size_t, const controller::JobProbe& probe) { want.push_back(probe.trainer_checksums().at(0)); };
  REQUIRE(controller::run_rl_job(s->runtime(), s->cluster(), text, full));
  REQUIRE(want.size() == 6);

  // Rank 1 after step 2, rank 0 (which publishes the weights) after step 4.
  auto cut = quiet_options(part.path);
  std::vector<uint64_t> got;
  std::vector<std::string> killed;
  cut.after_step = [&](size_t step, const controller::JobProbe& probe) {
    auto sums = probe.trainer_checksums();
    REQUIRE(sums.size() == 2);
    CHECK(sums[0] == sums[1]);
    got.push_back(sums[0]);
    if (step == 2 || step == 4) {
      const size_t rank = step == 2 ? 1 : 0;
      const int64_t pid = probe.trainer_pids().at(rank);
      REQUIRE(pid > 0);
      REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
      killed.push_back("rank " + std::to_string(rank));
    }
  };
  auto r = controller::run_rl_job(s->runtime(), s->cluster(), text, cut);
  if (!r) FAIL(r.error().message());
  CHECK(killed.size() == 2);
  CHECK(got == want);  // every step's weights, bit for bit
  check_same_steps(events(whole.path / "metrics.jsonl", "step"), events(part.path / "metrics.jsonl", "step"), 0, 6);
  size_t in_memory = 0;
  for (const auto& f : events(part.path / "metrics.jsonl", "fault")) {
    INFO(f.dump());
    const std::string action = f["action"];
    CHECK(action.find("checkpoint") == std::string::npos);
    in_memory += action.find("back at its shard") != std::string::npos;
  }
  CHECK(in_memory >= 1);
  CHECK(events(part.path / "metrics.jsonl", "resume").empty());
}

TEST_CASE("rl job: ZeRO-1 without shard_backup: kill -9 of a trainer rank goes back to the last checkpoint, and the "
          "run finishes and learns",
          "[rl][job][learning]") {
  TempDir dir;
  auto s = session();
  const std::string text = main_example_on_two(false, "\nshard_optimizer = true\nshard_backup = false");
  controller::JobOptions options = quiet_options(dir.path);
  bool killed = false;
  options.after_step = [&](size_t step, const controller::JobProbe& probe) {
    if (step == 60 && !killed) {  // checkpoint_every = 50: ten steps are lost
      const int64_t pid = probe.trainer_pids().at(1);
      REQUIRE(pid > 0);
      REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
      killed = true;
    }
  };
  auto r = controller::run_rl_job(s->runtime(), s->cluster(), text, options);
  if (!r) FAIL(r.error().message());
  CHECK(killed);
  CHECK(r->faults >= 1);
  size_t back = 0;
  for (const auto& f : events(dir.path / "metrics.jsonl", "fault")) {
    back += std::string(f["action"]).find("went back to the last checkpoint") != std::string::npos;
  }
  CHECK(back == 1);
  auto resumes = events(dir.path / "metrics.jsonl", "resume");
  REQUIRE(resumes.size() == 1);
  CHECK(resumes[0]["step"] == 50);
  auto steps = events(dir.path / "metrics.jsonl", "step");
  REQUIRE_FALSE(steps.empty());
  CHECK(steps.back()["step"] == 100);
  REQUIRE(r->evals.size() >= 1);
  INFO("held-out accuracy at the end " << r->evals.back().second);
  CHECK(r->evals.back().second > 0.85);
}

TEST_CASE("rl job: kill -9 of a rollout engine and of trainer ranks mid-run: the run finishes and learns",
          "[rl][job][learning]") {
  // On the CPU model; with the weights broadcast (the group broken by each
  // kill, the engines synced by reads then, the group made again); and on
  // the device paths' code (the host kind: a rank's state resident in its
  // device model, copied in from a survivor; the broadcast from rank 0's
  // device parameters into the engines' decoders).
  const auto [device, sync] = GENERATE(
      table<std::string, std::string>({{"", ""},
                                       {"", "\nweight_sync = \"broadcast\""},
                                       {"\ndevice = \"host\"", "\nweight_sync = \"broadcast\"\ndevice = \"host\""}}));
  INFO("trainer" << device << ", rollout" << sync);
  TempDir dir;
  auto s = session();
  // The main example on separate meshes of 2 trainer ranks and 2 engines.
  std::string text = main_example_on_two(true, device);
  text.replace(text.find("engines = 2"), 11, "engines = 2" + sync);
  controller::JobOptions options = quiet_options(dir.path);
  std::vector<std::string> killed;
  std::vector<uint64_t> checksums_after;
  options.after_step = [&](size_t step, const controller::JobProbe& probe) {
    if (step == 10) {
      const int64_t pid = probe.engine_pids().at(1);
      REQUIRE(pid > 0);
      REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
      killed.push_back("engine 1");
    }
    if (step == 20) {
      const int64_t pid = probe.trainer_pids().at(1);
      REQUIRE(pid > 0);
      REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
      killed.push_back("trainer rank 1");
    }
    if (step == 30 || step == 45) {
      // The replicas agree, and the engines generate with their weights.
      auto trainers = probe.trainer_checksums();
      auto engines = probe.engine_checksums();
      REQUIRE(trainers.size() == 2);
      CHECK(trainers[0] == trainers[1]);
      for (uint64_t e : engines) CHECK(e == trainers[0]);
      checksums_after = trainers;
    }
    if (step == 40) {
      // Rank 0 too: it publishes the weights and writes the checkpoints.
      const int64_t pid = probe.trainer_pids().at(0);
      REQUIRE(pid > 0);
      REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
      killed.push_back("trainer rank 0");
    }
  };
  auto r = controller::run_rl_job(s->runtime(), s->cluster(), text, options);
  if (!r) FAIL(r.error().message());
  CHECK(killed.size() == 3);
  CHECK(r->faults >= 3);
  auto faults = events(dir.path / "metrics.jsonl", "fault");
  bool engine_back = false;
  size_t trainer_recoveries = 0;
  for (const auto& f : faults) {
    const std::string what = f["what"], action = f["action"];
    engine_back |= what.find("rollout engine 1 is back") != std::string::npos;
    if (action.find("every rank took") != std::string::npos) ++trainer_recoveries;
  }
  CHECK(engine_back);
  CHECK(trainer_recoveries == 2);
  if (!sync.empty()) {
    // Made at the first sync, and again after each kill that broke it
    // (engine 1, trainer rank 0; rank 1 is not in it).
    size_t made = 0;
    for (const auto& g : events(dir.path / "metrics.jsonl", "weight_sync_group")) made += g["made"] == true;
    CHECK(made >= 3);
  }
  if (!device.empty()) {
    // Into both decoders at every step but those whose broadcast a kill
    // broke (then by reads).
    size_t into_both = 0;
    for (const auto& st : events(dir.path / "metrics.jsonl", "step")) into_both += st["synced_into_device"] == 2;
    CHECK(into_both >= 90);
  }
  // The replicas agree after the recovery, and every step was trained once.
  REQUIRE(checksums_after.size() == 2);
  CHECK(checksums_after[0] == checksums_after[1]);
  auto steps = events(dir.path / "metrics.jsonl", "step");
  REQUIRE(steps.size() == 100);
  for (size_t i = 0; i < steps.size(); ++i) CHECK(steps[i]["step"] == i + 1);
  const double before = r->evals.front().second, after = r->evals.back().second;
  INFO("held-out accuracy " << before << " -> " << after);
  CHECK(after > 0.85);
}

TEST_CASE("environment: running sums are replayable, judge each turn against the true total, and end after the "
          "last turn",
          "[rl][env]") {
  auto c = config::parse_rl_config("[task]\nname = \"running_sum\"\nturns = 3\n[model]\ncontext_length = 32\n").value();
  auto env = env::make_environment(c);
  REQUIRE(env);
  const std::string first = env->first(5);
  CHECK(first == env->first(5));  // replayable
  const size_t plus = first.find('+');
  REQUIRE(plus != std::string::npos);
  const int64_t a = std::stoll(first.substr(0, plus)), b = std::stoll(first.substr(plus + 1));
  std::vector<std::string> turns = {std::to_string(a + b)};
  auto o1 = env->next(5, turns);
  CHECK_FALSE(o1.done);
  REQUIRE(o1.text.size() == 3);  // "+k="
  const int64_t k = o1.text[1] - '0';
  CHECK(o1.reward == Approx(1.0 / 3));
  turns.push_back("999");  // wrong
  auto o2 = env->next(5, turns);
  CHECK_FALSE(o2.done);
  CHECK(o2.reward == Approx(1.0 / 3));
  const int64_t k2 = o2.text[1] - '0';
  turns.push_back(std::to_string(a + b + k + k2));  // right: the true total, not its own wrong one
  auto o3 = env->next(5, turns);
  CHECK(o3.done);
  CHECK(o3.reward == Approx(2.0 / 3));
  CHECK(env->next(5, std::vector<std::string>{"x", "y", "z"}).reward == 0);
  // A teacher without errors plays the episode perfectly.
  std::mt19937_64 rng(1);
  std::vector<std::string> played;
  env::Observation o;
  do {
    played.push_back(env->teacher_turn(5, played, 0.0, rng));
    o = env->next(5, played);
  } while (!o.done);
  CHECK(o.reward == 1.0);
  CHECK(env::make_environment(config::parse_rl_config("").value()) == nullptr);
}

TEST_CASE("rl job: a multi-turn environment's episodes are played turn by turn and trained on the model's turns",
          "[rl][job][env]") {
  TempDir dir;
  auto s = session();
  const std::string text =
      "[run]\nseed = 3\nsteps = 4\neval_every = 100\n[warmup]\nsteps = 150\nexamples = 2000\n"
      "[task]\nname = \"running_sum\"\nturns = 3\nmin_digits = 1\nmax_digits = 2\neval_problems = 50\n"
      "[model]\ncontext_length = 32\n[algorithm]\nprompts_per_step = 8\ngroup_size = 4\n";
  auto r = controller::run_rl_job(s->runtime(), s->cluster(), text, quiet_options(dir.path));
  if (!r) FAIL(r.error().message());
  auto steps = events(dir.path / "metrics.jsonl", "step");
  REQUIRE(steps.size() == 4);
  for (const auto& st : steps) {
    CHECK(st["reward_mean"].get<double>() >= 0);
    CHECK(st["reward_mean"].get<double>() <= 1);
    CHECK(st["samples"].get<size_t>() == 8 * 4);
  }
  REQUIRE(r->evals.size() >= 2);
  CHECK(r->evals.back().second >= 0);
}

TEST_CASE("troupe rl: a bad config is refused before anything starts, with the key named and exit code 2",
          "[rl][config]") {
  TempDir dir;
  const fs::path bad = dir.path / "bad.toml";
  std::ofstream(bad) << "[rollout]\nenignes = 2\n";
  auto run = [](const std::string& cmd) {
    std::string out;
    FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[512];
    while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
    const int status = ::pclose(p);
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, out);
  };
  auto [code, out] = run(std::string(TROUPE_CLI) + " rl train " + bad.string() + " --run-dir " +
                         (dir.path / "run").string());
  CHECK(code == 2);
  CHECK_THAT(out, Catch::Contains("unknown key 'rollout.enignes'"));
  CHECK_FALSE(fs::exists(dir.path / "run"));  // nothing started
  auto [rcode, rout] = run(std::string(TROUPE_CLI) + " rl report " + (dir.path / "nothing").string());
  CHECK(rcode == 1);
  CHECK_THAT(rout, Catch::Contains("metrics.jsonl"));
}
