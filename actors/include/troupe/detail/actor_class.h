// Internal: actor classes by name, so that another process running the same
// executable (a cluster worker) can build an actor from its class name and
// encoded constructor arguments.
//
// Nothing needs declaring: spawning `A` with arguments of types `Args...` on
// a cluster (ClusterClient::spawn) instantiates ActorClass<A, Args...>, whose
// static initialiser registers the pair at load time in every process of that
// executable, the worker included, before main() runs.
#pragma once

#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "troupe/codec.h"
#include "troupe/detail/spawn.h"
#include "troupe/status.h"

namespace troupe::detail {

/// Builds the spawn spec of one actor class from encoded constructor arguments.
using ActorClassFactory = Result<SpawnSpec> (*)(std::string_view args, SpawnOptions options);

/// Registers a class under `key` (called at load time by ActorClass).
bool register_actor_class(const std::string& key, ActorClassFactory make);
/// The factory registered under `key`, or nullptr.
ActorClassFactory find_actor_class(std::string_view key);

/// How a constructor argument travels: string literals as std::string.
template <class T>
using wire_arg_t = std::conditional_t<std::is_convertible_v<T, const char*> && !std::is_same_v<std::decay_t<T>, std::nullptr_t>,
                                      std::string, std::decay_t<T>>;

template <class A, class... Args>
struct ActorClass {
  static_assert((codec::Codable<Args> && ...),
                "spawn on a cluster: every constructor argument must be encodable (numbers, strings, "
                "vectors, maps, optionals, pairs, or structs with TROUPE_FIELDS)");

  /// "ns::Counter(int, std::string)": the class and the argument types.
  static const std::string& key() {
    static const std::string k = [] {
      std::string s = type_name<A>() + "(";
      bool first = true;
      ((s += (first ? "" : ", ") + type_name<Args>(), first = false), ...);
      return s + ")";
    }();
    return k;
  }

  static Result<SpawnSpec> make(std::string_view bytes, SpawnOptions options) {
    auto args = codec::decode<std::tuple<Args...>>(bytes);
    if (!args) {
      return error(ErrorCode::malformed, "actor class " + key() + ": its constructor arguments do not decode (" +
                                             args.error().message() + ")");
    }
    return std::apply([&](auto&... a) { return make_spawn_spec<A>(std::move(options), a...); }, *args);
  }

  static inline const bool registered = register_actor_class(key(), &make);
};

}  // namespace troupe::detail
