// Structured logs: one event per line, key=value details (spdlog underneath).
#pragma once

#include <string_view>

namespace troupe {

/// Sets the process-wide log level by name: trace, debug, info, warn, error,
/// off. Returns false (and changes nothing) for an unknown name.
bool set_log_level(std::string_view level);

}  // namespace troupe
