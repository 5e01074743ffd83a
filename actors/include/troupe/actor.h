// Defining actors: a class with state in members and one `handle` overload per
// message type, deriving from Actor<Self, Messages...>.
//
//   struct Add { int n; };
//   struct Get {};
//   class Counter : public troupe::Actor<Counter, Add, Get> {
//    public:
//     void handle(const Add& m) { total_ += m.n; }
//     int handle(const Get&) { return total_; }
//    private:
//     int total_ = 0;
//   };
//
// A handler's return value answers asks; `void` answers with "done";
// Result<T> answers with T or its error; Deferred<T> answers later.
// Handlers run one at a time per actor; an exception escaping one crashes
// the actor and its supervisor decides what happens next.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/actor_ref.h"
#include "troupe/detail/dispatch.h"
#include "troupe/detail/message.h"
#include "troupe/detail/spawn.h"
#include "troupe/exit_reason.h"
#include "troupe/status.h"

namespace troupe {

/// Delivered to a monitor when the actor it watches has stopped for good
/// (restarts by a supervisor are not stops).
class RemoteBuffer;
class BufferRegistration;
template <class R>
class BufferThen;

struct Down {
  AnyRef actor;
  ExitReason reason;
};

/// Delivered to an actor when an actor linked to it exits abnormally.
struct LinkExit {
  AnyRef actor;
  ExitReason reason;
};

/// Identifies a timer set with after(); 0 is never a valid id.
using TimerId = uint64_t;
/// Identifies a monitor set with monitor(); 0 is never a valid id.
using MonitorId = uint64_t;

namespace detail {

class Cell;
class SupervisorActor;
struct Command;

/// A node in the asking actor's deadline list (see cell.cc): whichever comes
/// first, the reply or the deadline, runs the continuation; the other is
/// ignored. Both run on the asking actor's thread, one at a time.
class PendingAsk {
 public:
  PendingAsk* prev = nullptr;
  PendingAsk* next = nullptr;
  std::chrono::steady_clock::time_point deadline;
  uint64_t incarnation = 0;
  bool done = false;

  virtual void run_reply() = 0;
  virtual void run_error(Status status) = 0;
  virtual ReplyBase* reply_base() = 0;

 protected:
  ~PendingAsk() = default;
};

/// Adds `node` to the cell's deadline list (taking a reference).
void track_ask(Cell* cell, PendingAsk* node, std::chrono::milliseconds timeout);
/// Queues "the reply for `node` is ready" on the asking cell.
void post_reply(CellControl* asker, PendingAsk* node);
CellControl* control_of(Cell* cell);
ReplyRef take_current_reply(Cell* cell);

template <class R, class F>
class ActorReply final : public ReplyTo<R>, public PendingAsk {
 public:
  ActorReply(CellPtr asker, F fn) : asker_(std::move(asker)), fn_(std::move(fn)) {}

  void complete(Result<R>&& r) override {
    value_.emplace(std::move(r));
    post_reply(asker_.get(), this);
  }
  void run_reply() override { fn_(std::move(*value_)); }
  void run_error(Status status) override { fn_(Result<R>(Unexpected{std::move(status)})); }
  ReplyBase* reply_base() override { return this; }

 private:
  CellPtr asker_;
  F fn_;
  std::optional<Result<R>> value_;
};

}  // namespace detail

/// An ask made inside an actor; nothing is sent until then() is called.
template <class R>
class [[nodiscard]] AskThen {
 public:
  /// Sends the ask. `fn(Result<R>)` runs later on this actor, one message at
  /// a time like a handler, with the reply or the error (timeout, actor_dead,
  /// handler_failed, ...). It never runs if this incarnation has ended.
  template <class F>
  void then(F&& fn) && {
    using Node = detail::ActorReply<R, std::decay_t<F>>;
    auto* node = new Node(detail::CellPtr(detail::control_of(cell_)), std::forward<F>(fn));
    detail::ReplyRef reply(node);  // the envelope's reference
    detail::track_ask(cell_, node, timeout_);
    if (!target_) {
      reply->fail(detail::empty_ref_status("ask"));
      return;
    }
    (void)detail::send(target_, detail::Envelope(std::move(box_), invoke_, std::move(reply)));
  }

  /// Internal.
  AskThen(detail::Cell* cell, detail::CellControl* target, detail::MessageBox box,
          detail::InvokeFn invoke, std::chrono::milliseconds timeout)
      : cell_(cell), target_(target), box_(std::move(box)), invoke_(invoke), timeout_(timeout) {}

