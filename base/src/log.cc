#include "log.h"

#include <memory>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "troupe/log.h"

namespace troupe {
namespace detail {

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> log = [] {
    auto l = std::make_shared<spdlog::logger>("troupe", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ troupe %v");
    l->set_level(spdlog::level::info);
    return l;
  }();
  return *log;
}

}  // namespace detail

bool set_log_level(std::string_view level) {
  auto lvl = spdlog::level::from_str(std::string(level));
  // from_str maps unknown names to "off"; only accept "off" when asked for.
  if (lvl == spdlog::level::off && level != "off") return false;
  detail::logger().set_level(lvl);
  return true;
}

}  // namespace troupe
