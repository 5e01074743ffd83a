// troupe's scheduler: CAF's work-stealing scheduler, except that a thread
// with nothing to do first polls the network for a while before it falls
// back to CAF's idle phases. A frame received that way is dispatched on the
// polling thread itself, with no thread hand-off: over shared memory that
// turns a cross-process round trip from tens of microseconds (two sleeping
// threads woken per hop) into a few. See transports/src/progress_gate.h for
// how the transport's own thread steps aside meanwhile.
#pragma once

#include <atomic>
#include <chrono>

#include <caf/policy/work_stealing.hpp>
#include <caf/scheduler/coordinator.hpp>
#include <caf/scheduler/worker.hpp>

namespace troupe::transport {
class Transport;
}

namespace troupe::detail {

/// The transport idle scheduler threads poll: attached while a node runs.
/// At most one thread spins on it at a time, so that a process never has
/// more than one spinning thread beside its busy ones.
class NetworkPoller {
 public:
  /// Starts polling `t`.
  void attach(transport::Transport* t);
  /// Stops; returns once no thread is inside the transport any more.
  void detach();
  /// Claims the spinner's place: the transport, or null when none is
  /// attached or another thread spins.
  transport::Transport* enter();
  /// Gives the place back (after a non-null enter()).
  void leave();
  /// Whether `t` is still the attached transport.
  bool attached(const transport::Transport* t) const { return transport_.load(std::memory_order_relaxed) == t; }

 private:
  std::atomic<transport::Transport*> transport_{nullptr};
  std::atomic<bool> taken_{false};
};

/// The scheduler thread that is polling the network on this thread, if any:
/// actors made runnable by a frame it receives are queued on it (see
/// current_context() in cell.cc).
caf::execution_unit* polling_unit();

struct PollingPolicy : caf::policy::work_stealing {
  template <class Worker>
  caf::resumable* dequeue(Worker* self);
};

/// The coordinator CAF runs in place of its own work-stealing one.
class Scheduler final : public caf::scheduler::coordinator<PollingPolicy> {
 public:
  Scheduler(caf::actor_system& sys, NetworkPoller* poller, std::chrono::microseconds spin)
      : coordinator(sys), poller_(poller), spin_(spin) {}
  NetworkPoller& poller() { return *poller_; }
  std::chrono::microseconds spin() const { return spin_; }

 private:
  NetworkPoller* poller_;
  std::chrono::microseconds spin_;
};

/// One idle thread's turn at polling the network (see PollingPolicy).
class NetworkSpin {
 public:
  /// Claims the spinner's place for `self`; active() says whether it got it.
  NetworkSpin(caf::execution_unit* self, NetworkPoller& poller, std::chrono::microseconds spin);
  /// Gives the place back; `idle` when the spin ran out with nothing to do.
  void finish(bool idle);
  ~NetworkSpin() { finish(false); }
  bool active() const { return transport_ != nullptr; }
  /// Polls once; false once `spin` has passed since the last thing that
  /// happened.
  bool step();

 private:
  NetworkPoller& poller_;
  transport::Transport* transport_;
  std::chrono::microseconds spin_;
  std::chrono::steady_clock::time_point deadline_;
  unsigned steps_ = 0;
};

template <class Worker>
caf::resumable* PollingPolicy::dequeue(Worker* self) {
  auto* sched = static_cast<Scheduler*>(self->parent());
  if (sched->spin().count() > 0) {
    NetworkSpin spin(self, sched->poller(), sched->spin());
    if (spin.active()) {
      auto& strategy = d(self).strategies[0];
      caf::resumable* job = nullptr;
      for (size_t i = 0; job == nullptr; ++i) {
        job = d(self).queue.take_head();
        if (job == nullptr && i % strategy.steal_interval == 0) job = try_steal(self);
        if (job == nullptr && !spin.step()) break;
      }
      spin.finish(job == nullptr);
      if (job != nullptr) return job;
    }
  }
  return work_stealing::dequeue(self);
}

}  // namespace troupe::detail
