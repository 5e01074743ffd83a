#include "supervisor_actor.h"

#include <algorithm>
#include <set>
#include <string>

#include "cell.h"
#include "log.h"
#include "runtime_impl.h"

namespace troupe::detail {

namespace {
constexpr std::chrono::milliseconds kWorkerShutdown{5000};
}

Status validate_spec(const SupervisorSpec& spec) {
  if (spec.period.count() <= 0) {
    return Status(ErrorCode::invalid_argument, "supervisor spec: period must be positive (OTP default: 5000 ms)");
  }
  if (spec.strategy == Strategy::simple_one_for_one && spec.children.size() != 1) {
    return Status(ErrorCode::invalid_argument,
                  "supervisor spec: simple_one_for_one needs exactly one child spec (the template), got " +
                      std::to_string(spec.children.size()));
  }
  std::set<std::string> names;
  for (const ChildSpec& c : spec.children) {
    if (c.name.empty()) return Status(ErrorCode::invalid_argument, "supervisor spec: a child has an empty name");
    if (c.name.find('/') != std::string::npos) {
      return Status(ErrorCode::invalid_argument, "supervisor spec: child name '" + c.name + "' contains '/'");
    }
    if (!names.insert(c.name).second) {
      return Status(ErrorCode::already_exists, "supervisor spec: two children are named '" + c.name + "'");
    }
    if (!c.spawn.factory) {
      return Status(ErrorCode::invalid_argument,
                    "supervisor spec: child '" + c.name + "' has no factory; build it with worker<A>() or supervisor()");
    }
    if (c.shutdown.count() < 0 && c.shutdown != kDefaultShutdown) {
      return Status(ErrorCode::invalid_argument, "supervisor spec: child '" + c.name + "' has a negative shutdown");
    }
    if (c.backoff && (c.backoff->min.count() < 0 || c.backoff->max < c.backoff->min || c.backoff->random_factor < 0)) {
      return Status(ErrorCode::invalid_argument,
                    "supervisor spec: child '" + c.name + "' backoff needs 0 <= min <= max and random_factor >= 0");
    }
  }
  return {};
}

SpawnSpec supervisor_spawn_spec(std::string name, SupervisorSpec spec) {
  SpawnSpec s;
  s.name = std::move(name);
  s.factory = [spec = std::move(spec)]() -> std::unique_ptr<ActorBase> {
    return std::make_unique<SupervisorActor>(spec);
  };
  s.actor_type = type_key<SupervisorActor>();
  s.actor_type_name = &type_name<SupervisorActor>;
  s.is_supervisor = true;
  return s;
}

SupervisorActor::SupervisorActor(SupervisorSpec spec) : spec_(std::move(spec)) {}

SupervisorActor::~SupervisorActor() { *alive_ = false; }

Cell* SupervisorActor::cell() { return cell_; }

SupervisorActor::Child* SupervisorActor::find(uint64_t key) {
  for (auto& c : children_) {
    if (c.key == key) return &c;
  }
  return nullptr;
}

SupervisorActor::Child* SupervisorActor::find(CellControl* cell) {
  for (auto& c : children_) {
    if (c.cell.get() == cell) return &c;
  }
  return nullptr;
}

SupervisorActor::Child* SupervisorActor::find(const std::string& name) {
  for (auto& c : children_) {
    if (c.spec.name == name) return &c;
  }
  return nullptr;
}

std::chrono::milliseconds SupervisorActor::shutdown_of(const Child& c) const {
  if (c.spec.shutdown != kDefaultShutdown) return c.spec.shutdown;
  return c.spec.spawn.is_supervisor ? kInfinity : kWorkerShutdown;
}

CrashReport SupervisorActor::report_for(const Child& c, const ExitReason& reason) const {
  CrashReport r;
  r.actor = cell_->path() + "/" + c.spec.name;
  r.supervisor = cell_->path();
  r.reason = reason;
  r.restart_count = c.restarts;
  r.strategy = spec_.strategy;
  return r;
}

// -- operations ---------------------------------------------------------------

void SupervisorActor::run(Steps steps, Done done) {
  if (busy_) {
    TROUPE_LOG(critical, "event=invariant_broken where=SupervisorActor::run actor={} what=\"operation already running\"",
               cell_->path());
    std::abort();
  }
  busy_ = true;
  cell_->set_accepting(false);
  steps_ = std::move(steps);
  op_done_ = std::move(done);
  advance();
}

void SupervisorActor::advance() {
  using K = Step::Kind;
  while (!steps_.empty()) {
    Step step = steps_.front();
    steps_.pop_front();
    if (step.kind == K::wait) {
      uint64_t seq = next_seq_++;
      awaiting_ = {0, seq, K::wait};
      cell_->set_timer(step.delay, [this, seq] {
        if (awaiting_.kind != K::wait || awaiting_.seq != seq) return;
        awaiting_ = {};
        advance();
      });
      return;
    }
    Child* c = find(step.child);
    if (c == nullptr) continue;
    switch (step.kind) {
      case K::start: {
        if (c->running) continue;
        uint64_t seq = next_seq_++;
        awaiting_ = {c->key, seq, K::start};
        if (c->started_before) ++c->restarts;
        c->started_before = true;
        if (!c->cell) {
          c->spec.spawn.name = c->spec.name;
          c->cell = cell_->runtime()->spawn(c->spec.spawn, cell_, seq, {});
        } else {
          send_command(c->cell.get(), Command{Command::Kind::start, CellPtr(cell_->control()), {}, seq});
        }
        return;
      }
      case K::stop:
      case K::terminate: {
        if (!c->cell || (step.kind == K::stop && !c->running)) continue;
        uint64_t seq = next_seq_++;
        awaiting_ = {c->key, seq, step.kind};
        auto kind = step.kind == K::stop ? Command::Kind::stop : Command::Kind::terminate;
        send_command(c->cell.get(), Command{kind, CellPtr(cell_->control()), {}, seq});
        arm_shutdown_timer(*c, seq);
        return;
      }
      case K::remove:
        std::erase_if(children_, [&](const Child& x) { return x.key == step.child; });
        continue;
      case K::wait:
        break;
    }
  }
  finish_operation(Status());
}

void SupervisorActor::arm_shutdown_timer(const Child& c, uint64_t seq) {
  auto budget = shutdown_of(c);
  if (budget == kInfinity) return;
  cell_->set_timer(budget, [this, key = c.key, seq, budget] {
    if (awaiting_.child != key || awaiting_.seq != seq) return;
    Child* child = find(key);
    if (child) {
      // A handler cannot be preempted, so the stuck cell is abandoned (OTP
      // kills the process): it terminates as soon as its handler returns,
      // and a restart uses a fresh cell instead of queueing behind it.
      TROUPE_LOG(warn, "event=shutdown_timeout supervisor={} child={} budget_ms={} action=abandoned",
                 cell_->path(), child->spec.name, budget.count());
      send_command(child->cell.get(), Command{Command::Kind::terminate, CellPtr(cell_->control())});
      child->running = false;
      child->cell = CellPtr();
    }
    awaiting_ = {};
    advance();
  });
}

void SupervisorActor::finish_operation(Status status) {
  Done done = std::move(op_done_);
  op_done_ = nullptr;
  busy_ = false;
  awaiting_ = {};
  std::shared_ptr<bool> alive = alive_;
  if (done) done(std::move(status));  // may end this incarnation
  if (!*alive || stopping_) return;
  process_pending();
}

void SupervisorActor::process_pending() {
  while (!busy_ && !giving_up_ && !pending_exits_.empty()) {
    Command cmd = std::move(pending_exits_.front());
    pending_exits_.pop_front();
    on_exit_report(cmd);
  }
  if (!busy_ && !giving_up_) cell_->set_accepting(true);
}

// -- the child protocol ----------------------------------------------------------

void SupervisorActor::on_command_(Command& cmd) {
  using K = Command::Kind;
  if (cmd.kind == K::exited) {
    if (busy_ || giving_up_ || stopping_) {
      if (!stopping_) pending_exits_.push_back(cmd);
      return;
    }
    on_exit_report(cmd);
    return;
  }
  Child* c = find(cmd.from.get());
  if (c == nullptr || awaiting_.child != c->key || awaiting_.seq != cmd.id) return;  // stale
  switch (cmd.kind) {
    case K::started:
      c->running = true;
      c->incarnation = cmd.incarnation;
      c->started_at = std::chrono::steady_clock::now();
      awaiting_ = {};
      advance();
      return;
    case K::start_failed: {
      awaiting_ = {};
      c->running = false;
      Status failed(ErrorCode::start_failed,
                    "supervisor " + cell_->path() + ": child '" + c->spec.name + "' failed to start: " +
                        cmd.reason.message);
      if (!op_done_) {
        // A restart that fails is one more exit of that child: retry it,
        // counted against the restart intensity.
        c->running = true;
        c->incarnation = cmd.incarnation;
        pending_exits_.push_front(Command{K::exited, c->cell, cmd.reason, 0, cmd.incarnation});
      }
      steps_.clear();
      finish_operation(failed);
      return;
    }
    case K::stopped:
      c->running = false;
      if (awaiting_.kind == Step::Kind::terminate) c->cell = CellPtr();
      awaiting_ = {};
      advance();
      return;
    default:
      return;
  }
}

void SupervisorActor::on_exit_report(const Command& cmd) {
  Child* c = find(cmd.from.get());
  if (c == nullptr || !c->running || c->incarnation != cmd.incarnation) return;  // stale
  c->running = false;
  const ExitReason& reason = cmd.reason;
  CrashReport report = report_for(*c, reason);
  bool restart = c->spec.restart == Restart::permanent ||
                 (c->spec.restart == Restart::transient && reason.abnormal());
  if (!restart) {
    bool remove = c->spec.restart == Restart::temporary || spec_.strategy == Strategy::simple_one_for_one;
    report.decision = remove ? "remove" : "ignore";
    if (reason.abnormal()) cell_->runtime()->report_crash(report);
    Steps steps{{Step::Kind::terminate, c->key}};
    if (remove) steps.push_back({Step::Kind::remove, c->key});
    run(std::move(steps), nullptr);
    return;
  }

  auto now = std::chrono::steady_clock::now();
  restart_times_.push_back(now);
  while (!restart_times_.empty() && restart_times_.front() <= now - spec_.period) restart_times_.pop_front();
  if (restart_times_.size() > spec_.intensity) {
    report.decision = "escalate";
    cell_->runtime()->report_crash(report);
    give_up(ExitReason::failure("reached max restart intensity (" + std::to_string(spec_.intensity) + " in " +
                                std::to_string(spec_.period.count()) + " ms); last exit: " + c->spec.name +
                                " " + reason.to_string()));
    return;
  }

  Steps steps;
  std::vector<uint64_t> to_start;
  auto stop_sibling = [&](Child& j) {
    if (j.spec.restart == Restart::temporary) {
      steps.push_back({Step::Kind::terminate, j.key});
      steps.push_back({Step::Kind::remove, j.key});
    } else if (j.running) {
      steps.push_back({Step::Kind::stop, j.key});
    }
  };
  size_t index = static_cast<size_t>(c - children_.data());
  switch (spec_.strategy) {
    case Strategy::one_for_one:
    case Strategy::simple_one_for_one:
      to_start.push_back(c->key);
      break;
    case Strategy::one_for_all:
    case Strategy::rest_for_one: {
      size_t first = spec_.strategy == Strategy::one_for_all ? 0 : index;
      for (size_t j = children_.size(); j-- > first;) {
        if (j != index) stop_sibling(children_[j]);
      }
      for (size_t j = first; j < children_.size(); ++j) {
        if (j == index || children_[j].spec.restart != Restart::temporary) to_start.push_back(children_[j].key);
      }
      break;
    }
  }
  report.decision = "restart";
  if (c->spec.backoff) {
    const Backoff& b = *c->spec.backoff;
    if (c->started_at != std::chrono::steady_clock::time_point{} && now - c->started_at >= b.reset_after) {
      c->backoff_attempt = 0;
    }
    double unit = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    steps.push_back({Step::Kind::wait, 0, b.delay(c->backoff_attempt++, unit)});
    report.decision = "restart_after_backoff";
  }
  for (uint64_t k : to_start) steps.push_back({Step::Kind::start, k});
  cell_->runtime()->report_crash(report);
  run(std::move(steps), nullptr);
}

void SupervisorActor::give_up(ExitReason why) {
  giving_up_ = true;
  cell_->set_accepting(false);
  // Crash from a fresh timer callback, not from inside this call chain: the
  // crash ends this incarnation, which destroys this object.
  cell_->set_timer(std::chrono::microseconds(0), [this, why] { cell_->crash(why); });
}

// -- start and stop of the supervisor itself ----------------------------------

void SupervisorActor::start_async_(std::function<void(Status)> done) {
  rng_.seed(cell_->runtime()->config().seed ? cell_->runtime()->config().seed ^ cell_->id()
                                            : std::random_device{}());
  if (Status s = validate_spec(spec_); !s.ok()) {
    done(s);
    return;
  }
  Steps steps;
  if (spec_.strategy != Strategy::simple_one_for_one) {
    for (const ChildSpec& spec : spec_.children) {
      Child c;
      c.key = next_key_++;
      c.spec = spec;
      children_.push_back(std::move(c));
      steps.push_back({Step::Kind::start, children_.back().key});
    }
  }
  run(std::move(steps), [this, done](Status s) {
    if (s.ok()) {
      done(s);
      return;
    }
    // OTP: a child that fails to start fails the supervisor's start; the
    // children already started are stopped, newest first.
    Steps undo;
    for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
      if (it->cell) undo.push_back({Step::Kind::terminate, it->key});
    }
    run(std::move(undo), [done, s](Status) { done(s); });
  });
}

