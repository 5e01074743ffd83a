// An actor on a cluster that survives the death of its process: troupe::init
// starts an embedded cluster (or joins TROUPE_ADDRESS), the counter runs in a
// worker process that the node agent starts from this program, and when that
// process is killed the cluster restarts the counter from its snapshot while
// the driver's ref follows it.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <troupe/init.h>
#include <troupe/troupe.h>

struct Add {
  int n = 0;
  TROUPE_MESSAGE_NAMED(Add, "example.Add", n);
};
struct WhereAreYou {
  TROUPE_MESSAGE_NAMED(WhereAreYou, "example.WhereAreYou");
};

class Counter : public troupe::Actor<Counter, Add, WhereAreYou> {
 public:
  explicit Counter(int start) : total_(start) {}
  int handle(const Add& m) {
    total_ += m.n;
    checkpoint();  // kept by the cluster's head before the answer goes out
    return total_;
  }
  int64_t handle(const WhereAreYou&) { return getpid(); }
  std::optional<std::string> snapshot() override { return std::to_string(total_); }
  void restore(std::string_view s) override { total_ = std::stoi(std::string(s)); }

 private:
  int total_;
};

int main() {
  auto session = troupe::init();  // in a worker process, this line serves actors and never returns
  if (!session) return std::fprintf(stderr, "%s\n", session.error().to_string().c_str()), 1;
  const troupe::ClusterClient& cluster = (*session)->cluster();
  auto counter = cluster.spawn<Counter>({.name = "counter", .max_restarts = -1, .max_task_retries = 1}, 40);
  if (!counter) return std::fprintf(stderr, "%s\n", counter.error().to_string().c_str()), 1;
  int64_t pid = counter->ask(WhereAreYou{}).get().value();
  std::printf("counter: %d, in worker process %lld (this driver is %d)\n", counter->ask(Add{2}).get().value(),
              static_cast<long long>(pid), getpid());
  ::kill(static_cast<pid_t>(pid), SIGKILL);
  auto after = counter->ask(Add{0}).get();  // waits for the restarted counter
  if (!after) return std::fprintf(stderr, "%s\n", after.error().to_string().c_str()), 1;
  std::printf("after kill -9 of its worker: counter: %d, in worker process %lld\n", *after,
              static_cast<long long>(counter->ask(WhereAreYou{}).get().value()));
  return *after == 42 ? 0 : 1;
}
