// The RL job on meshes, measured against its floors in the same run:
//
// - weight sync: a trainer rank's published weights read by a rollout
//   engine in another process (bucketed one-sided reads into the standby
//   copy, then the switch), for the main job's model and for a ~1 GiB
//   model, against a plain remote-buffer read of the same bytes from a
//   third process (the raw remote-buffer bandwidth). Target >= 80%.
//   And to 4 engines at once: each reading the whole buffer (the default,
//   rollout.weight_sync = "rma") against a broadcast from the trainer over
//   one collective group with the engines ("broadcast"), with one raw read
//   of the same bytes beside them.
// - rollout tokens/s of one engine fed through the mesh (prompt groups of
//   8, 8 in flight, continuous batching) against model::generate on the
//   same model and prompts in one process (the model benchmark's path).
// - the arithmetic job, sync and async on the same disaggregated config:
//   the RL phase's wall time and the time split per step, the async
//   speed-up, and held-out accuracy reached per minute.
// - ZeRO-1: train steps of 2 ranks with the optimizer state sharded against
//   the same steps replicated, and the moments each rank holds.
// - the trainer on a GPU (trainer.device = "cuda"), where one is: the main
//   job's train time per step against the same job's trainer on the CPU
//   (8 threads), for the main job's model and a 4-layer 512-channel one;
//   and a trainer's step with its state resident on the GPU against the
//   same step offloaded (parameters in, gradients out, the host's AdamW),
//   with those copies alone as the floor.
//
// Usage: troupe_bench_rl_job [--quick] [--transport tcp|ucx] [--only sync|fanout|zero1|rollout|job|gpu]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <troupe/init.h>
#include <troupe/mesh.h>
#include <troupe/worker.h>

#include "common/report.h"
#include "config/rl_config.h"
#include "controller/rl_job.h"
#include "model/device_model.h"
#include "model/generate.h"
#include "model/threads.h"
#include "rollout/rollout_engine.h"
#include "tasks/task.h"
#include "train/batch.h"
#include "train/policy_trainer.h"
#include "trainer/trainer_rank.h"

