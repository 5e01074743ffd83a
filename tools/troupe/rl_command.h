// `troupe rl ...`: the RL job from the command line.
//
//   troupe rl train CONFIG.toml [--address HOST:PORT] [--run-dir DIR] [--resume] [--transport tcp|ucx]
//   troupe rl report RUN_DIR
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace troupe::cli {

/// The options of `troupe rl`'s subcommands, filled by CLI11.
struct RlCommand {
  CLI::App* rl = nullptr;
  CLI::App* train = nullptr;
  CLI::App* report = nullptr;
  std::string config_path, address, run_dir, transport = "tcp";
  bool resume = false;
};

/// Adds `rl train` and `rl report` to `app`.
RlCommand add_rl_commands(CLI::App& app);

/// Runs the parsed `troupe rl` subcommand; returns the exit code.
int run_rl_command(const RlCommand& cmd);

}  // namespace troupe::cli