 private:
  detail::Cell* cell_;
  detail::CellControl* target_;
  detail::MessageBox box_;
  detail::InvokeFn invoke_;
  std::chrono::milliseconds timeout_;
};

/// A reply that a handler answers later (after its own asks complete, say).
/// Copyable; complete or fail it once, from the actor's own handlers. If the
/// last copy is destroyed unanswered, the asker gets handler_failed.
template <class R>
class Deferred {
 public:
  Deferred() = default;

  /// Answers the ask with a value.
  template <class V = R>
    requires(!std::is_void_v<V>)
  void complete(V value) {
    if (state_ && state_->reply) detail::complete_reply<R>(state_->reply, std::move(value));
  }
  /// Answers an ask whose reply type is void.
  void complete()
    requires std::is_void_v<R>
  {
    if (state_ && state_->reply) detail::complete_reply_void<void>(state_->reply);
  }
  /// Answers the ask with an error.
  void fail(Status status) {
    if (state_ && state_->reply) {
      detail::ReplyRef r = std::move(state_->reply);
      r->fail(std::move(status));
    }
  }
  /// True while there is an asker waiting for this reply.
  bool pending() const { return state_ && state_->reply; }

  /// Internal.
  explicit Deferred(detail::ReplyRef reply) : state_(std::make_shared<State>(std::move(reply))) {}

 private:
  struct State {
    explicit State(detail::ReplyRef r) : reply(std::move(r)) {}
    ~State() {
      if (reply) {
        reply->fail(Status(ErrorCode::handler_failed,
                           "deferred reply dropped: the actor never answered this ask"));
      }
    }
    detail::ReplyRef reply;
  };
  std::shared_ptr<State> state_;
};

/// Base of every actor class. Users derive from Actor<Self, Messages...>,
/// which fills in the dispatch; the members here are the actor's view of the
/// runtime and may only be called from the actor's own handlers and hooks.
class ActorBase {
 public:
  ActorBase() = default;
  virtual ~ActorBase();
  ActorBase(const ActorBase&) = delete;
  ActorBase& operator=(const ActorBase&) = delete;

  /// Runs before the first message of each incarnation (after restore()).
  /// Throwing here fails the start.
  virtual void on_start() {}
  /// Runs when an incarnation ends: stop, crash, shutdown. Exceptions thrown
  /// here are logged and ignored.
  virtual void on_stop(const ExitReason& reason) { (void)reason; }
  /// Returns the state to carry into the next incarnation, or nothing.
  /// Called by checkpoint(), every N messages when the spawn options ask for
  /// it, and at a graceful stop; not after a crash (the state is suspect).
  virtual std::optional<std::string> snapshot() { return std::nullopt; }
  /// Called on a new incarnation, before on_start(), with the last snapshot.
  virtual void restore(std::string_view bytes) { (void)bytes; }
  /// Called when a linked actor exits abnormally. The default crashes this
  /// actor too (Erlang's behaviour without trap_exit); override to survive.
  virtual void on_link_exit(const LinkExit& exit);

 protected:
  /// A reference to this actor.
  AnyRef self() const;
  /// This actor's path in its supervision tree.
  std::string path() const;
  /// How many times this actor has been restarted.
  uint32_t restart_count() const;
  /// Ends this incarnation normally once the current handler returns.
  void stop();
  /// Crashes this actor now with `reason` (throws; do not catch it).
  [[noreturn]] void fail(std::string reason);
  /// Stores snapshot() now, for the next incarnation to restore.
  void checkpoint();

  /// Asks another actor without blocking: `ask(ref, msg).then([this](Result<R> r) {...})`.
  template <class A, class M>
  AskThen<detail::reply_t<A, std::remove_cvref_t<M>>> ask(
      const ActorRef<A>& to, M&& msg, std::chrono::milliseconds timeout = kDefaultTimeout) {
    using V = std::remove_cvref_t<M>;
    static_assert(detail::accepts<A, V>, "ask: the actor class does not list this message type");
    return {cell_, to.cell(), detail::MessageBox::make(std::forward<M>(msg)), &detail::invoke<A, V>,
            resolve(timeout)};
  }
  /// Asks an untyped reference; the reply must be of type R.
  template <class R, class M>
  AskThen<R> ask(const AnyRef& to, M&& msg, std::chrono::milliseconds timeout = kDefaultTimeout) {
    return {cell_, to.cell(), detail::MessageBox::make(std::forward<M>(msg)), nullptr, resolve(timeout)};
  }

