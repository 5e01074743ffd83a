// Supervision trees that span nodes: a supervisor child that runs on the
// cluster. The supervisor (in this process) starts it by spawning the actor
// on a node the head picks; the actor's end, its worker's death or its
// node's loss is a crash of that child, and the supervisor's strategy
// decides (restart: a new actor on the cluster, wherever it fits now).
//
//   troupe::SupervisorSpec spec{.strategy = troupe::Strategy::one_for_one, .intensity = 5};
//   spec.children.push_back(troupe::remote_worker<Counter>(cluster, "counter", {.resources = {{"CPU", 1}}}, 0));
//   auto sup = rt.start_supervisor("app", spec).value();
//   auto counter = sup.child<Counter>("counter").value();   // messages go to the actor on the cluster
//
// See docs/cluster.md.
#pragma once

#include <string>
#include <tuple>
#include <utility>

#include "troupe/cluster.h"
#include "troupe/detail/actor_class.h"
#include "troupe/supervisor.h"

namespace troupe {

namespace detail {
/// The child spec of a remote child (class and encoded arguments).
ChildSpec remote_child_spec(const ClusterClient& cluster, std::string name, const std::string& class_key,
                            std::string args, ActorOptions options);
}  // namespace detail

/// A supervisor child of class A that runs on the cluster, placed by
/// `options` and built from `args` in a worker process. The supervisor does
/// the restarts (the head's max_restarts is not used); the child's ref
/// stays valid across them, messages waiting while it restarts. It is owned
/// by this driver: it stops when this process goes. A restarted child
/// starts from its constructor arguments (snapshots are not carried across
/// a supervisor's restarts of a remote child).
template <class A, class... Args>
ChildSpec remote_worker(const ClusterClient& cluster, std::string name, ActorOptions options, Args&&... args) {
  using Class = detail::ActorClass<A, detail::wire_arg_t<Args>...>;
  (void)Class::registered;
  ChildSpec c = detail::remote_child_spec(
      cluster, std::move(name), Class::key(),
      codec::encode(std::tuple<detail::wire_arg_t<Args>...>(std::forward<Args>(args)...)), std::move(options));
  c.spawn.actor_type = detail::type_key<A>();
  c.spawn.actor_type_name = &detail::type_name<A>;
  return c;
}

}  // namespace troupe