namespace {

using namespace troupe;
using namespace troupe::rl;
using bench::emit;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// The examples folder: TROUPE_EXAMPLES_DIR's value when set (a bundle run
// on another machine, scripts/gpu.sh), else this build's source tree's.
std::string examples_dir() {
  const char* env = std::getenv("TROUPE_EXAMPLES_DIR");
  return env != nullptr ? env : TROUPE_EXAMPLES_DIR;
}

// A tiny model: whether a CUDA device model can be made here at all.
model::GptConfig model_config_probe() {
  return model::GptConfig{.vocab_size = 259, .context_length = 16, .layers = 1, .heads = 1, .channels = 8};
}

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A one-process mesh of class A on a placement group of its own.
template <class A>
ActorMesh<A> one_process_mesh(const ClusterClient& cluster, const std::string& text, std::vector<ProcMesh>& keep) {
  PlacementGroupSpec spec;
  spec.bundles.assign(1, Bundle{{{"CPU", 1}}});
  auto pg = cluster.create_placement_group(spec).value();
  auto procs = ProcMesh::create(cluster, Shape::make({{"procs", 1}}).value(), pg).value();
  keep.push_back(procs);
  return procs.template spawn<A>({}, text).value();
}

std::string model_config(size_t layers, size_t channels, size_t heads) {
  return "[model]\ninit = \"random\"\nlayers = " + std::to_string(layers) + "\nchannels = " + std::to_string(channels) +
         "\nheads = " + std::to_string(heads) + "\n[rollout]\nmax_sequences = 8\n";
}

void weight_sync(Session& s, const std::string& name, const std::string& text, int reps) {
  std::vector<ProcMesh> procs;
  auto trainer = one_process_mesh<trainer::TrainerRank>(s.cluster(), text, procs);
  auto engine = one_process_mesh<rollout::RolloutEngine>(s.cluster(), text, procs);
  auto pub = trainer.member(0).ask(trainer::PublishWeights{1}, std::chrono::minutes(5)).get().value();
  const double bytes = static_cast<double>(pub.floats * sizeof(float));
  std::vector<double> sync_s, raw_s, engine_s;
  std::vector<float> local(pub.floats);
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    auto r = engine.member(0).ask(rollout::SyncWeights{pub}, std::chrono::minutes(5)).get();
    if (!r) {
      std::fprintf(stderr, "sync failed: %s\n", r.error().message().c_str());
      return;
    }
    sync_s.push_back(bench::seconds_since(t0));
    engine_s.push_back(r->seconds);
    t0 = Clock::now();
    auto raw = pub.buffer.read_into(local.data(), static_cast<size_t>(bytes), 0, std::chrono::minutes(5)).get();
    if (!raw) {
      std::fprintf(stderr, "raw read failed: %s\n", raw.error().message().c_str());
      return;
    }
    raw_s.push_back(bench::seconds_since(t0));
  }
  // A second floor: memcpy of the same bytes in this process (what a read
  // over shared memory is, at best).
  std::vector<double> memcpy_s;
  std::vector<float> copy(pub.floats);
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    std::memcpy(copy.data(), local.data(), static_cast<size_t>(bytes));
    memcpy_s.push_back(bench::seconds_since(t0));
  }
  // The best of the repetitions on both sides: floors, on a shared machine.
  const double sync = bench::quantile(sync_s, 0), raw = bench::quantile(raw_s, 0);
  // Below a few MiB a sync is a few round trips, not a copy: report it.
  const char* target = bytes >= (1 << 20) ? ">= 0.8" : "report";
  emit("rl_weight_sync", name + " engine-side seconds (reads and switch)", bench::quantile(engine_s, 0), "s",
       "raw remote-buffer read of the same bytes", raw, "report");
  emit("rl_weight_sync", name + " sync seconds (" + std::to_string(static_cast<int64_t>(bytes / (1 << 20))) + " MiB)",
       sync, "s", "raw remote-buffer read of the same bytes", raw, "report");
  emit("rl_weight_sync", name + " sync bandwidth", bytes / sync / 1e9, "GB/s", "raw remote-buffer read bandwidth",
       bytes / raw / 1e9, target);
  emit("rl_weight_sync", name + " sync bandwidth", bytes / sync / 1e9, "GB/s", "memcpy of the same bytes",
       bytes / bench::quantile(memcpy_s, 0) / 1e9, "report");
  for (auto& p : procs) (void)p.stop();
}

