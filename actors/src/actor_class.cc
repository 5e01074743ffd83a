#include "troupe/detail/actor_class.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace troupe::detail {

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, ActorClassFactory, std::less<>> classes;
};

// A function-local static: registrations run during static initialisation,
// in whatever order the translation units are initialised.
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

bool register_actor_class(const std::string& key, ActorClassFactory make) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  // The same class and argument types instantiated in two translation units
  // register the same (inline) factory: harmless.
  r.classes.emplace(key, make);
  return true;
}

ActorClassFactory find_actor_class(std::string_view key) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.classes.find(key);
  return it == r.classes.end() ? nullptr : it->second;
}

}  // namespace troupe::detail
