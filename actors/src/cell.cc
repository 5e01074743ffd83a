#include "cell.h"

#include <algorithm>
#include <cassert>
#include <exception>
#include <string>

#include "log.h"
#include "remote/node.h"
#include "troupe/detail/relay.h"
#include "runtime_impl.h"
#include "scheduler.h"

namespace troupe::detail {

namespace {

thread_local Cell* tl_current = nullptr;

/// Marks the calling thread as running `cell` for the scope.
class ScopedCurrent {
 public:
  explicit ScopedCurrent(Cell* c) : prev_(tl_current) { tl_current = c; }
  ~ScopedCurrent() { tl_current = prev_; }

 private:
  Cell* prev_;
};

/// What fail() throws; caught by the cell, never by user code in practice.
struct FailSignal {
  std::string reason;
};

/// Removes and returns the callback stored under `id`, if any.
template <class Map>
std::optional<typename Map::mapped_type> take(Map& map, uint64_t id) {
  auto it = map.find(id);
  if (it == map.end()) return std::nullopt;
  auto fn = std::move(it->second);
  map.erase(it);
  return fn;
}

bool contains(const std::vector<CellPtr>& v, CellControl* c) {
  return std::any_of(v.begin(), v.end(), [c](const CellPtr& p) { return p.get() == c; });
}

}  // namespace

Cell* Cell::current() { return tl_current; }

bool in_actor_context() { return tl_current != nullptr; }

const char* command_name(Command::Kind k) {
  switch (k) {
    case Command::Kind::start: return "start";
    case Command::Kind::stop: return "stop";
    case Command::Kind::terminate: return "terminate";
    case Command::Kind::exit: return "exit";
    case Command::Kind::parent_down: return "parent_down";
    case Command::Kind::link_add: return "link_add";
    case Command::Kind::link_remove: return "link_remove";
    case Command::Kind::link_exit: return "link_exit";
    case Command::Kind::down: return "down";
    case Command::Kind::timer: return "timer";
    case Command::Kind::ask_tick: return "ask_tick";
    case Command::Kind::remote_down: return "remote_down";
    case Command::Kind::started: return "started";
    case Command::Kind::start_failed: return "start_failed";
    case Command::Kind::exited: return "exited";
    case Command::Kind::stopped: return "stopped";
  }
  return "?";
}

namespace {
// Inside a handler: its thread; inside a network poll on an idle scheduler
// thread: that thread (no hand-off); elsewhere: CAF picks one.
caf::execution_unit* current_context() { return tl_current ? tl_current->context() : polling_unit(); }
}  // namespace

void send_command(CellControl* to, Command cmd) {
  if (to == nullptr) return;
  auto* ctrl = reinterpret_cast<caf::actor_control_block*>(to);
  ctrl->enqueue(caf::make_mailbox_element(nullptr, caf::make_message_id(caf::message_priority::high), {},
                                          std::move(cmd)),
                current_context());
}

namespace {
Status stopped(Cell* cell) {
  return Status(ErrorCode::actor_dead,
                "send: actor " + cell->path() + " has stopped (" + cell->final_reason().to_string() + ")");
}
}  // namespace

Status send(CellControl* to, Envelope&& env) {
  Cell* cell = cell_of(to);
  if (cell->is_remote() && !cell->dead()) {
    if (cell->remote_lost()) {
      Status s(ErrorCode::actor_dead, "send: actor " + cell->path() + " is gone: the connection to its process was lost");
      if (env.reply) {
        ReplyRef r = std::move(env.reply);
        r->fail(s);
      }
      return s;
    }
    if (auto node = cell->remote().node.lock()) return node->send_envelope(cell, env);
  }
  if (Relay* relay = cell->relay(); relay != nullptr && !cell->dead()) return relay->send(std::move(env));
  if (cell->dead()) {
    Status s = stopped(cell);
    if (env.reply) {
      ReplyRef r = std::move(env.reply);
      r->fail(s);
    }
    return s;
  }
  if (!cell->admit()) {
    Status s(ErrorCode::mailbox_full, "send: mailbox of " + cell->path() + " is full (" +
                                          std::to_string(cell->bound()) +
                                          " messages); slow down the sender or raise mailbox_bound");
    if (env.reply) {
      ReplyRef r = std::move(env.reply);
      r->fail(s);
    }
    return s;
  }
  cell->enqueue(caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, std::move(env)),
                current_context());
  return {};
}