void SupervisorActor::stop_async_(const ExitReason& reason, std::function<void()> done) {
  TROUPE_LOG(debug, "event=supervisor_stopping actor={} reason=\"{}\"", cell_->path(), reason.to_string());
  stopping_ = true;
  pending_exits_.clear();
  if (busy_) {
    Done aborted = std::move(op_done_);
    op_done_ = nullptr;
    steps_.clear();
    busy_ = false;
    awaiting_ = {};
    if (aborted) aborted(Status(ErrorCode::shutting_down, "supervisor " + cell_->path() + " is stopping"));
  }
  Steps steps;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    if (it->cell) steps.push_back({Step::Kind::terminate, it->key});
  }
  run(std::move(steps), [done](Status) { done(); });
}

// -- requests -------------------------------------------------------------------

std::vector<ChildInfo> SupervisorActor::handle(const WhichChildren&) {
  std::vector<ChildInfo> out;
  out.reserve(children_.size());
  for (const Child& c : children_) {
    ChildInfo info;
    info.name = c.spec.name;
    if (c.cell) info.ref = AnyRef(c.cell);
    info.running = c.running;
    info.is_supervisor = c.spec.spawn.is_supervisor;
    info.restarts = c.restarts;
    info.actor_type = c.spec.spawn.actor_type_name ? c.spec.spawn.actor_type_name() : "";
    out.push_back(std::move(info));
  }
  return out;
}

