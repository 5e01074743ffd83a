// Human-readable forms of the actor layer's value types, and the backoff formula.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "troupe/exit_reason.h"
#include "troupe/supervisor.h"

namespace troupe {

std::string ExitReason::to_string() const {
  const char* k = "normal";
  switch (kind) {
    case Kind::normal: k = "normal"; break;
    case Kind::shutdown: k = "shutdown"; break;
    case Kind::failed: k = "failed"; break;
    case Kind::killed: k = "killed"; break;
  }
  return message.empty() ? std::string(k) : std::string(k) + ": " + message;
}

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case Strategy::one_for_one: return "one_for_one";
    case Strategy::one_for_all: return "one_for_all";
    case Strategy::rest_for_one: return "rest_for_one";
    case Strategy::simple_one_for_one: return "simple_one_for_one";
  }
  return "?";
}

std::string_view restart_name(Restart r) {
  switch (r) {
    case Restart::permanent: return "permanent";
    case Restart::transient: return "transient";
    case Restart::temporary: return "temporary";
  }
  return "?";
}

std::string CrashReport::to_string() const {
  return fmt::format("actor={} supervisor={} reason=\"{}\" restart_count={} strategy={} decision={}", actor,
                     supervisor.empty() ? "-" : supervisor, reason.to_string(), restart_count,
                     strategy_name(strategy), decision);
}

std::chrono::microseconds Backoff::delay(uint32_t attempt, double unit_random) const {
  // min * 2^attempt, computed in floating point so large attempts saturate at
  // max instead of overflowing.
  double base_us = std::chrono::duration<double, std::micro>(min).count() * std::pow(2.0, std::min<uint32_t>(attempt, 62));
  double max_us = std::chrono::duration<double, std::micro>(max).count();
  double capped = std::min(base_us, max_us);
  double jitter = 1.0 + std::clamp(unit_random, 0.0, 1.0) * random_factor;
  return std::chrono::microseconds(static_cast<int64_t>(capped * jitter));
}

}  // namespace troupe