Status send_unless_lost(CellControl* to, Envelope& env, bool& kept) {
  kept = false;
  Cell* cell = cell_of(to);
  if (cell->dead()) {
    kept = true;
    return stopped(cell);
  }
  if (cell->is_remote()) {
    if (cell->remote_lost()) {
      kept = true;
      return Status(ErrorCode::peer_lost, "send: the connection to " + cell->path() + "'s process was lost");
    }
    if (auto node = cell->remote().node.lock()) return node->send_envelope(cell, env, &kept);
  }
  return send(to, std::move(env));
}

void post_reply(CellControl* asker, PendingAsk* node) {
  ReplyReady ready{ReplyRef(node->reply_base()), node};
  node->reply_base()->add_ref();  // the ReplyRef above adopted one reference
  auto* ctrl = reinterpret_cast<caf::actor_control_block*>(asker);
  ctrl->enqueue(caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, std::move(ready)),
                current_context());
}

caf::error encode_reason(const ExitReason& r) {
  return caf::error(static_cast<uint8_t>(static_cast<uint8_t>(r.kind) + 1), caf::atom("troupe"),
                    caf::make_message(r.message));
}

ExitReason decode_reason(const caf::error& e) {
  if (!e) return ExitReason::normal_exit();
  if (e.category() == caf::atom("troupe")) {
    ExitReason r;
    r.kind = static_cast<ExitReason::Kind>(e.code() - 1);
    if (e.context().match_elements<std::string>()) r.message = e.context().get_as<std::string>(0);
    return r;
  }
  if (e == caf::exit_reason::user_shutdown) return ExitReason::shutdown("runtime shutdown");
  if (e == caf::exit_reason::kill) return ExitReason::killed("killed");
  return ExitReason::failure(caf::to_string(e));
}

Cell::Cell(caf::actor_config& cfg, RuntimeImpl* rt, SpawnSpec spec, CellPtr parent, std::string path, uint64_t id,
           uint64_t start_seq, ReplyRef start_reply)
    : caf::event_based_actor(cfg),
      rt_(rt),
      spec_(std::move(spec)),
      parent_(std::move(parent)),
      path_(std::move(path)),
      id_(id),
      bound_(spec_.mailbox_bound ? spec_.mailbox_bound : rt->config().default_mailbox_bound),
      // Large bounds tolerate a little slack; small ones are exact.
      dequeue_mask_(bound_ >= 4096 ? 63 : 0),
      first_start_seq_(start_seq),
      start_reply_(std::move(start_reply)),
      snapshot_(spec_.snapshot) {
  if (spec_.relay) spec_.relay->adopt(id_);
}

Cell::~Cell() = default;

CellControl* Cell::control() const { return control_of_actor(const_cast<Cell*>(this)); }

const std::string& Cell::remote_address() const { return spec_.remote->address; }
bool Cell::remote_lost() const { return spec_.remote && spec_.remote->lost.load(std::memory_order_acquire); }
void Cell::mark_remote_lost() {
  if (spec_.remote) spec_.remote->lost.store(true, std::memory_order_release);
}
uint64_t Cell::remote_id() const { return spec_.remote->id; }

caf::behavior Cell::make_behavior() {
  ScopedCurrent scope(this);
  if (parent_) {
    // A child never outlives its supervisor's cell, whatever ended it.
    caf::weak_actor_ptr self{caf::actor_control_block::from(this)};
    cell_of(parent_.get())->attach_functor([self](const caf::error&) {
      if (auto strong = self.lock()) {
        send_command(reinterpret_cast<CellControl*>(strong.get()), Command{Command::Kind::parent_down});
      }
    });
  }
  start_incarnation(first_start_seq_);
  return {
      [this](Envelope& env) {
        ScopedCurrent scope(this);
        on_envelope(env);
      },
      [this](Command& cmd) {
        ScopedCurrent scope(this);
        on_command(cmd);
      },
      [this](ReplyReady& r) {
        ScopedCurrent scope(this);
        on_reply(r);
      },
  };
}

void Cell::on_exit() {
  rt_->on_cell_exit(this);
  // Break reference cycles (parent <-> child, links) so memory is freed.
  parent_ = CellPtr();
  links_.clear();
  stash_.clear();
  deferred_commands_.clear();
  timers_.clear();
  monitors_.clear();
}

