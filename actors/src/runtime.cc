#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "cell.h"
#include "log.h"
#include "remote/node.h"
#include "runtime_impl.h"
#include "troupe/log.h"
#include "troupe/runtime.h"

namespace troupe::detail {

namespace {

size_t resolve_threads(size_t threads) {
  if (threads != 0) return threads;
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 2 : hw;
}

}  // namespace

RuntimeImpl::RuntimeImpl(RuntimeConfig config) : config_(std::move(config)) {
  config_.threads = resolve_threads(config_.threads);
  std::string level = config_.log_level;
  if (level.empty()) {
    const char* env = std::getenv("TROUPE_LOG_LEVEL");
    level = env ? env : "info";
  }
  if (!set_log_level(level)) {
    TROUPE_LOG(warn, "event=bad_config key=log_level value=\"{}\" using=info hint=\"use trace, debug, info, "
               "warn, error or off\"", level);
    set_log_level("info");
  }
  caf_config_ = std::make_unique<caf::actor_system_config>();
  caf_config_->set("scheduler.max-threads", static_cast<int64_t>(config_.threads));
  // CAF's idle workers poll in three phases: spinning, then "moderate"
  // polling with short sleeps, then sleeping on a condition variable that
  // an enqueue from outside notifies. The moderate sleeps are rounded up by
  // the kernel's timer slack (~55 us), so a message arriving then waits;
  // CAF's own 50 us is shortened to 5 us. sleep_when_idle skips the phase:
  // measured across processes it halves the round trip (168 -> 78 us over
  // TCP here), but a single in-process sender then wakes a sleeping
  // receiver far more often (tell 1 -> 1: 0.8 -> 0.6 of raw CAF).
  if (config_.sleep_when_idle) {
    caf_config_->set("work-stealing.moderate-poll-attempts", int64_t{0});
  } else {
    caf_config_->set("work-stealing.moderate-sleep-duration", caf::timespan(std::chrono::microseconds(5)));
  }
  // CAF's work-stealing scheduler, plus network polling by idle threads.
  auto spin = config_.network_spin;
  caf_config_->module_factories.push_back([this, spin](caf::actor_system& sys) -> caf::actor_system::module* {
    return new Scheduler(sys, &net_poller_, spin);
  });
  system_ = std::make_unique<caf::actor_system>(*caf_config_);
  TROUPE_LOG(debug, "event=runtime_started threads={}", config_.threads);
  if (!config_.listen.empty()) {
    if (auto n = node(); !n) {
      TROUPE_LOG(err, "event=listen_failed address={} reason=\"{}\"", config_.listen, n.error().message());
    }
  }
}

Result<std::shared_ptr<Node>> RuntimeImpl::node() {
  std::lock_guard<std::mutex> lock(node_mu_);
  if (node_) return node_;
  if (!node_status_.ok()) return error(node_status_);
  if (shutting_down()) return error(ErrorCode::shutting_down, "network: the runtime is shutting down");
  auto token = resolve_cluster_token(config_.cluster_token);
  if (!token) {
    node_status_ = token.error();
    return error(node_status_);
  }
  NodeConfig nc;
  nc.listen = config_.listen;
  nc.transport = config_.transport;
  nc.token = *token;
  nc.limits.max_payload_bytes = config_.max_frame_bytes;
  nc.max_send_queue_bytes = config_.max_send_queue_bytes;
  nc.slowest_frame_bytes_per_s = config_.slowest_frame_bytes_per_s;
  nc.heartbeat_interval = config_.heartbeat_interval;
  nc.dead_after = config_.peer_dead_after;
  auto node = std::make_shared<Node>(this, std::move(nc));
  if (Status s = node->start(); !s.ok()) {
    node_status_ = s;
    return error(s);
  }
  node_ = std::move(node);
  return node_;
}

std::string RuntimeImpl::address() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(node_mu_));
  return node_ ? node_->address() : std::string();
}

namespace {
// What a proxy cell hosts: nothing (its messages go to the network).
class ProxyActor final : public Actor<ProxyActor> {};
}  // namespace

CellPtr RuntimeImpl::spawn_proxy(std::shared_ptr<Node> node, const std::string& address, uint64_t id) {
  SpawnSpec spec;
  spec.name = address + "/#" + std::to_string(id);
  spec.path = spec.name;
  spec.factory = [] { return std::unique_ptr<ActorBase>(new ProxyActor()); };
  spec.actor_type = type_key<ProxyActor>();
  spec.actor_type_name = &type_name<ProxyActor>;
  spec.remote = std::make_shared<RemoteTarget>();
  spec.remote->node = node;
  spec.remote->address = address;
  spec.remote->id = id;
  return spawn(std::move(spec), nullptr, 0, {});
}

