// An environment variable set for a scope (and the processes started in
// it), then put back as it was: set to its old value, or unset.
#pragma once

#include <cstdlib>
#include <string>
#include <utility>

namespace troupe::test {

class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::string& value) : name_(std::move(name)) {
    if (const char* v = std::getenv(name_.c_str())) {
      had_ = true;
      before_ = v;
    }
    ::setenv(name_.c_str(), value.c_str(), 1);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() { had_ ? (void)::setenv(name_.c_str(), before_.c_str(), 1) : (void)::unsetenv(name_.c_str()); }

 private:
  std::string name_, before_;
  bool had_ = false;
};

}  // namespace troupe::test
