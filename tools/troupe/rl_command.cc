#include "rl_command.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <troupe/init.h>

#include "config/rl_config.h"
#include "controller/rl_job.h"
#include "report/report.h"

namespace troupe::cli {
namespace {

constexpr int kUsage = 2;

int fail(const std::string& what, int code = 1) {
  std::fprintf(stderr, "troupe rl: %s\n", what.c_str());
  return code;
}

// runs/<name>-<UTC time>: a fresh directory per run unless one is given.
std::string default_run_dir(const std::string& name) {
  char stamp[32];
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  return "runs/" + name + "-" + stamp;
}

int train(const RlCommand& cmd) {
  std::ifstream in(cmd.config_path, std::ios::binary);
  if (!in) return fail("cannot read the config '" + cmd.config_path + "' (examples/rl/ has some)", kUsage);
  std::ostringstream text;
  text << in.rdbuf();
  // Checked here, before any process starts: a wrong key names itself.
  auto config = rl::config::parse_rl_config(text.str(), cmd.config_path);
  if (!config) return fail(config.error().message(), kUsage);
  const std::string run_dir = cmd.run_dir.empty() ? default_run_dir(config->run.name) : cmd.run_dir;

  InitOptions init;
  init.address = cmd.address;
  init.runtime.transport = cmd.transport;
  // The job reports faults in its own words (console and metrics); the
  // runtime's own warnings (peers closing as the meshes stop) would only
  // repeat them. TROUPE_LOG_LEVEL brings them back.
  if (std::getenv("TROUPE_LOG_LEVEL") == nullptr) init.runtime.log_level = "error";
  // An embedded cluster offers what the job reserves, whatever the cores
  // (its processes then share them).
  const double cpus = static_cast<double>(
      config->trainer.ranks * config->trainer.threads + config->reward.workers +
      (config->run.placement == rl::config::Placement::disaggregated ? config->rollout.engines * config->rollout.threads
                                                                       : 0));
  init.resources["CPU"] = std::max<double>(cpus, std::thread::hardware_concurrency());
  auto session = troupe::init(init);
  if (!session) return fail("cannot start or join the cluster: " + session.error().message());
  std::fprintf(stderr, "troupe rl: run directory %s (%s cluster at %s)\n", run_dir.c_str(),
               (*session)->embedded() ? "embedded" : "joined", (*session)->address().c_str());
  rl::controller::JobOptions options;
  options.run_dir = run_dir;
  options.resume = cmd.resume;
  auto result = rl::controller::run_rl_job((*session)->runtime(), (*session)->cluster(), text.str(), options);
  if (!result) return fail(result.error().message());
  std::string evals;
  for (const auto& [step, acc] : result->evals) {
    char buf[48];
    std::snprintf(buf, sizeof(buf), "%s%zu: %.1f%%", evals.empty() ? "" : ", ", step, 100 * acc);
    evals += buf;
  }
  std::fprintf(stderr, "troupe rl: done: %zu steps in %.1f s, %zu fault(s); held-out accuracy by step: %s\n",
               result->steps, result->wall_seconds, result->faults, evals.c_str());
  std::fprintf(stderr, "troupe rl: metrics in %s; report: troupe rl report %s\n", result->metrics_path.c_str(),
               run_dir.c_str());
  return 0;
}

}  // namespace

RlCommand add_rl_commands(CLI::App& app) {
  RlCommand cmd;
  cmd.rl = app.add_subcommand("rl", "RL post-training on actor meshes: train, report");
  cmd.rl->require_subcommand(1);
  cmd.train = cmd.rl->add_subcommand("train", "Run an RL job: troupe rl train CONFIG.toml (see docs/rl.md)");
  cmd.train->add_option("config", cmd.config_path, "The job's TOML config (examples/rl/)")->required();
  cmd.train->add_option("--address", cmd.address, "A running cluster's head (HOST:PORT); default: an embedded one");
  cmd.train->add_option("--run-dir", cmd.run_dir, "Where metrics and checkpoints go (default runs/NAME-TIME)");
  cmd.train->add_flag("--resume", cmd.resume, "Continue the run in --run-dir from its latest checkpoint");
  cmd.train->add_option("--transport", cmd.transport,
                        "The embedded cluster's transport: tcp, or ucx (shared memory, one-sided weight reads)")
      ->check(CLI::IsMember({"tcp", "ucx"}));
  cmd.report = cmd.rl->add_subcommand("report", "Write RUN_DIR/report.html from a run's metrics");
  cmd.report->add_option("run_dir", cmd.run_dir, "The run's directory")->required();
  return cmd;
}

int run_rl_command(const RlCommand& cmd) {
  if (*cmd.train) {
    if (cmd.resume && cmd.run_dir.empty()) return fail("--resume needs the --run-dir of the run to continue", kUsage);
    return train(cmd);
  }
  auto written = rl::report::write_report(cmd.run_dir);
  if (!written) return fail(written.error().message());
  std::printf("%s\n", written->c_str());
  return 0;
}

}  // namespace troupe::cli