// Weight sync to `engines` engines at once, each in its own process: by
// one-sided reads (each engine reads the whole published buffer, as the job
// does with rollout.weight_sync = "rma") and by broadcast (trainer rank 0
// the root of one collective group with the engines, "broadcast"), against
// one raw remote-buffer read of the same bytes. Best of `reps` each.
void weight_sync_fanout(Session& s, const std::string& name, const std::string& text, size_t engines, int reps) {
  const auto minutes = std::chrono::minutes(5);
  std::vector<ProcMesh> procs;
  // A trainer of each setting: they publish into different memory (see
  // TrainerRank::published_memory_).
  auto reader = one_process_mesh<trainer::TrainerRank>(s.cluster(), text, procs);
  auto trainer = one_process_mesh<trainer::TrainerRank>(
      s.cluster(), text + "weight_sync = \"broadcast\"\n[run]\nplacement = \"disaggregated\"\n", procs);
  PlacementGroupSpec spec;
  spec.bundles.assign(engines, Bundle{{{"CPU", 1}}});
  auto pg = s.cluster().create_placement_group(spec).value();
  procs.push_back(ProcMesh::create(s.cluster(), Shape::make({{"engines", engines}}).value(), pg).value());
  auto mesh = procs.back().spawn<rollout::RolloutEngine>({}, text).value();
  auto groups = make_group({trainer.group_ranks(), mesh.group_ranks()}, GroupOptions{.timeout = minutes}).value();
  (void)trainer.member(0).ask(trainer::JoinWeightSyncGroup{groups[0]}).get().value();
  for (size_t e = 0; e < engines; ++e) (void)mesh.member(e).ask(trainer::JoinWeightSyncGroup{groups[e + 1]}).get().value();
  auto pub = reader.member(0).ask(trainer::PublishWeights{1}, minutes).get().value();
  const double bytes = static_cast<double>(pub.floats * sizeof(float));
  std::vector<float> local(pub.floats);
  std::vector<double> reads_s, broadcast_s, raw_s;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    auto all = mesh.call(rollout::SyncWeights{pub}, minutes);
    if (!all.ok()) {
      std::fprintf(stderr, "sync by reads failed: %s\n", all.errors()[0].second.message().c_str());
      return;
    }
    reads_s.push_back(bench::seconds_since(t0));
    t0 = Clock::now();
    auto root = trainer.member(0).ask(trainer::BroadcastWeights{2 + static_cast<uint64_t>(i), groups[0].id}, minutes);
    auto got = mesh.call(rollout::ReceiveWeights{2 + static_cast<uint64_t>(i), groups[0].id}, minutes);
    auto sent = root.get();
    if (!got.ok() || !sent || !sent->failed.empty()) {
      std::fprintf(stderr, "broadcast failed: %s\n",
                   !got.ok() ? got.errors()[0].second.message().c_str()
                             : (sent ? sent->failed.c_str() : sent.error().message().c_str()));
      return;
    }
    broadcast_s.push_back(bench::seconds_since(t0));
    t0 = Clock::now();
    if (!pub.buffer.read_into(local.data(), static_cast<size_t>(bytes), 0, minutes).get()) return;
    raw_s.push_back(bench::seconds_since(t0));
  }
  const double reads = bench::quantile(reads_s, 0), bcast = bench::quantile(broadcast_s, 0),
               raw = bench::quantile(raw_s, 0);
  const std::string what = name + ", " + std::to_string(engines) + " engines";
  emit("rl_weight_sync_fanout", what + " by reads: sync seconds", reads, "s", "one raw remote-buffer read", raw,
       "report");
  emit("rl_weight_sync_fanout", what + " by broadcast: sync seconds", bcast, "s", "one raw remote-buffer read", raw,
       "report");
  emit("rl_weight_sync_fanout", what + " by broadcast: bytes delivered per second", engines * bytes / bcast / 1e9,
       "GB/s", "the same by reads", engines * bytes / reads / 1e9, "report");
  (void)release_group({trainer.group_ranks(), mesh.group_ranks()}, groups[0]);
  for (auto& p : procs) (void)p.stop();
  (void)s.cluster().remove_placement_group(pg);
}

// Train steps on a 2-rank trainer mesh: the same supervised batches with
// the optimizer state replicated (allreduce of the gradients) and sharded
// (ZeRO-1: reduce-scatter, a step of each rank's half, allgather), and,
// with `backup`, what the driver does for trainer.shard_backup: each rank
// snapshots its segment as part of the step (TrainStep::snapshot), then
// one round in which the next rank reads it one-sidedly. Returns the mean
// step seconds and the moments' floats rank 0 holds.
std::pair<double, uint64_t> train_steps(Session& s, const std::string& text, int steps, bool backup = false) {
  auto config = config::parse_rl_config(text).value();
  PlacementGroupSpec spec;
  spec.bundles.assign(2, Bundle{{{"CPU", 1}}});
  auto pg = s.cluster().create_placement_group(spec).value();
  auto procs = ProcMesh::create(s.cluster(), Shape::make({{"ranks", 2}}).value(), pg).value();
  auto ranks = procs.spawn<trainer::TrainerRank>({}, text).value();
  auto groups = ranks.make_group().value();
  for (size_t r = 0; r < 2; ++r) (void)ranks.member(r).ask(trainer::JoinTrainerGroup{groups[r]}).get().value();
  auto set = tasks::warmup_set(config);
  std::mt19937_64 rng(7);
  auto batch = [&] {
    std::vector<trainer::WireSequence> seqs(config.warmup.batch / 2);
    for (auto& q : seqs) {
      const auto& src = set[rng() % set.size()];
      q.prompt = src.prompt;
      q.completion = src.completion;
    }
    return seqs;
  };
  double total = 0;
  for (int i = 0; i < steps + 1; ++i) {
    std::vector<Future<trainer::RankStepStats>> f;
    const auto t0 = Clock::now();
    for (size_t r = 0; r < 2; ++r) {
      f.push_back(
          ranks.member(r).ask(trainer::TrainStep{true, batch(), 0.5, static_cast<uint64_t>(i), false, backup}));
    }
    std::vector<trainer::ShardSnapshot> snaps;
    for (auto& x : f) {
      auto st = x.get().value();
      if (backup) snaps.push_back(st.snapshot.at(0));
    }
    if (backup) {
      std::vector<Future<void>> b;
      for (size_t r = 0; r < 2; ++r) b.push_back(ranks.member(r).ask(trainer::BackUpShard{snaps[1 - r]}));
      for (auto& x : b) (void)x.get().value();
    }
    if (i > 0) total += bench::seconds_since(t0);  // the first step warms the processes up
  }
  const uint64_t held = ranks.member(0).ask(trainer::GetTrainerInfo{}).get().value().optimizer_floats;
  (void)procs.stop();
  (void)s.cluster().remove_placement_group(pg);
  return {total / steps, held};
}

