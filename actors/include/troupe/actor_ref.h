// References to actors: cheap to copy and compare, valid across restarts of
// the actor they name, and failing fast (actor_dead) once it has stopped.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "troupe/detail/dispatch.h"
#include "troupe/detail/message.h"
#include "troupe/future.h"
#include "troupe/status.h"

namespace troupe {

/// Passed as an ask timeout to mean "the runtime's default ask timeout".
inline constexpr std::chrono::milliseconds kDefaultTimeout{-1};

namespace detail {

inline std::chrono::milliseconds resolve_timeout(CellControl* to, std::chrono::milliseconds t) {
  return t.count() < 0 ? default_ask_timeout(to) : t;
}

inline Status empty_ref_status(const char* op) {
  return Status(ErrorCode::actor_dead,
                std::string(op) + ": the ActorRef is empty (default-built or moved from)");
}

template <class R>
Future<R> ask_cell(CellControl* to, MessageBox box, InvokeFn fn, std::chrono::milliseconds timeout) {
  auto* state = new FutureState<R>();
  ReplyRef reply(state);
  ReplyRef mine = reply;
  if (to == nullptr) {
    reply->fail(empty_ref_status("ask"));
  } else {
    timeout = resolve_timeout(to, timeout);
    (void)send(to, Envelope(std::move(box), fn, std::move(reply)));
  }
  return Future<R>(std::move(mine), timeout.count() < 0 ? std::chrono::milliseconds(0) : timeout);
}

}  // namespace detail

/// A reference to an actor of any class. Messages are checked when they
/// arrive: a type the actor has no handler for fails with unknown_message.
class AnyRef {
 public:
  /// An empty reference; tell/ask on it fail with actor_dead.
  AnyRef() = default;

  /// Sends a message without waiting for anything.
  template <class M>
  Status tell(M&& msg) const {
    if (!cell_) return detail::empty_ref_status("tell");
    return detail::send(cell_.get(), detail::Envelope(detail::MessageBox::make(std::forward<M>(msg)),
                                                      nullptr, {}));
  }

  /// Sends a message and returns the future reply, which must be of type R.
  template <class R, class M>
  Future<R> ask(M&& msg, std::chrono::milliseconds timeout = kDefaultTimeout) const {
    return detail::ask_cell<R>(cell_.get(), detail::MessageBox::make(std::forward<M>(msg)), nullptr,
                               timeout);
  }

  /// Process-unique id of the actor (0 for an empty reference).
  uint64_t id() const { return cell_ ? detail::cell_id(cell_.get()) : 0; }
  /// The actor's path, e.g. "/app/workers/w-3".
  std::string path() const { return cell_ ? detail::cell_path(cell_.get()) : std::string("<empty>"); }
  /// True unless empty.
  explicit operator bool() const { return static_cast<bool>(cell_); }

  friend bool operator==(const AnyRef& a, const AnyRef& b) { return a.cell_ == b.cell_; }

  /// Internal.
  explicit AnyRef(detail::CellPtr cell) : cell_(std::move(cell)) {}
  /// Internal.
  detail::CellControl* cell() const { return cell_.get(); }

 private:
  detail::CellPtr cell_;
};

/// A typed reference to an actor of class A: tell and ask only compile for
/// messages A handles, and ask's reply type is the handler's return type.
template <class A>
class ActorRef {
 public:
  /// An empty reference; tell/ask on it fail with actor_dead.
  ActorRef() = default;

  /// Sends a message without waiting for anything. Returns mailbox_full or
  /// actor_dead when it could not be queued.
  template <class M>
  Status tell(M&& msg) const {
    using V = std::remove_cvref_t<M>;
    static_assert(detail::accepts<A, V>, "tell: the actor class does not list this message type");
    if (!cell_) return detail::empty_ref_status("tell");
    return detail::send(cell_.get(), detail::Envelope(detail::MessageBox::make(std::forward<M>(msg)),
                                                      &detail::invoke<A, V>, {}));
  }

  /// Sends a message and returns the future reply. `timeout` bounds the wait
  /// (kDefaultTimeout: the runtime's default).
  template <class M>
  Future<detail::reply_t<A, std::remove_cvref_t<M>>> ask(
      M&& msg, std::chrono::milliseconds timeout = kDefaultTimeout) const {
    using V = std::remove_cvref_t<M>;
    static_assert(detail::accepts<A, V>, "ask: the actor class does not list this message type");
    return detail::ask_cell<detail::reply_t<A, V>>(
        cell_.get(), detail::MessageBox::make(std::forward<M>(msg)), &detail::invoke<A, V>, timeout);
  }

  /// The same actor, untyped.
  AnyRef untyped() const { return AnyRef(cell_); }
  /// Checked conversion from an untyped reference.
  static Result<ActorRef> from(const AnyRef& any) {
    if (!any) return error(ErrorCode::invalid_argument, "ActorRef::from: empty reference");
    if (detail::cell_actor_type(any.cell()) != detail::type_key<A>()) {
      return error(ErrorCode::type_mismatch, "ActorRef::from: actor " + any.path() + " is not a " +
                                                 detail::type_name<A>());
    }
    return ActorRef(detail::CellPtr(any.cell()));
  }

  /// Process-unique id of the actor (0 for an empty reference).
  uint64_t id() const { return cell_ ? detail::cell_id(cell_.get()) : 0; }
  /// The actor's path, e.g. "/app/workers/w-3".
  std::string path() const { return cell_ ? detail::cell_path(cell_.get()) : std::string("<empty>"); }
  /// True unless empty.
  explicit operator bool() const { return static_cast<bool>(cell_); }

  friend bool operator==(const ActorRef& a, const ActorRef& b) { return a.cell_ == b.cell_; }
  operator AnyRef() const { return AnyRef(cell_); }

  /// Internal.
  explicit ActorRef(detail::CellPtr cell) : cell_(std::move(cell)) {}
  /// Internal.
  detail::CellControl* cell() const { return cell_.get(); }

 private:
  detail::CellPtr cell_;
};

namespace detail {
/// Writes a ref for the wire: its node's address and its id there (local
/// actors are exported so that the peer can reach them).
void encode_ref(codec::Writer& w, CellControl* cell);
/// Reads a ref written by encode_ref: a local cell, a proxy, or empty.
bool decode_ref(codec::Reader& r, CellPtr* out);
}  // namespace detail

namespace codec {
template <>
struct Codec<AnyRef> {
  static void write(Writer& w, const AnyRef& r) { detail::encode_ref(w, r.cell()); }
  static bool read(Reader& r, AnyRef& out) {
    detail::CellPtr cell;
    if (!detail::decode_ref(r, &cell)) return false;
    out = AnyRef(std::move(cell));
    return true;
  }
};
template <class A>
struct Codec<ActorRef<A>> {
  static void write(Writer& w, const ActorRef<A>& r) { detail::encode_ref(w, r.cell()); }
  static bool read(Reader& r, ActorRef<A>& out) {
    detail::CellPtr cell;
    if (!detail::decode_ref(r, &cell)) return false;
    out = ActorRef<A>(std::move(cell));
    return true;
  }
};
}  // namespace codec

}  // namespace troupe

template <class A>
struct std::hash<troupe::ActorRef<A>> {
  size_t operator()(const troupe::ActorRef<A>& r) const noexcept {
    return std::hash<const void*>()(r.cell());
  }
};

template <>
struct std::hash<troupe::AnyRef> {
  size_t operator()(const troupe::AnyRef& r) const noexcept {
    return std::hash<const void*>()(r.cell());
  }
};
