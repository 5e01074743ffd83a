// A custom actor program: a supervised counter that survives a crash.
#include <cstdio>
#include <stdexcept>
#include <string>

#include <troupe/troupe.h>

struct Add { int n; };
struct Get {};
struct Boom {};

class Counter : public troupe::Actor<Counter, Add, Get, Boom> {
 public:
  void handle(const Add& m) { total_ += m.n; checkpoint(); }
  int handle(const Get&) { return total_; }
  void handle(const Boom&) { throw std::runtime_error("boom"); }
  std::optional<std::string> snapshot() override { return std::to_string(total_); }
  void restore(std::string_view s) override { total_ = std::stoi(std::string(s)); }
 private:
  int total_ = 0;
};

int main() {
  troupe::Runtime rt;
  auto tree = rt.start_supervisor("app", {.children = {troupe::worker<Counter>("counter")}});
  if (!tree) return std::fprintf(stderr, "%s\n", tree.error().to_string().c_str()), 1;
  auto counter = tree->child<Counter>("counter").value();
  counter.tell(Add{40});
  counter.tell(Add{2});
  counter.tell(Boom{});  // crashes; the supervisor restarts it from its last checkpoint
  auto total = counter.ask(Get{}).get();
  std::printf("total after a crash and a restart: %d\n", total.value_or(-1));
  return total == 42 ? 0 : 1;
}