void zero1(Session& s, bool quick) {
  // A model large enough for the optimizer's memory to matter (3.2M
  // parameters; fewer with --quick).
  const std::string shape = quick ? "layers = 2\nchannels = 128\nheads = 4\n" : "layers = 4\nchannels = 256\nheads = 8\n";
  const std::string base = "[run]\nplacement = \"disaggregated\"\n[model]\ninit = \"warmup\"\n" + shape +
                           "[warmup]\nbatch = 32\n[trainer]\nranks = 2\n";
  const int steps = quick ? 5 : 20;
  auto [whole_s, whole_held] = train_steps(s, base, steps);
  auto [shard_s, shard_held] = train_steps(s, base + "shard_optimizer = true\n", steps);
  emit("rl_zero1", "train step seconds, 2 ranks, sharded optimizer", shard_s, "s", "the same steps, replicated optimizer",
       whole_s, "report");
  emit("rl_zero1", "optimizer moment floats per rank, sharded", static_cast<double>(shard_held), "floats",
       "replicated", static_cast<double>(whole_held), "0.5");
  auto [backup_s, backup_held] = train_steps(s, base + "shard_optimizer = true\n", steps, true);
  (void)backup_held;
  emit("rl_zero1", "train step seconds, 2 ranks, sharded, with the in-memory backup round", backup_s, "s",
       "the same steps, sharded without it", shard_s, "report");
}

void rollout_throughput(Session& s, const std::string& text, size_t groups) {
  auto config = config::parse_rl_config(text).value();
  std::vector<ProcMesh> procs;
  auto trainer = one_process_mesh<trainer::TrainerRank>(s.cluster(), text, procs);
  auto engine = one_process_mesh<rollout::RolloutEngine>(s.cluster(), text, procs);
  auto pub = trainer.member(0).ask(trainer::PublishWeights{0}).get().value();
  (void)engine.member(0).ask(rollout::SyncWeights{pub}).get().value();
  const size_t G = config.algorithm.group_size, in_flight = 8;
  std::vector<rollout::PromptGroup> all;
  for (size_t g = 0; g < groups; ++g) {
    all.push_back({g, tasks::prompt_tokens(tasks::rl_prompt(config, g).prompt), static_cast<uint32_t>(G),
                   tasks::group_seed(config, g)});
  }
  // Through the mesh: `in_flight` groups outstanding, a new one as each returns.
  auto t0 = Clock::now();
  size_t tokens = 0, next = 0;
  std::vector<Future<std::vector<rollout::GroupSamples>>> window;
  while (next < in_flight && next < groups) window.push_back(engine.member(0).ask(rollout::Generate{{all[next++]}, 0, -1}));
  while (!window.empty()) {
    auto r = window.front().get().value();
    window.erase(window.begin());
    for (const auto& smp : r[0].samples) tokens += smp.tokens.size();
    if (next < groups) window.push_back(engine.member(0).ask(rollout::Generate{{all[next++]}, 0, -1}));
  }
  const double mesh_tps = static_cast<double>(tokens) / bench::seconds_since(t0);
  // The floor: generate() in this process, the same model, prompts and
  // batch (in_flight x G sequences at a time), one compute thread as the
  // engine has.
  model::set_compute_threads(config.rollout.threads);
  auto gpt = model::Gpt<float>::make(config.model.shape).value();
  gpt.init_random(config.run.seed);
  auto cache = model::KvCache::make(config.model.shape, in_flight * G).value();
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& g : all) {
    for (size_t i = 0; i < G; ++i) prompts.push_back(g.prompt);
  }
  t0 = Clock::now();
  size_t local_tokens = 0;
  auto sampling = config.rollout_sampling();
  for (size_t i = 0; i < prompts.size(); i += in_flight * G) {
    std::vector<std::vector<int32_t>> wave(prompts.begin() + i, prompts.begin() + std::min(prompts.size(), i + in_flight * G));
    sampling.seed = i;
    auto out = model::generate(gpt, cache, wave, sampling);
    if (!out) {
      std::fprintf(stderr, "generate: %s\n", out.error().message().c_str());
      return;
    }
    for (const auto& c : *out) local_tokens += c.tokens.size();
  }
  const double local_tps = static_cast<double>(local_tokens) / bench::seconds_since(t0);
  emit("rl_rollout", "engine tokens/s through the mesh (groups of 8, 8 in flight)", mesh_tps, "tok/s",
       "model::generate in one process, same model and batch", local_tps, "report");
  for (auto& p : procs) (void)p.stop();
}