template <class F>
bool Cell::guarded(F&& f, const char* what) {
  std::string reason;
  try {
    f();
    return true;
  } catch (const FailSignal& s) {
    reason = s.reason;
  } catch (const std::exception& e) {
    reason = std::string(what) + " threw: " + e.what();
  } catch (...) {
    reason = std::string(what) + " threw a non-std::exception";
  }
  if (current_ && current_->reply) {
    ReplyRef r = std::move(current_->reply);
    r->fail(Status(ErrorCode::handler_failed,
                   "actor " + path_ + ": handler for " + current_->box.type_name() + " failed: " + reason));
  }
  current_ = nullptr;
  crash(ExitReason::failure(std::move(reason)));
  return false;
}

void Cell::on_envelope(Envelope& env) {
  if (state_ != State::running || !accepting_ || !stash_.empty()) {
    stash_.push_back(std::move(env));
    return;
  }
  deliver(env);
}

void Cell::deliver(Envelope& env) {
  if ((++dequeued_local_ & dequeue_mask_) == 0) dequeued_.store(dequeued_local_, std::memory_order_relaxed);
  InvokeFn fn = env.invoke ? env.invoke : instance_->dispatch_table_().find(env.box.key());
  if (fn == nullptr) {
    const auto& table = instance_->dispatch_table_();
    Status s(ErrorCode::unknown_message, "actor " + path_ + " (" + table.actor_type_name() +
                                             ") has no handler for " + env.box.type_name() +
                                             "; add it to the class's Actor<...> message list");
    if (env.reply) {
      ReplyRef r = std::move(env.reply);
      r->fail(s);
    } else if (++unknown_messages_; (unknown_messages_ & (unknown_messages_ - 1)) == 0) {
      // Powers of two only: a sender in a loop must not flood the log.
      TROUPE_LOG(warn, "event=unknown_message actor={} type={} count={}", path_, env.box.type_name(),
                 unknown_messages_);
    }
    return;
  }
  current_ = &env;
  if (!guarded([&] { fn(*instance_, env); }, "handler")) return;
  current_ = nullptr;
  if (stop_requested_) {
    stop_requested_ = false;
    end_incarnation(ExitReason::normal_exit(), [this] { report_exit(ExitReason::normal_exit()); });
    return;
  }
  if (spec_.snapshot_every != 0 && ++since_snapshot_ >= spec_.snapshot_every) take_snapshot();
}

void Cell::drain_stash() {
  while (state_ == State::running && accepting_ && !stash_.empty()) {
    Envelope env = std::move(stash_.front());
    stash_.pop_front();
    deliver(env);
  }
}

void Cell::set_accepting(bool accepting) {
  accepting_ = accepting;
  if (accepting_) drain_stash();
}

void Cell::start_incarnation(uint64_t seq) {
  state_ = State::starting;
  stop_requested_ = false;
  ++incarnation_;
  if (started_once_) ++restarts_;
  bool first = !started_once_;
  started_once_ = true;
  std::string reason;
  try {
    instance_ = spec_.factory();
    instance_->cell_ = this;
    if (snapshot_) instance_->restore(*snapshot_);
  } catch (const std::exception& e) {
    reason = std::string("constructor or restore() threw: ") + e.what();
  } catch (...) {
    reason = "constructor or restore() threw a non-std::exception";
  }
  auto done = [this, seq, first, inc = incarnation_](Status s) {
    // A stale copy (kept in start_done_) finds the state moved on and does nothing.
    if (inc != incarnation_ || state_ != State::starting) return;
    if (s.ok()) {
      state_ = State::running;
      if (first && start_reply_) complete_reply_void<void>(start_reply_);
      if (parent_) reply_to_parent(Command::Kind::started, seq);
      replay_deferred_commands();
      drain_stash();
      return;
    }
    ExitReason why = ExitReason::failure(s.message());
    TROUPE_LOG(warn, "event=start_failed actor={} reason=\"{}\"", path_, s.message());
    finish_incarnation(why);
    if (first && start_reply_) {
      ReplyRef r = std::move(start_reply_);
      r->fail(Status(ErrorCode::start_failed, "start: " + path_ + " failed to start: " + s.message()));
    }
    if (parent_) {
      reply_to_parent(Command::Kind::start_failed, seq, why);
      replay_deferred_commands();
    } else {
      terminate(why);
    }
  };
  if (!reason.empty()) {
    instance_.reset();
    done(Status(ErrorCode::start_failed, reason));
    return;
  }
  start_done_ = done;
  try {
    instance_->start_async_(done);
  } catch (const FailSignal& s) {
    done(Status(ErrorCode::start_failed, s.reason));
  } catch (const std::exception& e) {
    done(Status(ErrorCode::start_failed, std::string("on_start threw: ") + e.what()));
  } catch (...) {
    done(Status(ErrorCode::start_failed, "on_start threw a non-std::exception"));
  }
}

