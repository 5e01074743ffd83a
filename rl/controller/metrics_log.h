// The run's metrics: RUN_DIR/metrics.jsonl, one JSON object per line
// ("event": run, step, eval, fault, checkpoint, resume, end; the fields of
// each are in docs/rl.md), appended and flushed line by line so that a
// run killed at any point leaves every line before it whole.
#pragma once

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "troupe/status.h"

namespace troupe::rl::controller {

/// Thread-safe.
class MetricsLog {
 public:
  /// Opens (appends to) `path`. Errors: it cannot be opened (the path and
  /// the OS's reason).
  static Result<std::unique_ptr<MetricsLog>> open(const std::string& path);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  /// Appends one line (a JSON object without a newline). Errors: the write
  /// failed (a full disk: the line is not half written, the run goes on
  /// without it and says so).
  Status append(const std::string& json_object);
  const std::string& path() const { return path_; }

 private:
  MetricsLog(std::string path, std::FILE* f) : path_(std::move(path)), f_(f) {}
  std::string path_;
  std::FILE* f_;
  std::mutex mu_;
};

}  // namespace troupe::rl::controller
