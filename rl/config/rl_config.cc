#include "config/rl_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "model/tokenizer.h"

namespace troupe::rl::config {
namespace {

template <class E>
using Choices = std::vector<std::pair<std::string_view, E>>;

const Choices<Mode> kModes = {{"sync", Mode::sync}, {"async", Mode::async}};
const Choices<Placement> kPlacements = {{"colocated", Placement::colocated},
                                        {"disaggregated", Placement::disaggregated}};
const Choices<WeightSync> kWeightSyncs = {{"rma", WeightSync::rma}, {"broadcast", WeightSync::broadcast}};
const Choices<Algorithm> kAlgorithms = {{"grpo", Algorithm::grpo}, {"rloo", Algorithm::rloo}, {"ppo", Algorithm::ppo}};
const Choices<TaskKind> kTasks = {
    {"arithmetic", TaskKind::arithmetic}, {"code", TaskKind::code}, {"running_sum", TaskKind::running_sum}};
const Choices<ModelInit> kInits = {
    {"random", ModelInit::random}, {"warmup", ModelInit::warmup}, {"checkpoint", ModelInit::checkpoint}};
const Choices<model::LossAggregation> kAggregations = {
    {"token_mean", model::LossAggregation::token_mean},
    {"sequence_mean", model::LossAggregation::sequence_mean},
    {"sequence_sum_over_positions", model::LossAggregation::sequence_sum_over_positions}};
const Choices<TrainerConfig::Device> kTrainerDevices = {
    {"cpu", TrainerConfig::Device::cpu}, {"cuda", TrainerConfig::Device::cuda}, {"host", TrainerConfig::Device::host}};
const Choices<Device> kRolloutDevices = {{"cpu", Device::cpu}, {"cuda", Device::cuda}, {"host", Device::host}};
const Choices<model::MatmulPrecision> kPrecisions = {{"fp32", model::MatmulPrecision::fp32},
                                                     {"tf32", model::MatmulPrecision::tf32},
                                                     {"bf16", model::MatmulPrecision::bf16}};
const Choices<model::KlEstimator> kKl = {{"k1", model::KlEstimator::k1}, {"k3", model::KlEstimator::k3}};

template <class E>
std::string_view name_of(const Choices<E>& choices, E value) {
  for (const auto& [name, v] : choices) {
    if (v == value) return name;
  }
  return "?";
}

std::string describe(const toml::node& n) {
  std::ostringstream out;
  if (n.is_string()) {
    out << '"' << n.as_string()->get() << '"';
  } else if (n.is_table()) {
    out << "a table";
  } else if (n.is_array()) {
    out << "an array";
  } else {
    n.visit([&](const auto& v) { out << v; });
  }
  return out.str();
}

// Reads the keys of one table, remembering the first error; finish() then
// refuses the keys nobody asked for.
class TableReader {
 public:
  TableReader(const toml::table* table, std::string name, std::string source, Status* first_error)
      : table_(table), name_(std::move(name)), source_(std::move(source)), error_(first_error) {}

