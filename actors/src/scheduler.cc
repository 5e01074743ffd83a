#include "scheduler.h"

#include <thread>

#include "transport.h"

namespace troupe::detail {

namespace {
thread_local caf::execution_unit* tl_polling_unit = nullptr;
}  // namespace

caf::execution_unit* polling_unit() { return tl_polling_unit; }

void NetworkPoller::attach(transport::Transport* t) { transport_.store(t); }

void NetworkPoller::detach() {
  transport_.store(nullptr);
  // A spinner that read the pointer before it was cleared may still be
  // inside; spins are short (RuntimeConfig::network_spin).
  while (taken_.load()) std::this_thread::yield();
}

transport::Transport* NetworkPoller::enter() {
  if (transport_.load(std::memory_order_relaxed) == nullptr || taken_.load(std::memory_order_relaxed)) return nullptr;
  if (taken_.exchange(true)) return nullptr;
  transport::Transport* t = transport_.load();
  if (t == nullptr) taken_.store(false);
  return t;
}

void NetworkPoller::leave() { taken_.store(false); }

NetworkSpin::NetworkSpin(caf::execution_unit* self, NetworkPoller& poller, std::chrono::microseconds spin)
    : poller_(poller), transport_(poller.enter()), spin_(spin) {
  if (transport_ == nullptr) return;
  tl_polling_unit = self;
  transport_->spin(true, false);
  deadline_ = std::chrono::steady_clock::now() + spin_;
}

void NetworkSpin::finish(bool idle) {
  if (transport_ == nullptr) return;
  transport_->spin(false, idle);
  tl_polling_unit = nullptr;
  transport_ = nullptr;
  poller_.leave();
}

bool NetworkSpin::step() {
  if (transport_->poll()) {
    deadline_ = std::chrono::steady_clock::now() + spin_;
    return true;
  }
  // Reading the clock costs more than a poll of an idle transport.
  if ((++steps_ & 7) != 0) return true;
  return std::chrono::steady_clock::now() < deadline_ && poller_.attached(transport_);
}

}  // namespace troupe::detail