  /// Reads `n` bytes at `offset` of a remote buffer without blocking:
  /// `read_buffer(buf, n).then([this](Result<std::vector<std::byte>> r) {...})`.
  /// The bytes land in memory the operation owns, so nothing dangles if this
  /// incarnation ends first. (Defined in remote_buffer.h.)
  BufferThen<std::vector<std::byte>> read_buffer(const RemoteBuffer& from, size_t n, uint64_t offset = 0,
                                                 std::chrono::milliseconds timeout = kDefaultTimeout);
  /// Writes `bytes` at `offset` of a remote buffer without blocking;
  /// `.then([this](Result<void> r) {...})` runs once they are in the owner's
  /// memory. (Defined in remote_buffer.h.)
  BufferThen<void> write_buffer(const RemoteBuffer& to, std::vector<std::byte> bytes, uint64_t offset = 0,
                                std::chrono::milliseconds timeout = kDefaultTimeout);
  /// Reads `n` bytes at `offset` of a remote buffer straight into `dst`
  /// (no copy on the way), without blocking; `.then([this](Result<void>
  /// r) {...})` runs once they are there. `keep` owns the memory at `dst`:
  /// the operation holds it until the transport is done with `dst`, so the
  /// memory outlives a read still in flight when this incarnation ends.
  /// (Defined in remote_buffer.h.)
  BufferThen<void> read_buffer_into(const RemoteBuffer& from, std::shared_ptr<void> keep, void* dst, size_t n,
                                    uint64_t offset = 0, std::chrono::milliseconds timeout = kDefaultTimeout);
  /// Runtime::register_buffer from inside an actor: `size` bytes at `data`
  /// become readable and writable by other processes through the
  /// registration's handle (see remote_buffer.h).
  Result<BufferRegistration> register_buffer(void* data, size_t size);
  /// Runtime::allocate_buffer from inside an actor: memory made to be read
  /// remotely (shared memory that a peer on this host maps, over UCX).
  Result<BufferRegistration> allocate_buffer(size_t size);

  /// Runs `fn` on this actor after `delay` (unless cancelled or the
  /// incarnation ends first).
  TimerId after(std::chrono::milliseconds delay, std::function<void()> fn);
  /// Cancels a timer; no effect if it already ran.
  void cancel(TimerId id);

  /// Calls `fn` on this actor when `other` stops for good.
  MonitorId monitor(const AnyRef& other, std::function<void(const Down&)> fn);
  /// Stops a monitor.
  void demonitor(MonitorId id);

  /// Links this incarnation with `other`: an abnormal exit of either is
  /// delivered to the other's on_link_exit(). Linking a dead actor delivers
  /// its exit at once.
  void link(const AnyRef& other);
  /// Removes a link.
  void unlink(const AnyRef& other);

  /// Takes the current ask's reply, to answer it later. For a tell, returns
  /// a Deferred that is not pending.
  template <class R>
  Deferred<R> defer() {
    return Deferred<R>(detail::take_current_reply(cell_));
  }

  /// Starts an actor that is not supervised by this one (it lives until it
  /// stops or the runtime shuts down).
  template <class A, class... Args>
  ActorRef<A> spawn(Args&&... args) {
    return ActorRef<A>(detail::spawn_in(cell_runtime(), detail::make_spawn_spec<A>(
                                                            SpawnOptions{}, std::forward<Args>(args)...)));
  }

 private:
  friend class detail::Cell;
  friend class detail::SupervisorActor;
  std::chrono::milliseconds resolve(std::chrono::milliseconds timeout) const;
  detail::RuntimeImpl* cell_runtime() const;

  /// The class's handlers.
  virtual const detail::DispatchTable& dispatch_table_() const = 0;
  /// Starts an incarnation; supervisors override this to start children
  /// asynchronously. Calls done(ok) or done(error).
  virtual void start_async_(std::function<void(Status)> done);
  /// Ends an incarnation; supervisors override this to stop children first.
  virtual void stop_async_(const ExitReason& reason, std::function<void()> done);
  /// Runtime commands addressed to this instance (supervisor protocol).
  virtual void on_command_(detail::Command& cmd);

  detail::Cell* cell_ = nullptr;
};

/// The base to derive actor classes from: `class Foo : public Actor<Foo, M1, M2>`,
/// with a public `handle(const Mi&)` for every listed message type.
template <class Self, class... Messages>
class Actor : public ActorBase {
 public:
  /// The message types this actor handles.
  using messages = detail::TypeList<Messages...>;

 private:
  const detail::DispatchTable& dispatch_table_() const final { return detail::dispatch_table<Self>(); }
};

}  // namespace troupe
