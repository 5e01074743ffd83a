// The answer to an ask made outside any actor (from main() or a test thread).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>

#include "troupe/detail/message.h"
#include "troupe/status.h"

namespace troupe {

namespace detail {

/// Blocks until `*word != expected` or the deadline passes (futex on Linux).
/// Returns false on timeout.
bool wait_word(std::atomic<uint32_t>* word, uint32_t expected,
               std::chrono::steady_clock::time_point deadline);
void wake_word(std::atomic<uint32_t>* word);

/// Shared state of a Future: the reply slot the envelope completes.
template <class R>
class FutureState final : public ReplyTo<R> {
 public:
  static constexpr uint32_t kPending = 0, kReady = 1, kWaiting = 2;

  void complete(Result<R>&& r) override {
    value_.emplace(std::move(r));
    if (state_.exchange(kReady, std::memory_order_acq_rel) == kWaiting) wake_word(&state_);
  }

  bool ready() const { return state_.load(std::memory_order_acquire) == kReady; }

  /// Waits until ready or `deadline`; true when ready.
  bool wait(std::chrono::steady_clock::time_point deadline) {
    // A short spin catches replies that arrive within a few microseconds
    // without paying for a futex sleep and wake-up.
    for (int i = 0; i < 2000; ++i) {
      if (ready()) return true;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    for (;;) {
      uint32_t s = state_.load(std::memory_order_acquire);
      if (s == kReady) return true;
      if (s == kPending &&
          !state_.compare_exchange_strong(s, kWaiting, std::memory_order_acq_rel)) {
        continue;
      }
      if (!wait_word(&state_, kWaiting, deadline)) return ready();
    }
  }

  /// REQUIRES: ready().
  Result<R> take() { return std::move(*value_); }

 private:
  std::atomic<uint32_t> state_{kPending};
  std::optional<Result<R>> value_;
};

}  // namespace detail

/// The eventual reply to an ask made from outside an actor. Move-only.
/// Inside an actor handler, use `ask(ref, msg).then(...)` instead: blocking a
/// scheduler thread there is refused with an error.
template <class R>
class Future {
 public:
  Future() = default;

  /// Blocks until the reply arrives or the ask's deadline passes, then
  /// returns the reply or the error (timeout, actor_dead, handler_failed, ...).
  /// Can be called once.
  Result<R> get() {
    if (!state_) {
      return error(ErrorCode::invalid_argument, "future: get() on an empty or consumed future");
    }
    if (!ready() && detail::in_actor_context()) {
      return error(ErrorCode::invalid_argument,
                   "future: get() would block a scheduler thread inside an actor handler; use "
                   "ask(ref, msg).then(...) in actors");
    }
    if (!state().wait(deadline_)) {
      state_.reset();
      return error(ErrorCode::timeout,
                   "ask: no reply within " + std::to_string(timeout_ms_) +
                       " ms; the actor may be overloaded or stuck; raise the timeout or check it");
    }
    Result<R> r = state().take();
    state_.reset();
    return r;
  }

  /// True when get() would return without waiting.
  bool ready() const { return state_ && const_cast<Future*>(this)->state().ready(); }
  /// True when this future holds an ask (not default-built or consumed).
  bool valid() const { return static_cast<bool>(state_); }

  /// Internal: wraps an already-made state.
  Future(detail::ReplyRef state, std::chrono::milliseconds timeout)
      : state_(std::move(state)),
        deadline_(std::chrono::steady_clock::now() + timeout),
        timeout_ms_(timeout.count()) {}

 private:
  detail::FutureState<R>& state() { return *static_cast<detail::FutureState<R>*>(state_.get()); }

  detail::ReplyRef state_;
  std::chrono::steady_clock::time_point deadline_{};
  int64_t timeout_ms_ = 0;
};

}  // namespace troupe