  void count(std::string_view key, size_t& out, size_t min, size_t max = std::numeric_limits<uint32_t>::max()) {
    const toml::node* n = take(key);
    if (n == nullptr) return;
    auto v = n->value<int64_t>();
    if (!n->is_integer() || !v || *v < static_cast<int64_t>(min) || static_cast<uint64_t>(*v) > max) {
      return fail(key, "must be an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " +
                           describe(*n));
    }
    out = static_cast<size_t>(*v);
  }
  void seed(std::string_view key, uint64_t& out) {
    size_t v = out;
    count(key, v, 0, std::numeric_limits<int64_t>::max());
    out = v;
  }
  void number(std::string_view key, double& out, double min, double max) {
    const toml::node* n = take(key);
    if (n == nullptr) return;
    std::optional<double> v;
    if (n->is_floating_point()) v = n->value<double>();
    if (n->is_integer()) v = static_cast<double>(*n->value<int64_t>());
    if (!v || !std::isfinite(*v) || *v < min || *v > max) {
      std::ostringstream range;
      range << "must be a number in [" << min << ", " << max << "], got ";
      return fail(key, range.str() + describe(*n));
    }
    out = *v;
  }
  void boolean(std::string_view key, bool& out) {
    const toml::node* n = take(key);
    if (n == nullptr) return;
    if (!n->is_boolean()) return fail(key, "must be true or false, got " + describe(*n));
    out = *n->value<bool>();
  }
  void string(std::string_view key, std::string& out) {
    const toml::node* n = take(key);
    if (n == nullptr) return;
    if (!n->is_string()) return fail(key, "must be a string, got " + describe(*n));
    out = n->as_string()->get();
  }
  template <class E>
  void choice(std::string_view key, E& out, const Choices<E>& choices) {
    const toml::node* n = take(key);
    if (n == nullptr) return;
    std::string names;
    for (const auto& [name, v] : choices) names += (names.empty() ? "\"" : ", \"") + std::string(name) + "\"";
    if (n->is_string()) {
      for (const auto& [name, v] : choices) {
        if (n->as_string()->get() == name) {
          out = v;
          return;
        }
      }
    }
    fail(key, "must be one of " + names + ", got " + describe(*n));
  }

  // Refuses the keys of the table that were not read.
  void finish() {
    if (table_ == nullptr || !error_->ok()) return;
    for (const auto& [k, v] : *table_) {
      if (std::find(read_.begin(), read_.end(), k.str()) != read_.end()) continue;
      std::string known;
      for (const auto& r : asked_) known += (known.empty() ? "" : ", ") + r;
      *error_ = Status(ErrorCode::invalid_argument, source_ + ": unknown key '" + qualified(k.str()) + "' (keys of [" +
                                                        name_ + "]: " + known + ")");
      return;
    }
  }

 private:
  const toml::node* take(std::string_view key) {
    asked_.emplace_back(key);
    if (table_ == nullptr || !error_->ok()) return nullptr;
    const toml::node* n = table_->get(key);
    if (n != nullptr) read_.emplace_back(key);
    return n;
  }
  std::string qualified(std::string_view key) const { return name_ + "." + std::string(key); }
  void fail(std::string_view key, const std::string& what) {
    if (error_->ok()) *error_ = Status(ErrorCode::invalid_argument, source_ + ": '" + qualified(key) + "' " + what);
  }