struct JobNumbers {
  double rl_s = 0, final_acc = 0, first_acc = 0;
  double gen = 0, reward = 0, train = 0, sync = 0, wait = 0;
  size_t steps = 0;
};

JobNumbers run_job(Session& s, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / ("troupe-rl-bench-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  controller::JobOptions options;
  options.run_dir = dir.string();
  options.progress = [](const std::string&) {};
  auto r = controller::run_rl_job(s.runtime(), s.cluster(), text, options).value();
  JobNumbers n;
  std::ifstream in(dir / "metrics.jsonl");
  double first_step_wall = -1, last_wall = 0;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] != "step") continue;
    const double w = j["wall_s"].get<double>();
    if (first_step_wall < 0) first_step_wall = w - j["step_s"].get<double>();
    last_wall = w;
    ++n.steps;
    const auto& t = j["time_s"];
    n.gen += t["generation"].get<double>();
    n.reward += t["reward"].get<double>();
    n.train += t["train"].get<double>();
    n.sync += t["sync"].get<double>();
    n.wait += t["wait"].get<double>();
  }
  n.rl_s = last_wall - first_step_wall;
  n.first_acc = r.evals.front().second;
  n.final_acc = r.evals.back().second;
  fs::remove_all(dir);
  return n;
}

// Sets `key`'s value (its first line "key = ..." after a newline).
std::string set_key(std::string text, const std::string& key, const std::string& value) {
  const size_t at = text.find("\n" + key + " = ");
  if (at == std::string::npos) throw std::runtime_error("bench: no key " + key);
  const size_t end = text.find('\n', at + 1);
  return text.substr(0, at + 1) + key + " = " + value + text.substr(end);
}

// The main job's trainer on the GPU against the CPU (train time per RL step).
void trainer_device(Session& s, bool quick) {
  if (auto probe = model::make_device_model(model_config_probe(), {.kind = model::DeviceKind::cuda}); !probe) {
    std::fprintf(stderr, "trainer on the GPU: skipped (%s)\n", probe.error().message().c_str());
    return;
  }
  std::string base = read_file(examples_dir() + "/rl/arithmetic_grpo_cuda.toml");
  base = set_key(set_key(base, "steps", quick ? "5" : "30"), "eval_every", "1000");
  base = set_key(set_key(base, "checkpoint_every", "0"), "threads", "8");
  struct Size {
    const char* name;
    const char *layers, *channels, *heads, *warmup;
  };
  for (const Size& m : {Size{"main job model", "2", "64", "4", "200"}, Size{"4x512 model", "4", "512", "8", "20"}}) {
    std::string text = set_key(set_key(set_key(base, "layers", m.layers), "channels", m.channels), "heads", m.heads);
    text = text.replace(text.find("\nsteps = 2000"), 13, std::string("\nsteps = ") + m.warmup);
    JobNumbers cpu = run_job(s, set_key(text, "device", "\"cpu\""));
    JobNumbers gpu = run_job(s, text);
    const double cpu_train = cpu.train / static_cast<double>(cpu.steps);
    const double gpu_train = gpu.train / static_cast<double>(gpu.steps);
    emit("rl_job", std::string("trainer on CPU (8 threads), ") + m.name + ": train time per step", cpu_train, "s", "-",
         0, "report");
    emit("rl_job", std::string("trainer on GPU, ") + m.name + ": train time per step", gpu_train, "s",
         "trainer on CPU", cpu_train, "report (ratio < 1: the GPU is faster)");
    emit("rl_job", std::string("trainer on GPU, ") + m.name + ": mean step time",
         gpu.rl_s / static_cast<double>(gpu.steps), "s", "trainer on CPU", cpu.rl_s / static_cast<double>(cpu.steps),
         "report");
  }
}

