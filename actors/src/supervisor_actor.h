// The supervisor is an ordinary troupe actor: its public messages (which
// children, start/terminate/restart/delete child) are typed handlers, and the
// child protocol (started, exited, stopped) arrives as runtime commands.
// Work that spans several children (a one_for_all restart, a shutdown) is a
// queue of steps run one at a time; user requests wait while one runs.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "troupe/actor.h"
#include "troupe/supervisor.h"

namespace troupe::detail {

class Cell;
struct Command;

class SupervisorActor final : public Actor<SupervisorActor, WhichChildren, GetChild, StartChild, TerminateChild,
                                           RestartChild, DeleteChild> {
 public:
  explicit SupervisorActor(SupervisorSpec spec);
  ~SupervisorActor() override;

  std::vector<ChildInfo> handle(const WhichChildren&);
  Result<AnyRef> handle(const GetChild& m);
  Deferred<AnyRef> handle(StartChild&& m);
  Deferred<void> handle(const TerminateChild& m);
  Deferred<AnyRef> handle(const RestartChild& m);
  Result<void> handle(const DeleteChild& m);

 private:
  struct Child {
    uint64_t key = 0;
    ChildSpec spec;
    CellPtr cell;
    bool running = false;
    bool started_before = false;
    uint64_t incarnation = 0;
    uint32_t restarts = 0;
    uint32_t backoff_attempt = 0;
    std::chrono::steady_clock::time_point started_at{};
  };
  struct Step {
    enum class Kind : uint8_t { start, stop, terminate, wait, remove };
    Kind kind;
    uint64_t child = 0;
    std::chrono::microseconds delay{0};
  };
  using Steps = std::deque<Step>;
  using Done = std::function<void(Status)>;

  void start_async_(std::function<void(Status)> done) override;
  void stop_async_(const ExitReason& reason, std::function<void()> done) override;
  void on_command_(Command& cmd) override;

  /// Runs `steps` in order, then calls `done`. REQUIRES: not busy.
  void run(Steps steps, Done done);
  /// Executes steps until one has to wait. May end the operation, which may
  /// destroy this object: callers return right after.
  void advance();
  void finish_operation(Status status);
  void process_pending();
  void on_exit_report(const Command& cmd);
  void give_up(ExitReason why);
  void arm_shutdown_timer(const Child& c, uint64_t seq);
  std::chrono::milliseconds shutdown_of(const Child& c) const;
  Child* find(uint64_t key);
  Child* find(CellControl* cell);
  Child* find(const std::string& name);
  Cell* cell();
  CrashReport report_for(const Child& c, const ExitReason& reason) const;

  SupervisorSpec spec_;
  std::vector<Child> children_;
  uint64_t next_key_ = 1;
  uint64_t next_seq_ = 1;
  uint64_t dynamic_count_ = 0;

  Steps steps_;
  Done op_done_;
  bool busy_ = false;
  bool stopping_ = false;
  bool giving_up_ = false;
  struct Awaiting {
    uint64_t child = 0;
    uint64_t seq = 0;
    Step::Kind kind = Step::Kind::start;
  } awaiting_;
  std::deque<Command> pending_exits_;
  std::deque<std::chrono::steady_clock::time_point> restart_times_;
  std::mt19937_64 rng_;
  /// Set to false on destruction: code that calls back into the cell (which
  /// may destroy this incarnation) checks it before touching members again.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace troupe::detail