void Cell::end_incarnation(ExitReason reason, std::function<void()> then) {
  if (state_ == State::running && !reason.abnormal()) take_snapshot();
  state_ = State::stopping;
  auto done = [this, reason, then = std::move(then), inc = incarnation_]() {
    if (inc != incarnation_ || state_ != State::stopping) return;
    finish_incarnation(reason);
    then();
  };
  try {
    instance_->stop_async_(reason, done);
  } catch (const std::exception& e) {
    TROUPE_LOG(warn, "event=on_stop_failed actor={} error=\"{}\"", path_, e.what());
    done();
  } catch (...) {
    TROUPE_LOG(warn, "event=on_stop_failed actor={} error=\"non-std::exception\"", path_);
    done();
  }
}

void Cell::finish_incarnation(const ExitReason& reason) {
  timers_.clear();
  monitors_.clear();
  clear_asks();
  if (reason.abnormal()) {
    for (auto& l : links_) send_command(l.get(), Command{Command::Kind::link_exit, CellPtr(control()), reason});
  }
  links_.clear();
  instance_.reset();
  current_ = nullptr;
  ++incarnation_;  // stale timers, replies and reports of the old one are ignored
  state_ = State::idle;
}

void Cell::crash(ExitReason reason) {
  if (state_ == State::starting) {
    // Only asynchronous starts (supervisors) can crash here: the start
    // fails, which is what the parent is waiting to hear.
    auto done = std::move(start_done_);
    start_done_ = nullptr;
    if (done) done(Status(ErrorCode::start_failed, reason.to_string()));
    return;
  }
  if (state_ != State::running) return;
  end_incarnation(reason, [this, reason] { report_exit(reason); });
}

void Cell::report_exit(ExitReason reason) {
  if (parent_) {
    send_command(parent_.get(), Command{Command::Kind::exited, CellPtr(control()), reason, 0, incarnation_ - 1});
    replay_deferred_commands();
    return;
  }
  if (reason.abnormal()) {
    CrashReport report;
    report.actor = path_;
    report.reason = reason;
    report.restart_count = restarts_;
    report.decision = "terminate";
    rt_->report_crash(report);
  }
  terminate(reason);
}

void Cell::terminate(ExitReason reason) {
  if (state_ == State::terminated) return;
  state_ = State::terminated;
  final_reason_ = reason;
  dead_.store(true, std::memory_order_release);
  Status s(ErrorCode::actor_dead,
           "ask: actor " + path_ + " stopped (" + reason.to_string() + ") before handling the message");
  for (auto& env : stash_) {
    if (env.reply) {
      ReplyRef r = std::move(env.reply);
      r->fail(s);
    }
  }
  stash_.clear();
  // Messages waiting in this cell's relay for an incarnation would wait for
  // one no one will start now (a supervisor that gave up on its child).
  if (Relay* relay = this->relay()) {
    relay->close(id_, Status(ErrorCode::actor_dead, "send: actor " + path_ + " stopped (" + reason.to_string() +
                                                        ") while the message waited for its next incarnation"));
  }
  clear_asks();
  quit(encode_reason(reason));
}

void Cell::reply_to_parent(Command::Kind kind, uint64_t seq, ExitReason reason) {
  send_command(parent_.get(), Command{kind, CellPtr(control()), std::move(reason), seq, incarnation_});
}

void Cell::replay_deferred_commands() {
  while (!deferred_commands_.empty() && (state_ == State::idle || state_ == State::running)) {
    Command cmd = std::move(deferred_commands_.front());
    deferred_commands_.pop_front();
    on_command(cmd);
  }
}