Result<AnyRef> SupervisorActor::handle(const GetChild& m) {
  Child* c = find(m.name);
  if (c == nullptr) return error(ErrorCode::not_found, "supervisor " + cell_->path() + ": no child named '" + m.name + "'");
  if (!c->cell) {
    return error(ErrorCode::not_found, "supervisor " + cell_->path() + ": child '" + m.name +
                                           "' is terminated; restart_child() starts it again");
  }
  return AnyRef(c->cell);
}

Deferred<AnyRef> SupervisorActor::handle(StartChild&& m) {
  Deferred<AnyRef> reply = defer<AnyRef>();
  ChildSpec spec = std::move(m.spec);
  if (spec_.strategy == Strategy::simple_one_for_one) {
    const ChildSpec& tmpl = spec_.children.front();
    if (spec.spawn.actor_type != tmpl.spawn.actor_type) {
      reply.fail(Status(ErrorCode::type_mismatch, "start_child: supervisor " + cell_->path() + " starts " +
                                                      tmpl.spawn.actor_type_name() + " children, not " +
                                                      (spec.spawn.actor_type_name ? spec.spawn.actor_type_name() : "?")));
      return reply;
    }
    ChildSpec c = tmpl;
    c.spawn.factory = std::move(spec.spawn.factory);
    c.name = tmpl.name + "-" + std::to_string(++dynamic_count_);
    spec = std::move(c);
  } else {
    SupervisorSpec one{Strategy::one_for_one, 1, std::chrono::milliseconds(1), {spec}};
    if (Status s = validate_spec(one); !s.ok()) {
      reply.fail(s);
      return reply;
    }
    if (find(spec.name) != nullptr) {
      reply.fail(Status(ErrorCode::already_exists,
                        "start_child: supervisor " + cell_->path() + " already has a child named '" + spec.name + "'"));
      return reply;
    }
  }
  Child c;
  c.key = next_key_++;
  c.spec = std::move(spec);
  children_.push_back(std::move(c));
  uint64_t key = children_.back().key;
  run({{Step::Kind::start, key}}, [this, reply, key](Status s) mutable {
    Child* child = find(key);
    if (s.ok() && child && child->cell) {
      reply.complete(AnyRef(child->cell));
      return;
    }
    // OTP: a child that fails in start_child is not kept.
    if (child && child->cell) send_command(child->cell.get(), Command{Command::Kind::terminate, CellPtr(cell_->control())});
    std::erase_if(children_, [key](const Child& x) { return x.key == key; });
    reply.fail(s.ok() ? Status(ErrorCode::start_failed, "start_child: the child stopped while starting") : s);
  });
  return reply;
}