RuntimeImpl::~RuntimeImpl() { (void)shutdown(); }

CellPtr RuntimeImpl::spawn(SpawnSpec spec, Cell* parent, uint64_t start_seq, ReplyRef start_reply) {
  if (shutting_down() && parent == nullptr) {
    TROUPE_LOG(warn, "event=spawn_refused reason=shutting_down actor_type={}",
               spec.actor_type_name ? spec.actor_type_name() : "?");
    if (start_reply) {
      start_reply->fail(Status(ErrorCode::shutting_down, "spawn: the runtime is shutting down"));
    }
    return {};
  }
  uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
  std::string path;
  if (!spec.path.empty()) {
    path = spec.path;
  } else if (parent) {
    path = parent->path() + "/" + spec.name;
  } else {
    path = "/" + (spec.name.empty() ? "actor-" + std::to_string(id) : spec.name);
  }
  CellPtr parent_ptr = parent ? CellPtr(parent->control()) : CellPtr();
  live_.fetch_add(1, std::memory_order_acq_rel);
  caf::actor a = system_->spawn<Cell>(this, std::move(spec), std::move(parent_ptr), std::move(path), id,
                                      start_seq, std::move(start_reply));
  CellPtr cell(reinterpret_cast<CellControl*>(caf::actor_cast<caf::actor_control_block*>(a)));
  if (parent == nullptr && !cell_of(cell.get())->is_remote()) {
    std::lock_guard<std::mutex> lock(mu_);
    // The cell may already have stopped (a failed start): then it is gone
    // from the books and must not be re-added.
    if (!cell_of(cell.get())->dead()) top_.emplace(id, cell);
  }
  return cell;
}

void RuntimeImpl::on_cell_exit(Cell* cell) {
  CellPtr keep;  // released after unlocking: releasing may destroy the cell
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = top_.find(cell->id());
    if (it != top_.end()) {
      keep = std::move(it->second);
      top_.erase(it);
    }
    live_.fetch_sub(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
}

void RuntimeImpl::report_crash(const CrashReport& report) {
  TROUPE_LOG(err, "event=crash_report {}", report.to_string());
  if (config_.on_crash_report) {
    try {
      config_.on_crash_report(report);
    } catch (const std::exception& e) {
      TROUPE_LOG(warn, "event=crash_hook_failed error=\"{}\"", e.what());
    }
  }
}

template <class Pred>
bool RuntimeImpl::wait_until(std::chrono::steady_clock::time_point deadline, Pred pred) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, deadline, pred);
}

Result<SupervisorRef> RuntimeImpl::start_supervisor(std::string name, SupervisorSpec spec,
                                                    std::chrono::milliseconds timeout) {
  if (Status s = validate_spec(spec); !s.ok()) return error(s);
  if (name.empty()) return error(ErrorCode::invalid_argument, "start_supervisor: the name is empty; give the tree a name");
  if (timeout.count() < 0) timeout = config_.default_ask_timeout;
  auto* state = new FutureState<void>();
  ReplyRef reply(state);
  ReplyRef mine = reply;
  CellPtr cell = spawn(supervisor_spawn_spec(std::move(name), std::move(spec)), nullptr, 0, std::move(reply));
  if (!cell) return error(ErrorCode::shutting_down, "start_supervisor: the runtime is shutting down");
  {
    std::lock_guard<std::mutex> lock(mu_);
    roots_.push_back(cell_of(cell.get())->id());
  }
  Future<void> started(std::move(mine), timeout);
  Result<void> r = started.get();
  if (!r) return error(r.error());
  return SupervisorRef(AnyRef(std::move(cell)));
}

Future<ExitReason> RuntimeImpl::monitor(const AnyRef& actor, std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) timeout = config_.default_ask_timeout;
  auto* state = new FutureState<ExitReason>();
  ReplyRef reply(state);
  ReplyRef mine = reply;
  if (!actor) {
    reply->fail(Status(ErrorCode::invalid_argument, "monitor: empty reference"));
  } else {
    cell_of(actor.cell())->attach_functor([reply](const caf::error& e) {
      static_cast<FutureState<ExitReason>*>(reply.get())->complete(decode_reason(e));
    });
  }
  return Future<ExitReason>(std::move(mine), timeout);
}

