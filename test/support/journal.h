// A thread-safe event log that tests wait on: actors append lines, the test
// waits (with a timeout) until the lines it expects are there. No sleeps.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace troupe::test {

class Journal {
 public:
  void add(std::string line) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(std::move(line));
    }
    cv_.notify_all();
  }

  std::vector<std::string> lines() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }

  size_t count(const std::string& line) const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<size_t>(std::count(lines_.begin(), lines_.end(), line));
  }

  /// Waits until `pred(lines)` holds; false after `timeout`.
  template <class Pred>
  bool wait(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(lines_); });
  }

  /// Waits until `line` has been added at least `n` times.
  bool wait_for(const std::string& line, size_t n = 1, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    return wait([&](const std::vector<std::string>& ls) {
      return static_cast<size_t>(std::count(ls.begin(), ls.end(), line)) >= n;
    }, timeout);
  }

  /// Waits until there are at least `n` lines.
  bool wait_size(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    return wait([&](const std::vector<std::string>& ls) { return ls.size() >= n; }, timeout);
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<std::string> lines_;
};

using JournalPtr = std::shared_ptr<Journal>;

/// The lines of `all` that start with `prefix`, in order.
inline std::vector<std::string> starting_with(const std::vector<std::string>& all, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& l : all) {
    if (l.rfind(prefix, 0) == 0) out.push_back(l);
  }
  return out;
}

}  // namespace troupe::test