Deferred<void> SupervisorActor::handle(const TerminateChild& m) {
  Deferred<void> reply = defer<void>();
  Child* c = find(m.name);
  if (c == nullptr) {
    reply.fail(Status(ErrorCode::not_found, "terminate_child: supervisor " + cell_->path() + " has no child '" + m.name + "'"));
    return reply;
  }
  Steps steps{{Step::Kind::terminate, c->key}};
  if (spec_.strategy == Strategy::simple_one_for_one) steps.push_back({Step::Kind::remove, c->key});
  run(std::move(steps), [reply](Status s) mutable {
    if (s.ok()) {
      reply.complete();
    } else {
      reply.fail(s);
    }
  });
  return reply;
}

Deferred<AnyRef> SupervisorActor::handle(const RestartChild& m) {
  Deferred<AnyRef> reply = defer<AnyRef>();
  Child* c = find(m.name);
  if (c == nullptr) {
    reply.fail(Status(ErrorCode::not_found, "restart_child: supervisor " + cell_->path() + " has no child '" + m.name + "'"));
    return reply;
  }
  if (c->running) {
    reply.fail(Status(ErrorCode::already_exists, "restart_child: child '" + m.name + "' is running"));
    return reply;
  }
  uint64_t key = c->key;
  run({{Step::Kind::start, key}}, [this, reply, key](Status s) mutable {
    Child* child = find(key);
    if (s.ok() && child && child->cell) {
      reply.complete(AnyRef(child->cell));
    } else {
      reply.fail(s.ok() ? Status(ErrorCode::start_failed, "restart_child: the child stopped while starting") : s);
    }
  });
  return reply;
}

Result<void> SupervisorActor::handle(const DeleteChild& m) {
  Child* c = find(m.name);
  if (c == nullptr) return error(ErrorCode::not_found, "delete_child: supervisor " + cell_->path() + " has no child '" + m.name + "'");
  if (c->running || c->cell) {
    return error(ErrorCode::invalid_argument, "delete_child: child '" + m.name + "' is not terminated; terminate_child() it first");
  }
  std::erase_if(children_, [&](const Child& x) { return x.spec.name == m.name; });
  return {};
}

}  // namespace troupe::detail

namespace troupe {

ChildSpec supervisor(std::string name, SupervisorSpec spec) {
  ChildSpec c;
  c.spawn = detail::supervisor_spawn_spec(name, std::move(spec));
  c.name = std::move(name);
  return c;
}

}  // namespace troupe