Status RuntimeImpl::shutdown() {
  std::lock_guard<std::mutex> serial(shutdown_mu_);
  if (shutdown_status_) return *shutdown_status_;
  shutting_down_.store(true, std::memory_order_release);
  auto deadline = std::chrono::steady_clock::now() + config_.shutdown_timeout;

  // Supervision trees first, newest first; each stops its children in
  // reverse start order before it goes.
  std::vector<uint64_t> roots;
  {
    std::lock_guard<std::mutex> lock(mu_);
    roots = roots_;
  }
  for (auto it = roots.rbegin(); it != roots.rend(); ++it) {
    CellPtr cell;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto found = top_.find(*it);
      if (found == top_.end()) continue;
      cell = found->second;
    }
    send_command(cell.get(), Command{Command::Kind::exit});
    uint64_t id = *it;
    wait_until(deadline, [&] { return top_.count(id) == 0; });
  }

  // Then every other actor, newest first.
  std::vector<std::pair<uint64_t, CellPtr>> rest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rest.assign(top_.begin(), top_.end());
  }
  std::sort(rest.begin(), rest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (auto& [id, cell] : rest) send_command(cell.get(), Command{Command::Kind::exit});
  rest.clear();

  // Then the network: open asks fail with peer_lost, proxies terminate.
  std::shared_ptr<Node> node;
  {
    std::lock_guard<std::mutex> lock(node_mu_);
    node = node_;
  }
  if (node) node->stop();

  bool all_stopped = wait_until(deadline, [&] { return live_.load() == 0; });
  if (!all_stopped) {
    std::string stuck;
    {
      std::lock_guard<std::mutex> lock(mu_);
      int shown = 0;
      for (auto& [id, cell] : top_) {
        if (shown++ == 10) {
          stuck += " ...";
          break;
        }
        stuck += " " + cell_of(cell.get())->path();
      }
    }
    Status s(ErrorCode::timeout, "shutdown: " + std::to_string(live_.load()) + " actors did not stop within " +
                                     std::to_string(config_.shutdown_timeout.count()) +
                                     " ms (a handler that never returns cannot be preempted); stuck:" + stuck);
    TROUPE_LOG(err, "event=shutdown_timeout {}", s.message());
    // Destroying the actor system would wait for the stuck handlers forever;
    // leaving it allocated lets the process exit instead of hanging.
    (void)system_.release();
    (void)caf_config_.release();
    shutdown_status_ = s;
    return s;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    top_.clear();
  }
  system_.reset();
  caf_config_.reset();
  TROUPE_LOG(debug, "event=runtime_stopped");
  shutdown_status_ = Status();
  return Status();
}

CellPtr spawn_in(RuntimeImpl* rt, SpawnSpec spec) { return rt->spawn(std::move(spec), nullptr, 0, {}); }

}  // namespace troupe::detail