void Cell::on_command(Command& cmd) {
  using K = Command::Kind;
  if (state_ == State::terminated) return;
  switch (cmd.kind) {
    case K::start:
    case K::stop:
    case K::terminate:
    case K::exit:
    case K::parent_down:
    case K::remote_down:
      if (state_ == State::starting || state_ == State::stopping) {
        deferred_commands_.push_back(std::move(cmd));
        return;
      }
      break;
    default:
      break;
  }
  switch (cmd.kind) {
    case K::start:
      if (state_ == State::idle) {
        start_incarnation(cmd.id);
      } else {
        reply_to_parent(K::started, cmd.id);
      }
      return;
    case K::stop:
      if (state_ == State::running) {
        end_incarnation(ExitReason::shutdown("stopped by supervisor"),
                        [this, seq = cmd.id] { reply_to_parent(K::stopped, seq); });
      } else {
        reply_to_parent(K::stopped, cmd.id);
      }
      return;
    case K::terminate: {
      auto finish = [this, seq = cmd.id] {
        reply_to_parent(K::stopped, seq);
        terminate(ExitReason::shutdown("terminated by supervisor"));
      };
      if (state_ == State::running) {
        end_incarnation(ExitReason::shutdown("terminated by supervisor"), finish);
      } else {
        finish();
      }
      return;
    }
    case K::exit:
    case K::parent_down: {
      ExitReason why = ExitReason::shutdown(cmd.kind == K::exit ? "stopped by Runtime::stop" : "supervisor stopped");
      bool supervised = parent_ && cmd.kind == K::exit;
      if (state_ == State::running) {
        end_incarnation(why, [this, why, supervised] {
          if (supervised) {
            report_exit(why);
          } else {
            terminate(why);
          }
        });
      } else if (!supervised) {
        terminate(why);
      }
      return;
    }
    case K::link_add:
      if (state_ == State::running && !contains(links_, cmd.from.get())) {
        links_.push_back(cmd.from);
        caf::weak_actor_ptr self{caf::actor_control_block::from(this)};
        CellPtr other = cmd.from;
        cell_of(other.get())->attach_functor([self, other](const caf::error& e) {
          ExitReason r = decode_reason(e);
          if (!r.abnormal()) return;
          if (auto strong = self.lock()) {
            send_command(reinterpret_cast<CellControl*>(strong.get()), Command{Command::Kind::link_exit, other, r});
          }
        });
      }
      return;
    case K::link_remove:
      std::erase_if(links_, [&](const CellPtr& p) { return p == cmd.from; });
      return;
    case K::link_exit: {
      if (state_ != State::running || !contains(links_, cmd.from.get())) return;
      std::erase_if(links_, [&](const CellPtr& p) { return p == cmd.from; });
      LinkExit ex{AnyRef(cmd.from), cmd.reason};
      guarded([&] { instance_->on_link_exit(ex); }, "on_link_exit");
      return;
    }
    case K::down:
      if (cmd.incarnation != incarnation_) return;
      if (auto fn = take(monitors_, cmd.id)) {
        Down d{AnyRef(cmd.from), cmd.reason};
        guarded([&] { (*fn)(d); }, "monitor callback");
      }
      return;
    case K::timer:
      if (cmd.incarnation != incarnation_) return;
      if (auto fn = take(timers_, cmd.id)) guarded([&] { (*fn)(); }, "timer callback");
      return;
    case K::ask_tick:
      on_ask_tick(cmd.id);
      return;
    case K::remote_down:
      if (state_ == State::running) {
        end_incarnation(cmd.reason, [this, why = cmd.reason] { terminate(why); });
      } else {
        terminate(cmd.reason);
      }
      return;
    case K::started:
    case K::start_failed:
    case K::exited:
    case K::stopped:
      if (instance_) {
        guarded([&] { instance_->on_command_(cmd); }, "supervisor");
      }
      return;
  }
}

// -- asks made by this actor -------------------------------------------------

void Cell::track(PendingAsk* node, std::chrono::milliseconds timeout) {
  auto now = std::chrono::steady_clock::now();
  node->deadline = timeout >= std::chrono::hours(24 * 365) ? std::chrono::steady_clock::time_point::max()
                                                          : now + timeout;
  node->incarnation = incarnation_;
  node->reply_base()->add_ref();  // the list's reference
  // Asks mostly share one timeout, so the new node almost always goes last.
  PendingAsk* after = asks_tail_;
  while (after && after->deadline > node->deadline) after = after->prev;
  node->prev = after;
  node->next = after ? after->next : asks_head_;
  (node->next ? node->next->prev : asks_tail_) = node;
  (after ? after->next : asks_head_) = node;
  if (node->deadline < armed_tick_) arm_tick(node->deadline);
}