// The trainer's state on the GPU between steps (resident) against the
// same steps with the parameters uploaded and the gradients brought back
// to the host's AdamW each step (offloaded: ZeRO-1's way, and every step's
// before), on one PolicyTrainer; the floor beside them is those copies
// alone (the parameters in, the gradients out).
void trainer_residency(bool quick) {
  struct Size {
    const char* name;
    model::GptConfig config;
    size_t B;
  };
  const Size sizes[] = {
      {"4x512 model", {.vocab_size = 259, .context_length = 64, .layers = 4, .heads = 8, .channels = 512}, 16},
      {"GPT-2 small shape", {.vocab_size = 259, .context_length = 256, .layers = 12, .heads = 12, .channels = 768},
       8}};
  model::set_compute_threads(8);
  const int steps = quick ? 3 : 10;
  for (const Size& m : sizes) {
    const auto& c = m.config;
    std::vector<train::TrainSequence> seqs(m.B);
    std::mt19937 rng(7);
    for (auto& q : seqs) {
      q.prompt.resize(c.context_length / 4);
      q.completion.resize(c.context_length - c.context_length / 4);
      for (auto& t : q.prompt) t = static_cast<int32_t>(rng() % 256);
      for (auto& t : q.completion) t = static_cast<int32_t>(rng() % 256);
      q.completion_logprobs.assign(q.completion.size(), -2.0f);
      q.advantage = (rng() % 2 == 0) ? 0.5 : -0.5;
    }
    auto batch = train::make_train_batch(seqs, c.context_length, 258);
    if (!batch) throw std::runtime_error("bench: " + batch.error().message());
    model::PolicyLossConfig loss;
    loss.kl_coef = 0;
    auto gpt = model::Gpt<float>::make(c).value();
    gpt.init_random(1);
    const size_t P = gpt.layout().total();
    double ms[2] = {0, 0};
    for (int resident = 0; resident < 2; ++resident) {
      auto dev = model::make_device_model(c, {.kind = model::DeviceKind::cuda}).value();
      std::optional<model::ParamRange> range;
      if (resident == 0) range = model::ParamRange{0, P};
      train::PolicyTrainer t(gpt, {}, range, dev.get());
      if (!t.policy_step(*batch, loss)) throw std::runtime_error("bench: a trainer step failed");  // warm-up
      std::vector<double> times;
      for (int i = 0; i < steps; ++i) {
        const auto start = Clock::now();
        auto st = t.policy_step(*batch, loss);
        if (!st) throw std::runtime_error("bench: a trainer step failed: " + st.error().message());
        times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      }
      std::sort(times.begin(), times.end());
      ms[resident] = times[times.size() / 2];
    }
    // The floor: the offloaded step's copies alone.
    auto dev = model::make_device_model(c, {.kind = model::DeviceKind::cuda}).value();
    std::vector<float> host(P);
    std::vector<double> copies;
    for (int i = 0; i < steps; ++i) {
      const auto start = Clock::now();
      if (!dev->upload_params(gpt.params()).ok() || !dev->download_params(host.data()).ok()) {
        throw std::runtime_error("bench: a copy failed");
      }
      copies.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
    std::sort(copies.begin(), copies.end());
    const std::string what = std::string(m.name) + " (" + std::to_string(P / 1000000) + "M parameters, B" +
                             std::to_string(m.B) + " T" + std::to_string(c.context_length) + ")";
    emit("rl_job", "trainer step on GPU, state resident, " + what, ms[1] / 1e3, "s", "offloaded (host AdamW)",
         ms[0] / 1e3, "report (ratio < 1: resident is faster)");
    emit("rl_job", "parameters in + out over PCIe, " + what, copies[copies.size() / 2] / 1e3, "s",
         "offloaded step", ms[0] / 1e3, "report (the copies' share of an offloaded step)");
  }
}

}  // namespace

