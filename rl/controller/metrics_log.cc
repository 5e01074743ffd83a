#include "controller/metrics_log.h"

#include <cerrno>
#include <cstring>
#include <unistd.h>

namespace troupe::rl::controller {

Result<std::unique_ptr<MetricsLog>> MetricsLog::open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    return error(ErrorCode::storage, "metrics: cannot open '" + path + "': " + std::strerror(errno) +
                                         " (give a writable --run-dir)");
  }
  return std::unique_ptr<MetricsLog>(new MetricsLog(path, f));
}

MetricsLog::~MetricsLog() { std::fclose(f_); }

Status MetricsLog::append(const std::string& json_object) {
  std::lock_guard lock(mu_);
  std::string line = json_object + "\n";
  // One write per line: the line is there whole or, on a short write, cut
  // back off so the next line starts clean.
  const long before = std::ftell(f_);
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0) {
    const int err = errno;
    std::clearerr(f_);
    if (before >= 0 && ftruncate(fileno(f_), before) == 0) std::fseek(f_, before, SEEK_SET);
    return Status(ErrorCode::storage, "metrics: cannot append to '" + path_ + "': " + std::strerror(err));
  }
  return {};
}

}  // namespace troupe::rl::controller
