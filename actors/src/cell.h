// A cell is the CAF actor behind an ActorRef. It outlives the incarnations
// (instances of the user's class) that a supervisor restarts inside it, so a
// reference stays valid across restarts and queued messages are kept for the
// next incarnation. See docs/architecture.md for the life cycle.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>

#include "troupe/actor.h"
#include "troupe/detail/message.h"
#include "troupe/detail/spawn.h"
#include "troupe/exit_reason.h"

namespace troupe::detail {

class RuntimeImpl;

/// Runtime-to-cell and cell-to-supervisor traffic. Always sent with high
/// priority so that it is not stuck behind a long queue of user messages.
struct Command {
  enum class Kind : uint8_t {
    // supervisor -> child
    start,      // begin an incarnation; answered with started / start_failed
    stop,       // end the incarnation gracefully, keep the cell; answered with stopped
    terminate,  // end the incarnation and the cell; answered with stopped
    // anyone -> cell
    exit,         // Runtime::stop(): supervised -> exits (shutdown); else terminates
    parent_down,  // the supervisor's cell terminated: terminate too
    link_add,
    link_remove,
    link_exit,
    down,      // a monitor fired (id = monitor id)
    timer,     // an after() timer fired (id = timer id)
    ask_tick,  // check the ask deadline list (id = deadline it was armed for)
    remote_down,  // a proxy's remote actor (or its process) is gone: terminate with reason
    // child -> supervisor
    started,
    start_failed,
    exited,
    stopped,
  };
  Command(Kind k, CellPtr f = {}, ExitReason r = {}, uint64_t i = 0, uint64_t inc = 0)
      : kind(k), from(std::move(f)), reason(std::move(r)), id(i), incarnation(inc) {}

  Kind kind;
  CellPtr from;
  ExitReason reason;
  /// Operation sequence number, timer or monitor id, tick deadline.
  uint64_t id = 0;
  /// The incarnation a report or timer belongs to.
  uint64_t incarnation = 0;
};

/// "The reply for this pending ask is stored in it; run its continuation."
struct ReplyReady {
  ReplyRef ref;
  PendingAsk* node = nullptr;
};

const char* command_name(Command::Kind k);

/// Queues a command on a cell (high priority).
void send_command(CellControl* to, Command cmd);

class Cell final : public caf::event_based_actor {
 public:
  Cell(caf::actor_config& cfg, RuntimeImpl* rt, SpawnSpec spec, CellPtr parent, std::string path,
       uint64_t id, uint64_t start_seq, ReplyRef start_reply);
  ~Cell() override;

  caf::behavior make_behavior() override;
  void on_exit() override;
  const char* name() const override { return path_.c_str(); }