int main(int argc, char** argv) {
  troupe::serve_if_worker();
  const bool quick = bench::quick(argc, argv);
  std::string transport = "ucx";
  std::string only;  // --only PART: that part alone
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
  }
  auto part = [&](const char* name) { return only.empty() || only == name; };
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--transport") == 0) transport = argv[i + 1];
  }
  InitOptions init;
  init.runtime.log_level = "error";
  init.runtime.transport = transport;
  init.resources["CPU"] = 16;  // the benchmark's processes share the machine's cores
  auto session = troupe::init(init);
  if (!session) return std::fprintf(stderr, "%s\n", session.error().message().c_str()), 1;
  Session& s = **session;

  // Weight sync: the main job's model (~0.4 MB), then ~1 GiB (64 MiB quick).
  if (part("sync")) {
    weight_sync(s, "main job model", model_config(2, 64, 4), quick ? 5 : 20);
    if (quick) {
      weight_sync(s, "64 MiB model", model_config(4, 576, 8), 5);
    } else {
      weight_sync(s, "1 GiB model", model_config(16, 1152, 16), 7);
    }
  }
  // The same to several engines: by reads, and by broadcast.
  if (part("sync") || part("fanout")) {
    weight_sync_fanout(s, "main job model", model_config(2, 64, 4), 4, quick ? 5 : 20);
    weight_sync_fanout(s, "64 MiB model", model_config(4, 576, 8), 4, quick ? 3 : 7);
  }
  if (part("zero1")) zero1(s, quick);
  if (part("rollout")) rollout_throughput(s, model_config(2, 64, 4), quick ? 64 : 512);
  if (part("gpu")) {
    trainer_device(s, quick);
    if (model::make_device_model(model_config_probe(), {.kind = model::DeviceKind::cuda})) trainer_residency(quick);
  }
  if (!part("job")) return 0;

  // Sync vs async on the same disaggregated job.
  std::string base = read_file(examples_dir() + "/rl/arithmetic_grpo_async.toml");
  auto set = [](std::string text, const std::string& key, const std::string& value) {
    const size_t at = text.find("\n" + key + " = ");
    const size_t end = text.find('\n', at + 1);
    return text.substr(0, at + 1) + key + " = " + value + text.substr(end);
  };
  if (quick) {
    base = set(base, "steps", "10");
    base = set(set(base, "examples", "2000"), "eval_every", "10");
    base = base.replace(base.find("\nsteps = 2000"), 13, "\nsteps = 200");
  }
  const std::string sync_text = set(set(base, "mode", "\"sync\""), "max_staleness", "0");
  JobNumbers sync = run_job(s, sync_text);
  JobNumbers async = run_job(s, base);
  for (const auto& [name, n] : {std::pair<std::string, const JobNumbers&>{"sync", sync}, {"async", async}}) {
    const double steps = static_cast<double>(n.steps);
    emit("rl_job", name + " mean step time", n.rl_s / steps, "s", "-", 0, "report");
    emit("rl_job", name + " step split generation", n.gen / steps, "s", "-", 0, "report");
    emit("rl_job", name + " step split reward", n.reward / steps, "s", "-", 0, "report");
    emit("rl_job", name + " step split train", n.train / steps, "s", "-", 0, "report");
    emit("rl_job", name + " step split sync", n.sync / steps, "s", "-", 0, "report");
    emit("rl_job", name + " step split wait", n.wait / steps, "s", "-", 0, "report");
    emit("rl_job", name + " held-out accuracy gained per minute of RL", 6000 * (n.final_acc - n.first_acc) / n.rl_s,
         "points/min", "-", 0, "report");
  }
  emit("rl_job", "async speed-up (RL wall time, same steps)", sync.rl_s / async.rl_s, "x", "sync", 1.0,
       "report (AReaL: 2.77x at scale)");
  return 0;
}
