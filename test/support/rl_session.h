// An embedded cluster for the RL tests: a session whose worker processes
// share this machine's cores.
#pragma once

#include <memory>

#include <catch2/catch.hpp>

#include "troupe/init.h"

namespace troupe::test {

/// A session offering 8 CPUs (the job's processes share this machine's
/// cores), logging errors only.
inline std::unique_ptr<troupe::Session> rl_session() {
  troupe::InitOptions options;
  options.runtime.log_level = "error";
  options.resources["CPU"] = 8;
  auto s = troupe::init(options);
  REQUIRE(s.has_value());
  return std::move(*s);
}

}  // namespace troupe::test
