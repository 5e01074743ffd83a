// A local cluster for the cluster benchmarks: a head and node agents started
// with the `troupe` command line as children of the benchmark (dying with
// it), in a temporary TROUPE_HOME that is removed at the end.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "support/daemon.h"

namespace troupe::bench {

class LocalCluster {
 public:
  /// `agents` agents "a0".. with `cpus` CPUs each; `transport` "tcp" or "ucx".
  /// `host_ids`, when given, one per agent: its TROUPE_HOST_ID (agents with
  /// different ones stand for different hosts: their processes never share
  /// memory).
  LocalCluster(const std::string& name, const std::string& token, int agents, const std::string& cpus,
               const std::string& transport = "tcp", const std::vector<std::string>& host_ids = {})
      : home_(std::filesystem::temp_directory_path() / ("troupe-" + name + "-" + std::to_string(getpid()))) {
    head_ = std::make_unique<test::Daemon>(test::troupe_cli(), home_, token,
                                           std::vector<std::string>{"start", "--head", "--port", "0", "--transport",
                                                                    transport, "--data-dir", (home_ / "head").string()});
    if (!head_->ok()) {
      error_ = "head: " + head_->said();
      return;
    }
    for (int i = 0; i < agents; ++i) {
      agents_.push_back(std::make_unique<test::Daemon>(
          test::troupe_cli(), home_, token,
          std::vector<std::string>{"start", "--address", head_->address(), "--node-id", "a" + std::to_string(i),
                                   "--cpus", cpus},
          host_ids.empty() ? std::vector<std::string>{}
                           : std::vector<std::string>{"env", "TROUPE_HOST_ID=" + host_ids[static_cast<size_t>(i)]}));
      if (!agents_.back()->ok()) {
        error_ = "agent: " + agents_.back()->said();
        return;
      }
    }
  }
  ~LocalCluster() {
    agents_.clear();
    head_.reset();
    std::error_code ec;
    std::filesystem::remove_all(home_, ec);
  }

  /// Empty when everything answered; else what did not.
  const std::string& error() const { return error_; }
  test::Daemon& head() { return *head_; }
  /// Starts the head again on its data directory and port (after kill9()).
  bool restart_head(const std::string& token, const std::string& port) {
    head_ = std::make_unique<test::Daemon>(test::troupe_cli(), home_, token,
                                           std::vector<std::string>{"start", "--head", "--port", port, "--data-dir",
                                                                    (home_ / "head").string()});
    return head_->ok();
  }
  std::vector<std::unique_ptr<test::Daemon>>& agents() { return agents_; }
  const std::filesystem::path& home() const { return home_; }

 private:
  std::filesystem::path home_;
  std::unique_ptr<test::Daemon> head_;
  std::vector<std::unique_ptr<test::Daemon>> agents_;
  std::string error_;
};

}  // namespace troupe::bench