  // Thread-safe.
  uint64_t id() const { return id_; }
  const std::string& path() const { return path_; }
  TypeKey actor_type() const { return spec_.actor_type; }
  /// Proxies stand for an actor in another process.
  bool is_remote() const { return spec_.remote != nullptr; }
  const std::string& remote_address() const;
  uint64_t remote_id() const;
  const RemoteTarget& remote() const { return *spec_.remote; }
  /// A proxy whose process is unreachable (thread-safe; see RemoteTarget).
  bool remote_lost() const;
  void mark_remote_lost();
  /// Relays forward to whichever incarnation of an actor is current.
  Relay* relay() const { return spec_.relay.get(); }
  RuntimeImpl* runtime() const { return rt_; }
  CellControl* control() const;
  /// Reserves a mailbox slot for a user message; false when at the bound.
  /// Senders only touch enqueued_ and read dequeued_, which the cell
  /// publishes in batches: the bound may be exceeded by at most one batch
  /// (see dequeue_mask_), and the hot path has no per-message cache-line
  /// ping-pong between sender and receiver.
  bool admit() {
    int64_t in = enqueued_.fetch_add(1, std::memory_order_relaxed);
    if (in - dequeued_.load(std::memory_order_relaxed) < static_cast<int64_t>(bound_)) return true;
    enqueued_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  size_t bound() const { return bound_; }
  /// True once the cell terminated; final_reason() is valid then.
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  const ExitReason& final_reason() const { return final_reason_; }

  // Actor thread only: the ActorBase context API.
  uint32_t restart_count() const { return restarts_; }
  void request_stop() { stop_requested_ = true; }
  void checkpoint();
  void track(PendingAsk* node, std::chrono::milliseconds timeout);
  ReplyRef take_current_reply();
  TimerId set_timer(std::chrono::microseconds delay, std::function<void()> fn);
  void cancel_timer(TimerId id) { timers_.erase(id); }
  MonitorId add_monitor(const AnyRef& other, std::function<void(const Down&)> fn);
  void remove_monitor(MonitorId id) { monitors_.erase(id); }
  void add_link(const AnyRef& other);
  void remove_link(const AnyRef& other);
  /// Supervisors pause user messages while an operation is in progress.
  void set_accepting(bool accepting);
  /// Ends the current incarnation as a crash (used by supervisors that give up).
  void crash(ExitReason reason);
  /// The cell currently running a handler on this thread, if any.
  static Cell* current();

 private:
  enum class State : uint8_t { idle, starting, running, stopping, terminated };

  void on_envelope(Envelope& env);
  void deliver(Envelope& env);
  void drain_stash();
  void on_command(Command& cmd);
  void on_reply(ReplyReady& r);
  void on_ask_tick(uint64_t armed_for);

  /// Runs user code; an escaping exception crashes the incarnation. Returns
  /// false when it crashed.
  template <class F>
  bool guarded(F&& f, const char* what);

  void start_incarnation(uint64_t seq);
  void end_incarnation(ExitReason reason, std::function<void()> then);
  void finish_incarnation(const ExitReason& reason);
  /// The incarnation ended on its own (stop(), crash): report or terminate.
  void report_exit(ExitReason reason);
  void terminate(ExitReason reason);
  void take_snapshot();
  void arm_tick(std::chrono::steady_clock::time_point deadline);
  void clear_asks();
  void replay_deferred_commands();
  void reply_to_parent(Command::Kind kind, uint64_t seq, ExitReason reason = {});

  RuntimeImpl* rt_;
  SpawnSpec spec_;
  CellPtr parent_;
  std::string path_;
  uint64_t id_;
  size_t bound_;
  int64_t dequeue_mask_;         // publish dequeues every (mask + 1): 64 or 1
  int64_t dequeued_local_ = 0;   // actor thread only
  alignas(64) std::atomic<int64_t> enqueued_{0};
  alignas(64) std::atomic<int64_t> dequeued_{0};
  std::atomic<bool> dead_{false};
  ExitReason final_reason_;  // written before dead_ is set

  State state_ = State::idle;
  std::unique_ptr<ActorBase> instance_;
  uint64_t incarnation_ = 0;
  uint32_t restarts_ = 0;
  bool started_once_ = false;
  uint64_t first_start_seq_;
  ReplyRef start_reply_;  // completed by the first start (root supervisors)
  std::function<void(Status)> start_done_;  // completes the start in progress
  std::optional<std::string> snapshot_;
  uint32_t since_snapshot_ = 0;
  bool stop_requested_ = false;
  bool accepting_ = true;
  std::deque<Envelope> stash_;
  std::deque<Command> deferred_commands_;  // arrived while starting/stopping
  Envelope* current_ = nullptr;
  uint64_t unknown_messages_ = 0;

  // Incarnation-scoped: cleared when an incarnation ends.
  uint64_t next_id_ = 1;
  std::unordered_map<TimerId, std::function<void()>> timers_;
  std::unordered_map<MonitorId, std::function<void(const Down&)>> monitors_;
  std::vector<CellPtr> links_;
  PendingAsk* asks_head_ = nullptr;
  PendingAsk* asks_tail_ = nullptr;
  std::chrono::steady_clock::time_point armed_tick_ = std::chrono::steady_clock::time_point::max();
};

/// CAF's form of an exit reason, and back.
caf::error encode_reason(const ExitReason& r);
ExitReason decode_reason(const caf::error& e);

inline Cell* cell_of(CellControl* c) {
  return static_cast<Cell*>(reinterpret_cast<caf::actor_control_block*>(c)->get());
}
inline CellControl* control_of_actor(caf::abstract_actor* a) {
  return reinterpret_cast<CellControl*>(caf::actor_control_block::from(a));
}

}  // namespace troupe::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::Envelope)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::Command)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::ReplyReady)