void Cell::arm_tick(std::chrono::steady_clock::time_point deadline) {
  if (deadline == std::chrono::steady_clock::time_point::max()) return;
  armed_tick_ = deadline;
  auto delay = std::max(deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration(0));
  delayed_send<caf::message_priority::high>(
      caf::actor_cast<caf::actor>(this), std::chrono::duration_cast<std::chrono::microseconds>(delay),
      Command{Command::Kind::ask_tick, CellPtr(), {},
              static_cast<uint64_t>(deadline.time_since_epoch().count())});
}

namespace {
void unlink_node(PendingAsk*& head, PendingAsk*& tail, PendingAsk* n) {
  (n->prev ? n->prev->next : head) = n->next;
  (n->next ? n->next->prev : tail) = n->prev;
  n->prev = n->next = nullptr;
}
}  // namespace

void Cell::on_ask_tick(uint64_t armed_for) {
  auto armed = std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(armed_for));
  if (armed == armed_tick_) armed_tick_ = std::chrono::steady_clock::time_point::max();
  auto now = std::chrono::steady_clock::now();
  while (asks_head_ && asks_head_->deadline <= now && state_ == State::running) {
    PendingAsk* n = asks_head_;
    unlink_node(asks_head_, asks_tail_, n);
    n->done = true;
    ReplyRef list_ref(n->reply_base());  // adopt the list's reference
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - n->deadline);
    guarded([&] {
      n->run_error(Status(ErrorCode::timeout, "ask from " + path_ +
                                                  ": no reply before the deadline; the target may be "
                                                  "overloaded or stuck (late by " +
                                                  std::to_string(ms.count()) + " ms)"));
    }, "ask continuation");
  }
  if (asks_head_ && asks_head_->deadline < armed_tick_) arm_tick(asks_head_->deadline);
}

void Cell::on_reply(ReplyReady& r) {
  PendingAsk* n = r.node;
  // While starting too: an asynchronous start (start_async_) may wait on asks.
  if (n->done || n->incarnation != incarnation_ || (state_ != State::running && state_ != State::starting)) return;
  n->done = true;
  unlink_node(asks_head_, asks_tail_, n);
  ReplyRef list_ref(n->reply_base());  // adopt the list's reference
  guarded([&] { n->run_reply(); }, "ask continuation");
}

void Cell::clear_asks() {
  while (asks_head_) {
    PendingAsk* n = asks_head_;
    unlink_node(asks_head_, asks_tail_, n);
    n->done = true;
    ReplyRef list_ref(n->reply_base());
  }
}

ReplyRef Cell::take_current_reply() {
  if (!current_) return {};
  return std::move(current_->reply);
}

// -- timers, monitors, links, snapshots ---------------------------------------

TimerId Cell::set_timer(std::chrono::microseconds delay, std::function<void()> fn) {
  TimerId id = next_id_++;
  timers_.emplace(id, std::move(fn));
  delayed_send<caf::message_priority::high>(caf::actor_cast<caf::actor>(this), delay,
                                            Command{Command::Kind::timer, CellPtr(), {}, id, incarnation_});
  return id;
}

MonitorId Cell::add_monitor(const AnyRef& other, std::function<void(const Down&)> fn) {
  MonitorId id = next_id_++;
  if (!other) {
    send_command(control(), Command{Command::Kind::down, CellPtr(), ExitReason::killed("empty reference"), id,
                                    incarnation_});
    monitors_.emplace(id, std::move(fn));
    return id;
  }
  monitors_.emplace(id, std::move(fn));
  caf::weak_actor_ptr self{caf::actor_control_block::from(this)};
  CellPtr target(other.cell());
  cell_of(other.cell())->attach_functor([self, target, id, inc = incarnation_](const caf::error& e) {
    if (auto strong = self.lock()) {
      send_command(reinterpret_cast<CellControl*>(strong.get()),
                   Command{Command::Kind::down, target, decode_reason(e), id, inc});
    }
  });
  return id;
}

void Cell::add_link(const AnyRef& other) {
  if (!other || other.cell() == control() || contains(links_, other.cell())) return;
  CellPtr peer(other.cell());
  links_.push_back(peer);
  send_command(peer.get(), Command{Command::Kind::link_add, CellPtr(control())});
  caf::weak_actor_ptr self{caf::actor_control_block::from(this)};
  cell_of(peer.get())->attach_functor([self, peer](const caf::error& e) {
    ExitReason r = decode_reason(e);
    if (!r.abnormal()) return;
    if (auto strong = self.lock()) {
      send_command(reinterpret_cast<CellControl*>(strong.get()), Command{Command::Kind::link_exit, peer, r});
    }
  });
}

