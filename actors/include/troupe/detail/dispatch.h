// Internal: compile-time glue between an actor class's `handle` overloads and
// the runtime. A typed send carries a pointer to invoke<A, M> so that the
// receiver calls the handler without any lookup; untyped sends are resolved
// through the class's DispatchTable.
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>

#include "troupe/detail/message.h"
#include "troupe/status.h"

namespace troupe {
template <class R>
class Deferred;
}

namespace troupe::detail {

template <class... Ts>
struct TypeList {};

template <class T>
struct IsResult : std::false_type {};
template <class T>
struct IsResult<Result<T>> : std::true_type {};

template <class T>
struct IsDeferred : std::false_type {};
template <class T>
struct IsDeferred<Deferred<T>> : std::true_type {};

/// What an ask to a handler returning H yields: Result<T> and Deferred<T>
/// collapse to T (their errors travel as the ask's error).
template <class H>
struct ReplyOf {
  using type = H;
};
template <class T>
struct ReplyOf<Result<T>> {
  using type = T;
};
template <class T>
struct ReplyOf<Deferred<T>> {
  using type = T;
};

template <class A, class M>
using HandlerResult = decltype(std::declval<A&>().handle(std::declval<M&&>()));

/// The type an ask of message M to actor class A replies with.
template <class A, class M>
using reply_t = typename ReplyOf<HandlerResult<A, M>>::type;

/// True when actor class A lists message type M in its Actor<A, Ms...> base.
template <class A, class M>
constexpr bool accepts = []<class... Ms>(TypeList<Ms...>) {
  return (std::is_same_v<M, Ms> || ...);
}(typename A::messages{});

/// Calls A::handle(M) for the envelope's message and completes its reply.
template <class A, class M>
void invoke(ActorBase& base, Envelope& env) {
  A& self = static_cast<A&>(base);
  M& msg = env.box.template get<M>();
  using H = HandlerResult<A, M>;
  if constexpr (std::is_void_v<H>) {
    self.handle(std::move(msg));
    complete_reply_void<void>(env.reply);
  } else if constexpr (IsDeferred<H>::value) {
    // The handler took the reply with defer(); the returned copy is dropped.
    (void)self.handle(std::move(msg));
  } else if constexpr (IsResult<H>::value) {
    H r = self.handle(std::move(msg));
    if (!r) {
      if (env.reply) {
        ReplyRef reply = std::move(env.reply);
        reply->fail(std::move(r.error()));
      }
    } else if constexpr (std::is_void_v<typename H::value_type>) {
      complete_reply_void<void>(env.reply);
    } else {
      complete_reply<typename H::value_type>(env.reply, std::move(*r));
    }
  } else {
    complete_reply<H>(env.reply, self.handle(std::move(msg)));
  }
}

struct HandlerEntry {
  TypeKey key;
  InvokeFn fn;
};

/// Everything the runtime needs to know about an actor class.
struct DispatchTable {
  const HandlerEntry* entries;
  size_t size;
  TypeKey actor_type;
  const std::string& (*actor_type_name)();

  InvokeFn find(TypeKey key) const {
    for (size_t i = 0; i < size; ++i) {
      if (entries[i].key == key) return entries[i].fn;
    }
    return nullptr;
  }
};

template <class A, class... Ms>
const DispatchTable& make_dispatch_table(TypeList<Ms...>) {
  static constexpr HandlerEntry entries[] = {{type_key<Ms>(), &invoke<A, Ms>}..., {nullptr, nullptr}};
  static const DispatchTable table{entries, sizeof...(Ms), type_key<A>(), &type_name<A>};
  return table;
}

template <class A>
const DispatchTable& dispatch_table() {
  return make_dispatch_table<A>(typename A::messages{});
}

}  // namespace troupe::detail
