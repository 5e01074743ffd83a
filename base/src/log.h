// Internal logging macro. Events are "event=name key=value ..." lines so that
// they can be grepped and parsed; keep them out of hot paths.
#pragma once

#include <spdlog/spdlog.h>

namespace troupe::detail {

/// The troupe logger (stderr).
spdlog::logger& logger();

}  // namespace troupe::detail

#define TROUPE_LOG(lvl, ...)                                                              \
  do {                                                                                    \
    auto& troupe_logger_ = ::troupe::detail::logger();                                    \
    if (troupe_logger_.should_log(spdlog::level::lvl)) troupe_logger_.log(spdlog::level::lvl, __VA_ARGS__); \
  } while (0)
