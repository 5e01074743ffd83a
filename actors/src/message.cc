#include <cxxabi.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>

#include "troupe/detail/message.h"
#include "troupe/future.h"

namespace troupe::detail {

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(mangled);
}

const std::string& MessageBox::type_name() const {
  static const std::string none = "<empty>";
  return ops_ ? ops_->name() : none;
}

Envelope::Envelope(const Envelope&) {
  std::fprintf(stderr, "troupe: invariant broken: an Envelope was copied (it owns a reply that completes once)\n");
  std::abort();
}

Envelope::~Envelope() {
  if (reply) {
    ReplyRef r = std::move(reply);
    r->fail(Status(ErrorCode::actor_dead, "ask: the actor stopped before it handled the message"));
  }
}

bool wait_word(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    if (word->load(std::memory_order_acquire) != expected) return true;
    auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return false;
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    // A relative timeout; EINTR and spurious wake-ups loop and re-check.
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
  }
}

void wake_word(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace troupe::detail