void Cell::remove_link(const AnyRef& other) {
  if (!other) return;
  std::erase_if(links_, [&](const CellPtr& p) { return p.get() == other.cell(); });
  send_command(other.cell(), Command{Command::Kind::link_remove, CellPtr(control())});
}

void Cell::checkpoint() { take_snapshot(); }

void Cell::take_snapshot() {
  since_snapshot_ = 0;
  if (!instance_) return;
  std::optional<std::string> s = instance_->snapshot();
  if (!s) return;
  if (spec_.on_snapshot) spec_.on_snapshot(*s);
  snapshot_ = std::move(s);
}

// -- the ActorBase context API -------------------------------------------------

void track_ask(Cell* cell, PendingAsk* node, std::chrono::milliseconds timeout) { cell->track(node, timeout); }
CellControl* control_of(Cell* cell) { return cell->control(); }
ReplyRef take_current_reply(Cell* cell) { return cell->take_current_reply(); }

void retain(CellControl* c) noexcept { caf::intrusive_ptr_add_ref(reinterpret_cast<caf::actor_control_block*>(c)); }
void release(CellControl* c) noexcept { caf::intrusive_ptr_release(reinterpret_cast<caf::actor_control_block*>(c)); }
uint64_t cell_id(CellControl* c) { return cell_of(c)->id(); }
bool cell_dead(CellControl* c) { return cell_of(c)->dead() || cell_of(c)->remote_lost(); }
std::string cell_path(CellControl* c) { return cell_of(c)->path(); }
TypeKey cell_actor_type(CellControl* c) { return cell_of(c)->actor_type(); }
std::chrono::milliseconds default_ask_timeout(CellControl* c) {
  return cell_of(c)->runtime()->config().default_ask_timeout;
}

}  // namespace troupe::detail

namespace troupe {

using detail::Cell;

ActorBase::~ActorBase() = default;

void ActorBase::on_link_exit(const LinkExit& exit) {
  fail("linked actor " + exit.actor.path() + " exited: " + exit.reason.to_string());
}

AnyRef ActorBase::self() const { return AnyRef(detail::CellPtr(cell_->control())); }
std::string ActorBase::path() const { return cell_->path(); }
uint32_t ActorBase::restart_count() const { return cell_->restart_count(); }
void ActorBase::stop() { cell_->request_stop(); }
void ActorBase::fail(std::string reason) { throw detail::FailSignal{std::move(reason)}; }
void ActorBase::checkpoint() { cell_->checkpoint(); }
TimerId ActorBase::after(std::chrono::milliseconds delay, std::function<void()> fn) {
  return cell_->set_timer(delay, std::move(fn));
}
void ActorBase::cancel(TimerId id) { cell_->cancel_timer(id); }
MonitorId ActorBase::monitor(const AnyRef& other, std::function<void(const Down&)> fn) {
  return cell_->add_monitor(other, std::move(fn));
}
void ActorBase::demonitor(MonitorId id) { cell_->remove_monitor(id); }
void ActorBase::link(const AnyRef& other) { cell_->add_link(other); }
void ActorBase::unlink(const AnyRef& other) { cell_->remove_link(other); }
std::chrono::milliseconds ActorBase::resolve(std::chrono::milliseconds timeout) const {
  return timeout.count() < 0 ? cell_->runtime()->config().default_ask_timeout : timeout;
}
detail::RuntimeImpl* ActorBase::cell_runtime() const { return cell_->runtime(); }

void ActorBase::start_async_(std::function<void(Status)> done) {
  on_start();
  done(Status());
}

void ActorBase::stop_async_(const ExitReason& reason, std::function<void()> done) {
  try {
    on_stop(reason);
  } catch (const std::exception& e) {
    TROUPE_LOG(warn, "event=on_stop_failed actor={} error=\"{}\"", path(), e.what());
  } catch (...) {
    TROUPE_LOG(warn, "event=on_stop_failed actor={} error=\"non-std::exception\"", path());
  }
  done();
}

void ActorBase::on_command_(detail::Command&) {}

}  // namespace troupe