  const toml::table* table_;
  std::string name_, source_;
  Status* error_;
  std::vector<std::string> asked_, read_;
};

void read_digits(TableReader& r, tasks::ArithmeticConfig& c) {
  r.count("min_digits", c.min_digits, 1, 9);
  r.count("max_digits", c.max_digits, 1, 9);
}

void read_optim(TableReader& r, model::AdamWConfig& c) {
  r.number("learning_rate", c.learning_rate, 0, 10);
  r.number("weight_decay", c.weight_decay, 0, 10);
  r.number("beta1", c.beta1, 0, 0.999999);
  r.number("beta2", c.beta2, 0, 0.999999);
  r.number("clip_norm", c.clip_norm, 0, 1e6);
  r.count("lr_warmup_steps", c.warmup_steps, 0);
  r.count("lr_decay_steps", c.decay_steps, 0);
}

Status bad(const std::string& source, const std::string& what) {
  return Status(ErrorCode::invalid_argument, source + ": " + what);
}

}  // namespace

size_t RlConfig::answer_budget() const {
  if (algorithm.sampling.max_new_tokens > 0) return algorithm.sampling.max_new_tokens;
  // The longest answer (a sum has one digit more than its operands, a
  // difference may have a sign; an expression has at most 6 bytes a step),
  // EOS, and room for one token too many.
  if (task.kind == TaskKind::code) return 6 * task.code.max_steps + 4;
  if (task.kind == TaskKind::running_sum) return task.problems.max_digits + 4;  // the total grows by the addends
  return task.problems.max_digits + 3;
}

model::GptConfig RlConfig::trainer_shape() const {
  model::GptConfig s = model.shape;
  s.value_head = algorithm.name == Algorithm::ppo;
  return s;
}

model::SamplingParams RlConfig::rollout_sampling() const {
  model::SamplingParams p = algorithm.sampling;
  p.max_new_tokens = answer_budget();
  p.stop_token = model::ByteTokenizer::kEos;
  return p;
}

Status RlConfig::validate() const {
  const std::string source = "config";
  if (Status s = model.shape.validate(); !s.ok()) return bad(source, "[model]: " + s.message());
  if (model.shape.vocab_size < static_cast<size_t>(model::ByteTokenizer::kVocabSize)) {
    return bad(source, "'model.vocab_size' must be at least the byte tokenizer's " +
                           std::to_string(model::ByteTokenizer::kVocabSize));
  }
  for (const auto* t : {&task.problems, &warmup.problems}) {
    if (Status s = t->validate(); !s.ok()) return bad(source, s.message());
  }
  if (Status s = algorithm.sampling.validate(); !s.ok()) return bad(source, "[algorithm]: " + s.message());
  if (Status s = algorithm.loss.validate(); !s.ok()) return bad(source, "[algorithm]: " + s.message());
  // BOS + the longest prompt + the answer budget must fit the context.
  const size_t digits = std::max(task.problems.max_digits, warmup.problems.max_digits);
  size_t prompt = 2 * digits + 2;  // "a+b="
  std::string what = std::to_string(digits) + "-digit problems";
  if (task.kind == TaskKind::code) {
    if (Status s = task.code.validate(); !s.ok()) return bad(source, "[task]: " + s.message());
    // "subtract 99 then ..." and the closing ':'.
    prompt = task.code.max_steps * (9 + std::to_string(task.code.max_constant).size()) + 1;
    what = std::to_string(task.code.max_steps) + "-step functions";
  }
  if (task.kind == TaskKind::running_sum) {
    if (task.problems.subtraction) return bad(source, "'task.subtraction' must be false for \"running_sum\"");
    // The first sum, then each turn's answer and the next addend ("+7=").
    prompt += (task.turns - 1) * (answer_budget() + 3);
    what = std::to_string(task.turns) + "-turn episodes of " + what;
  }
  const size_t need = 1 + prompt + answer_budget();
  if (model.shape.context_length < need) {
    return bad(source, "'model.context_length' is " + std::to_string(model.shape.context_length) + ", too short for " +
                           what + " and " + std::to_string(answer_budget()) + " answer tokens; it needs " +
                           std::to_string(need));
  }
  if (model.init == ModelInit::checkpoint && model.checkpoint.empty()) {
    return bad(source, "'model.checkpoint' must name a safetensors file when 'model.init' is \"checkpoint\"");
  }
  if (trainer.ranks > algorithm.prompts_per_step * algorithm.group_size) {
    return bad(source, "'trainer.ranks' (" + std::to_string(trainer.ranks) +
                           ") is more than the sequences of a step (prompts_per_step x group_size = " +
                           std::to_string(algorithm.prompts_per_step * algorithm.group_size) + ")");
  }
  if (algorithm.mini_batches > algorithm.prompts_per_step * algorithm.group_size) {
    return bad(source, "'algorithm.mini_batches' (" + std::to_string(algorithm.mini_batches) +
                           ") is more than the sequences of a step (prompts_per_step x group_size = " +
                           std::to_string(algorithm.prompts_per_step * algorithm.group_size) + ")");
  }
  if (trainer.device != TrainerConfig::Device::cpu) {
    const std::string dev = "'trainer.device' \"" + std::string(name_of(kTrainerDevices, trainer.device)) + "\"";
    if (algorithm.name == Algorithm::ppo) {
      return bad(source, dev + " does not run PPO's value head (the device model has no kernels for it): use "
                               "\"cpu\", or 'algorithm.name' \"grpo\" or \"rloo\"");
    }
    if (algorithm.loss.entropy_coef > 0) {
      return bad(source, "'algorithm.entropy_coef' must be 0 with " + dev +
                             " (the device model computes no entropies); or use \"cpu\"");
    }
  }
  if (trainer.device != TrainerConfig::Device::cuda && trainer.precision != model::MatmulPrecision::fp32) {
    return bad(source, "'trainer.precision' is for 'trainer.device' \"cuda\" only (the CPU model is float32)");
  }
  if (rollout.device == Device::cuda && rollout.batch_invariant) {
    return bad(source,
               "'rollout.batch_invariant' must be false with 'rollout.device' \"cuda\" (cuBLAS picks its "
               "reduction order by shape, so a sample's last bits depend on its batch); or use \"cpu\"");
  }
  if (rollout.device != Device::cuda && rollout.precision != model::MatmulPrecision::fp32) {
    return bad(source, "'rollout.precision' is for 'rollout.device' \"cuda\" only (the CPU model is float32)");
  }
  if (run.mode == Mode::async && run.placement == Placement::colocated) {
    return bad(source, "'run.mode' \"async\" needs 'run.placement' \"disaggregated\" (colocated meshes take turns)");
  }
  if (rollout.weight_sync == WeightSync::broadcast && run.placement == Placement::colocated) {
    return bad(source, "'rollout.weight_sync' \"broadcast\" needs 'run.placement' \"disaggregated\" (colocated, each "
                       "engine reads the weights by one-sided reads: use \"rma\")");
  }
  if (run.placement == Placement::colocated && rollout.engines != trainer.ranks) {
    return bad(source, "'rollout.engines' (" + std::to_string(rollout.engines) + ") must equal 'trainer.ranks' (" +
                           std::to_string(trainer.ranks) +
                           ") when 'run.placement' is \"colocated\" (an engine shares each rank's process)");
  }
  if (rollout.max_sequences < algorithm.group_size) {
    return bad(source, "'rollout.max_sequences' must hold at least one group (" +
                           std::to_string(algorithm.group_size) + " sequences)");
  }
  return {};
}

Result<RlConfig> parse_rl_config(std::string_view text, std::string_view source_view) {
  const std::string source(source_view);
  toml::table root;
  try {
    root = toml::parse(text, source_view);
  } catch (const toml::parse_error& e) {
    const auto& at = e.source().begin;
    return error(ErrorCode::invalid_argument, source + ":" + std::to_string(at.line) + ":" +
                                                  std::to_string(at.column) + ": " + std::string(e.description()));
  }
  RlConfig c;
  Status first;
  const std::vector<std::string_view> tables = {"run",     "task",    "model",   "warmup",
                                                "algorithm", "trainer", "rollout", "reward"};
  for (const auto& [k, v] : root) {
    if (std::find(tables.begin(), tables.end(), k.str()) == tables.end()) {
      return error(ErrorCode::invalid_argument, source + ": unknown table or key '" + std::string(k.str()) +
                                                    "' (tables: run, task, model, warmup, algorithm, trainer, "
                                                    "rollout, reward)");
    }
    if (!v.is_table()) {
      return error(ErrorCode::invalid_argument, source + ": '" + std::string(k.str()) + "' must be a table ([" +
                                                    std::string(k.str()) + "])");
    }
  }
  auto table = [&](std::string_view name) { return TableReader(root[name].as_table(), std::string(name), source, &first); };
  {
    auto r = table("run");
    r.string("name", c.run.name);
    r.seed("seed", c.run.seed);
    r.count("steps", c.run.steps, 1, 1'000'000);
    r.choice("mode", c.run.mode, kModes);
    r.choice("placement", c.run.placement, kPlacements);
    r.count("max_staleness", c.run.max_staleness, 0, 64);
    r.count("eval_every", c.run.eval_every, 1);
    r.count("checkpoint_every", c.run.checkpoint_every, 0);
    r.count("keep_checkpoints", c.run.keep_checkpoints, 0);
    r.number("timeout_s", c.run.timeout_s, 1, 86400);
    r.finish();
  }
  {
    auto r = table("task");
    r.choice("name", c.task.kind, kTasks);
    read_digits(r, c.task.problems);
    r.boolean("subtraction", c.task.problems.subtraction);
    r.count("min_steps", c.task.code.min_steps, 1, 8);
    r.count("max_steps", c.task.code.max_steps, 1, 8);
    size_t max_constant = static_cast<size_t>(c.task.code.max_constant);
    r.count("max_constant", max_constant, 2, 99);
    c.task.code.max_constant = static_cast<int64_t>(max_constant);
    r.count("tests", c.task.code.tests, 1, 20);
    r.count("turns", c.task.turns, 1, 16);
    r.count("eval_problems", c.task.eval_problems, 1, 100'000);
    r.seed("eval_seed", c.task.eval_seed);
    r.finish();
  }
  {
    auto r = table("model");
    auto& m = c.model.shape;
    r.count("layers", m.layers, 1, 256);
    r.count("heads", m.heads, 1, 256);
    r.count("channels", m.channels, 1, 65536);
    r.count("context_length", m.context_length, 2, 65536);
    r.count("vocab_size", m.vocab_size, 1, 1'000'000);
    r.boolean("tied_embeddings", m.tied_embeddings);
    r.choice("init", c.model.init, kInits);
    r.string("checkpoint", c.model.checkpoint);
    r.finish();
  }
  {
    auto r = table("warmup");
    auto& w = c.warmup;
    r.count("steps", w.steps, 0, 10'000'000);
    r.count("batch", w.batch, 1, 1'000'000);
    r.count("examples", w.examples, 1, 100'000'000);
    read_digits(r, w.problems);
    r.number("teacher_error", w.teacher_error, 0, 1);
    read_optim(r, w.optim);
    r.finish();
  }
  {
    auto r = table("algorithm");
    auto& a = c.algorithm;
    r.choice("name", a.name, kAlgorithms);
    r.count("prompts_per_step", a.prompts_per_step, 1, 1'000'000);
    r.count("group_size", a.group_size, 2, 4096);
    r.boolean("normalize_std", a.normalize_std);
    r.number("temperature", a.sampling.temperature, 0, 100);
    r.count("top_k", a.sampling.top_k, 0);
    r.number("top_p", a.sampling.top_p, 1e-6, 1);
    r.count("max_new_tokens", a.sampling.max_new_tokens, 0, 65536);
    r.number("clip_low", a.loss.clip_low, 0, 1);
    r.number("clip_high", a.loss.clip_high, 0, 100);
    r.number("kl_coef", a.loss.kl_coef, 0, 100);
    r.choice("kl_estimator", a.loss.kl_estimator, kKl);
    r.choice("loss_aggregation", a.loss.aggregation, kAggregations);
    r.number("entropy_coef", a.loss.entropy_coef, 0, 10);
    r.number("gamma", a.gamma, 0, 1);
    r.number("lambda", a.lambda, 0, 1);
    r.number("value_coef", a.value_coef, 0, 100);
    r.number("value_clip", a.value_clip, 0, 100);
    r.count("epochs", a.epochs, 1, 100);
    r.count("mini_batches", a.mini_batches, 1, 1'000'000);
    read_optim(r, a.optim);
    r.finish();
  }
  {
    auto r = table("trainer");
    r.count("ranks", c.trainer.ranks, 1, 1024);
    r.count("threads", c.trainer.threads, 1, 1024);
    r.boolean("shard_optimizer", c.trainer.shard_optimizer);
    r.boolean("shard_backup", c.trainer.shard_backup);
    r.choice("device", c.trainer.device, kTrainerDevices);
    r.choice("precision", c.trainer.precision, kPrecisions);
    r.number("gpus_per_rank", c.trainer.gpus_per_rank, 0.01, 64);
    r.finish();
  }
  {
    auto r = table("rollout");
    auto& o = c.rollout;
    r.count("engines", o.engines, 1, 1024);
    r.count("threads", o.threads, 1, 1024);
    r.count("max_sequences", o.max_sequences, 1, 65536);
    r.count("groups_in_flight", o.groups_in_flight, 1, 4096);
    r.boolean("batch_invariant", o.batch_invariant);
    r.choice("device", o.device, kRolloutDevices);
    r.choice("precision", o.precision, kPrecisions);
    r.number("gpus_per_engine", o.gpus_per_engine, 0.01, 64);
    // Larger single reads stall a worker's transport past its heartbeats (see docs/rl.md).
    r.count("sync_bucket_bytes", o.sync_bucket_bytes, 4096, size_t{64} << 20);
    r.count("sync_reads_in_flight", o.sync_reads_in_flight, 1, 64);
    r.choice("weight_sync", o.weight_sync, kWeightSyncs);
    r.finish();
  }
  {
    auto r = table("reward");
    r.count("workers", c.reward.workers, 1, 1024);
    r.count("sandboxes", c.reward.sandboxes, 1, 256);
    r.finish();
  }
  if (!first.ok()) return error(first);
  if (c.run.mode == Mode::sync) c.run.max_staleness = 0;
  if (Status s = c.validate(); !s.ok()) {
    std::string msg = s.message();
    if (msg.rfind("config: ", 0) == 0) msg = source + ": " + msg.substr(8);
    return error(ErrorCode::invalid_argument, msg);
  }
  return c;
}

Result<RlConfig> load_rl_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return error(ErrorCode::not_found, "config: cannot read '" + path + "': " + std::strerror(errno) +
                                           " (give the path of a TOML file; examples/rl/ has some)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parse_rl_config(text.str(), path);
}

RlConfig job_config_or_throw(const std::string& config_text, std::string_view who) {
  auto c = parse_rl_config(config_text, "job config");
  if (!c) throw std::runtime_error(std::string(who) + ": " + c.error().message());
  return std::move(*c);
}

bool device_weight_broadcast(const RlConfig& c) {
  return c.rollout.weight_sync == WeightSync::broadcast && c.trainer.device != Device::cpu &&
         c.trainer.device == c.rollout.device && !c.trainer.shard_optimizer;
}

std::string rl_config_json(const RlConfig& c) {
  auto digits = [](const tasks::ArithmeticConfig& t) {
    return nlohmann::json{{"min_digits", t.min_digits}, {"max_digits", t.max_digits}, {"subtraction", t.subtraction}};
  };
  auto optim = [](const model::AdamWConfig& o) {
    return nlohmann::json{{"learning_rate", o.learning_rate},   {"weight_decay", o.weight_decay},
                          {"beta1", o.beta1},                   {"beta2", o.beta2},
                          {"clip_norm", o.clip_norm},           {"lr_warmup_steps", o.warmup_steps},
                          {"lr_decay_steps", o.decay_steps}};
  };
  nlohmann::json j;
  j["run"] = {{"name", c.run.name},
              {"seed", c.run.seed},
              {"steps", c.run.steps},
              {"mode", name_of(kModes, c.run.mode)},
              {"placement", name_of(kPlacements, c.run.placement)},
              {"max_staleness", c.run.max_staleness},
              {"eval_every", c.run.eval_every},
              {"checkpoint_every", c.run.checkpoint_every},
              {"keep_checkpoints", c.run.keep_checkpoints},
              {"timeout_s", c.run.timeout_s}};
  j["task"] = digits(c.task.problems);
  j["task"]["name"] = name_of(kTasks, c.task.kind);
  j["task"]["eval_problems"] = c.task.eval_problems;
  j["task"]["min_steps"] = c.task.code.min_steps;
  j["task"]["max_steps"] = c.task.code.max_steps;
  j["task"]["max_constant"] = c.task.code.max_constant;
  j["task"]["tests"] = c.task.code.tests;
  j["task"]["turns"] = c.task.turns;
  j["task"]["eval_seed"] = c.task.eval_seed;
  const auto& m = c.model.shape;
  j["model"] = {{"layers", m.layers},
                {"heads", m.heads},
                {"channels", m.channels},
                {"context_length", m.context_length},
                {"vocab_size", m.vocab_size},
                {"tied_embeddings", m.tied_embeddings},
                {"init", name_of(kInits, c.model.init)},
                {"checkpoint", c.model.checkpoint}};
  j["warmup"] = optim(c.warmup.optim);
  j["warmup"].update(digits(c.warmup.problems));
  j["warmup"].update({{"steps", c.warmup.steps},
                      {"batch", c.warmup.batch},
                      {"examples", c.warmup.examples},
                      {"teacher_error", c.warmup.teacher_error}});
  const auto& a = c.algorithm;
  j["algorithm"] = optim(a.optim);
  j["algorithm"].update({{"name", name_of(kAlgorithms, a.name)},
                         {"prompts_per_step", a.prompts_per_step},
                         {"group_size", a.group_size},
                         {"normalize_std", a.normalize_std},
                         {"temperature", a.sampling.temperature},
                         {"top_k", a.sampling.top_k},
                         {"top_p", a.sampling.top_p},
                         {"max_new_tokens", a.sampling.max_new_tokens},
                         {"clip_low", a.loss.clip_low},
                         {"clip_high", a.loss.clip_high},
                         {"kl_coef", a.loss.kl_coef},
                         {"kl_estimator", name_of(kKl, a.loss.kl_estimator)},
                         {"loss_aggregation", name_of(kAggregations, a.loss.aggregation)},
                         {"entropy_coef", a.loss.entropy_coef},
                         {"gamma", a.gamma},
                         {"lambda", a.lambda},
                         {"value_coef", a.value_coef},
                         {"value_clip", a.value_clip},
                         {"epochs", a.epochs},
                         {"mini_batches", a.mini_batches}});
  j["trainer"] = {{"ranks", c.trainer.ranks},
                  {"threads", c.trainer.threads},
                  {"shard_optimizer", c.trainer.shard_optimizer},
                  {"shard_backup", c.trainer.shard_backup},
                  {"device", name_of(kTrainerDevices, c.trainer.device)},
                  {"precision", name_of(kPrecisions, c.trainer.precision)},
                  {"gpus_per_rank", c.trainer.gpus_per_rank}};
  j["rollout"] = {{"engines", c.rollout.engines},
                  {"threads", c.rollout.threads},
                  {"max_sequences", c.rollout.max_sequences},
                  {"groups_in_flight", c.rollout.groups_in_flight},
                  {"batch_invariant", c.rollout.batch_invariant},
                  {"device", name_of(kRolloutDevices, c.rollout.device)},
                  {"precision", name_of(kPrecisions, c.rollout.precision)},
                  {"gpus_per_engine", c.rollout.gpus_per_engine},
                  {"sync_bucket_bytes", c.rollout.sync_bucket_bytes},
                  {"sync_reads_in_flight", c.rollout.sync_reads_in_flight},
                  {"weight_sync", name_of(kWeightSyncs, c.rollout.weight_sync)}};
  j["reward"] = {{"workers", c.reward.workers}, {"sandboxes", c.reward.sandboxes}};
  return j.dump();
}

}  // namespace troupe::rl::config
