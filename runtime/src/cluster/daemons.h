// The long-running cluster processes, as functions the `troupe` command line
// runs in the foreground (`troupe start ... --block`, or the daemon child of
// `troupe start`): a head, and a node agent.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>

#include "head/head_actor.h"
#include "troupe/placement.h"
#include "troupe/status.h"

namespace troupe::cluster {

/// Called once the process answers, with its address.
using ReadyFn = std::function<void(const std::string& address)>;
/// Blocks until the process should stop (a signal, a test).
using WaitFn = std::function<void()>;

struct HeadOptions {
  /// Where to listen ("tcp://127.0.0.1:6380"); the address agents dial.
  std::string listen = "tcp://127.0.0.1:6380";
  /// Where the head keeps its state (SQLite), so that it can restart.
  std::filesystem::path data_dir;
  /// Heartbeat period and the dead-node bound.
  HeadConfig config;
};

/// Runs a head until `wait` returns. Errors: the data directory is taken or
/// unusable, the address cannot be listened on.
Status run_head(const HeadOptions& options, const ReadyFn& ready, const WaitFn& wait);

struct AgentOptions {
  /// The head ("tcp://host:port" or "host:port").
  std::string head;
  /// Unique in the cluster; default: hostname-pid.
  std::string node_id;
  /// What the node offers; CPU, memory and GPU default to what the machine has.
  ResourceMap resources;
  Labels labels;
  /// Where the agent listens (its workers and the head reach it there).
  std::string listen = "tcp://127.0.0.1:0";
  /// Where jobs' output goes.
  std::filesystem::path log_dir = "/tmp/troupe-logs";
};

/// The machine's resources: CPU (cores), memory (bytes), GPU (devices the
/// CUDA driver reports; 0 without CUDA), with `overrides` on top.
ResourceMap detect_resources(const ResourceMap& overrides);

/// Runs a node agent until `wait` returns: registers with the head, beats,
/// and registers again whenever the head comes back after a loss. It keeps
/// trying (with backoff, logging each failure) while the head is away.
Status run_agent(const AgentOptions& options, const ReadyFn& ready, const WaitFn& wait);

}  // namespace troupe::cluster
