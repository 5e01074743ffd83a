#include "collectives/host_id.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

namespace troupe::collectives {

const std::string& host_id() {
  static const std::string id = [] {
    if (const char* set = std::getenv("TROUPE_HOST_ID"); set != nullptr && *set != '\0') return std::string(set);
    std::string boot;
    std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
    struct stat ns {};
    std::string pid_ns = ::stat("/proc/self/ns/pid", &ns) == 0 ? std::to_string(ns.st_ino) : "?";
    return (boot.empty() ? std::string("unknown-boot") : boot) + "/pidns:" + pid_ns;
  }();
  return id;
}

}  // namespace troupe::collectives