namespace troupe {

Runtime::Runtime(RuntimeConfig config) : impl_(std::make_unique<detail::RuntimeImpl>(std::move(config))) {}
Runtime::~Runtime() = default;

Result<SupervisorRef> Runtime::start_supervisor(std::string name, SupervisorSpec spec,
                                                std::chrono::milliseconds timeout) {
  return impl_->start_supervisor(std::move(name), std::move(spec), timeout);
}

Future<ExitReason> Runtime::monitor(const AnyRef& actor, std::chrono::milliseconds timeout) {
  return impl_->monitor(actor, timeout);
}

void Runtime::stop(const AnyRef& actor) {
  if (actor) detail::send_command(actor.cell(), detail::Command{detail::Command::Kind::exit});
}

size_t Runtime::live_actors() const { return impl_->live(); }

std::string Runtime::address() const { return impl_->address(); }

namespace detail {
Result<BufferRegistration> register_buffer_in(RuntimeImpl* rt, void* data, size_t size) {
  auto node = rt->node();
  if (!node) return error(node.error());
  auto handle = (*node)->register_region(data, size);
  if (!handle) return error(handle.error());
  return BufferRegistration(std::move(*handle), data);
}

Result<BufferRegistration> allocate_buffer_in(RuntimeImpl* rt, size_t size) {
  auto node = rt->node();
  if (!node) return error(node.error());
  auto region = (*node)->allocate_region(size);
  if (!region) return error(region.error());
  return BufferRegistration(std::move(region->first), region->second);
}
}  // namespace detail

Result<BufferRegistration> Runtime::register_buffer(void* data, size_t size) {
  return detail::register_buffer_in(impl_.get(), data, size);
}

Result<BufferRegistration> Runtime::allocate_buffer(size_t size) { return detail::allocate_buffer_in(impl_.get(), size); }

Result<BufferRegistration> ActorBase::register_buffer(void* data, size_t size) {
  return detail::register_buffer_in(cell_runtime(), data, size);
}

Result<BufferRegistration> ActorBase::allocate_buffer(size_t size) {
  return detail::allocate_buffer_in(cell_runtime(), size);
}

namespace detail {
void buffer_op(const RemoteBuffer& buffer, void* ptr, size_t n, uint64_t offset, bool write, ReplyRef reply) {
  if (!buffer.node_) {
    reply->fail(Status(ErrorCode::invalid_argument,
                       "remote buffer: this handle is not bound to a runtime (default-built?)"));
    return;
  }
  buffer.node_->region_op(buffer, ptr, n, offset, write, std::move(reply));
}
}  // namespace detail

namespace {
constexpr std::chrono::milliseconds kBufferTimeout{30'000};

Future<void> buffer_future(const RemoteBuffer& buffer, void* ptr, size_t n, uint64_t offset, bool write,
                           std::chrono::milliseconds timeout) {
  auto* st = new detail::FutureState<void>();
  detail::ReplyRef reply(st);
  Future<void> future(reply, timeout.count() < 0 ? kBufferTimeout : timeout);
  detail::buffer_op(buffer, ptr, n, offset, write, std::move(reply));
  return future;
}
}  // namespace

Future<void> RemoteBuffer::read_into(void* dst, size_t n, uint64_t offset, std::chrono::milliseconds timeout) const {
  return buffer_future(*this, dst, n, offset, false, timeout);
}

Future<void> RemoteBuffer::write_from(const void* src, size_t n, uint64_t offset,
                                      std::chrono::milliseconds timeout) const {
  return buffer_future(*this, const_cast<void*>(src), n, offset, true, timeout);
}

void BufferRegistration::reset() {
  if (handle_ && handle_.node_) handle_.node_->deregister_region(handle_.region());
  handle_ = RemoteBuffer();
  data_ = nullptr;
}

Status Runtime::publish(const std::string& name, const AnyRef& actor) {
  if (!actor) return Status(ErrorCode::invalid_argument, "publish: empty reference");
  auto node = impl_->node();
  if (!node) return node.error();
  return (*node)->publish(name, actor.cell());
}

Result<AnyRef> Runtime::resolve_any(const std::string& uri, std::chrono::milliseconds timeout) {
  auto slash = uri.find('/', uri.find("://") == std::string::npos ? 0 : uri.find("://") + 3);
  if (slash == std::string::npos || slash + 1 >= uri.size()) {
    return error(ErrorCode::invalid_argument, "resolve: '" + uri + "' has no actor name; use tcp://HOST:PORT/NAME");
  }
  auto node = impl_->node();
  if (!node) return error(node.error());
  if (timeout.count() < 0) timeout = impl_->config().default_ask_timeout;
  auto cell = (*node)->resolve(uri.substr(0, slash), uri.substr(slash + 1), timeout);
  if (!cell) return error(cell.error());
  return AnyRef(std::move(*cell));
}
Status Runtime::shutdown() { return impl_->shutdown(); }

Result<std::pair<std::string, uint64_t>> Runtime::locate(const AnyRef& actor) {
  if (!actor) return error(ErrorCode::invalid_argument, "locate: empty reference");
  auto node = impl_->node();
  if (!node) return error(node.error());
  return (*node)->locate(actor.cell());
}

Result<AnyRef> Runtime::ref_at(const std::string& address, uint64_t id) {
  auto node = impl_->node();
  if (!node) return error(node.error());
  detail::CellPtr cell;
  std::string problem;
  if (!(*node)->ref_for(address, id, &cell, &problem)) return error(ErrorCode::invalid_argument, problem);
  if (!cell) return error(ErrorCode::actor_dead, "ref_at: no actor " + std::to_string(id) + " at " + address);
  return AnyRef(std::move(cell));
}
const RuntimeConfig& Runtime::config() const { return impl_->config(); }

namespace detail {
CellPtr spawn_from_spec(Runtime& rt, SpawnSpec spec) { return spawn_in(rt.impl_.get(), std::move(spec)); }

namespace {
// A start reply that hands its outcome to a function.
class StartedReply final : public ReplyTo<void> {
 public:
  explicit StartedReply(std::function<void(Status)> fn) : fn_(std::move(fn)) {}
  void complete(Result<void>&& r) override {
    if (fn_) std::exchange(fn_, nullptr)(r ? Status() : r.error());
  }

 private:
  std::function<void(Status)> fn_;
};
}  // namespace

CellPtr spawn_from_spec(Runtime& rt, SpawnSpec spec, std::function<void(Status)> started) {
  return rt.impl_->spawn(std::move(spec), nullptr, 0, ReplyRef(new StartedReply(std::move(started))));
}
}  // namespace detail

}  // namespace troupe
