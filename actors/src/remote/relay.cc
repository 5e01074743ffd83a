#include "troupe/detail/relay.h"

#include <map>
#include <mutex>

#include "cell.h"
#include "remote/node.h"
#include "runtime_impl.h"
#include "log.h"
#include "troupe/runtime.h"

namespace troupe::detail {

// Defined in node.cc: rebuilds a message from its wire encoding.
bool decode_wire_message(uint64_t wire_id, std::string_view bytes, MessageBox* out, std::string* error);

namespace {

/// What the relay's cell runs: nothing (messages never reach its mailbox).
class RelayActor final : public Actor<RelayActor> {};

bool incarnation_lost(ErrorCode code) { return code == ErrorCode::peer_lost || code == ErrorCode::actor_dead; }

}  // namespace

struct Relay::State : std::enable_shared_from_this<Relay::State> {
  Resolver resolve;
  uint32_t max_retries;
  size_t max_parked;

  std::mutex mu;
  CellPtr target;          // the incarnation now; empty while resolving or dead
  bool resolving = false;
  Status final;            // set once there is no next incarnation
  Status closed;           // set while the cell standing for the actor is stopped (close())
  uint64_t owner = 0;      // the id of the cell that stands for the actor (adopt())
  uint64_t next_seq = 1;
  /// Messages waiting for the next incarnation, by the order they were first
  /// sent (a retried ask keeps its place ahead of later messages).
  struct Parked {
    Envelope env;
    uint32_t attempt = 0;  // asks retried so far
  };
  std::map<uint64_t, Parked> parked;
  caf::weak_actor_ptr cell;  // the relay's own cell, stopped with `final`
  std::weak_ptr<Node> node;  // the codec context of refs inside messages
  bool flushing = false;     // parked messages are being sent: later ones wait

  /// Sends `env` (sequence `seq`) to the current incarnation, or parks it.
  Status route(uint64_t seq, Envelope&& env, uint32_t attempt, bool from_flush = false);
  /// The incarnation `seen` is gone: find the next (once).
  void lost(const CellPtr& seen);
  /// Finds the next incarnation as soon as `target` ends, even with no
  /// message on the way (monitors of the relay then learn of a final end).
  void watch(const CellPtr& target);
  void resolved(Result<CellPtr> next);
  Status park(uint64_t seq, Envelope&& env, uint32_t attempt);
};

namespace {

/// Stands between an ask and the incarnation it went to: an answer passes
/// through; a failure because the incarnation died sends the ask again, to
/// the next one, while it has retries left.
class RetryReply final : public ReplyBase {
 public:
  RetryReply(std::shared_ptr<Relay::State> relay, ReplyRef asker, uint64_t seq, uint32_t attempt, uint64_t wire_id,
             std::string bytes, std::vector<codec::Splice> splices, InvokeFn invoke, CellPtr target)
      : ReplyBase(asker->value_type()),
        relay_(std::move(relay)),
        asker_(std::move(asker)),
        seq_(seq),
        attempt_(attempt),
        wire_id_(wire_id),
        bytes_(std::move(bytes)),
        splices_(std::move(splices)),
        invoke_(invoke),
        target_(std::move(target)) {}

  void fail(Status status) override {
    if (!incarnation_lost(status.code()) || attempt_ >= relay_->max_retries) {
      asker_->fail(std::move(status));
      return;
    }
    MessageBox box;
    std::string problem;
    std::shared_ptr<Node> node;
    {
      std::lock_guard<std::mutex> lock(relay_->mu);
      node = relay_->node.lock();
    }
    bool decoded = false;
    if (node) {
      CodecScope scope(node.get());
      decoded = decode_wire_message(wire_id_, codec::flatten(bytes_, splices_), &box, &problem);
    } else {
      problem = "the runtime has shut down";
    }
    if (!decoded) {
      asker_->fail(Status(ErrorCode::malformed, "retry: the message could not be rebuilt: " + problem));
      return;
    }
    relay_->lost(target_);
    TROUPE_LOG(debug, "event=ask_retry seq={} attempt={} reason=\"{}\"", seq_, attempt_ + 1, status.message());
    (void)relay_->route(seq_, Envelope(std::move(box), invoke_, std::move(asker_)), attempt_ + 1);
  }
  void complete_bytes(std::string_view bytes, std::shared_ptr<const void> owner) override {
    asker_->complete_bytes(bytes, std::move(owner));
  }
  void complete_encoded(std::string body, std::vector<codec::Splice> splices) override {
    asker_->complete_encoded(std::move(body), std::move(splices));
  }
  void* codec_context() const override { return asker_->codec_context(); }
  /// The asker's reply back, for a message that never left (see route()).
  ReplyRef take_asker() { return std::move(asker_); }

 private:
  std::shared_ptr<Relay::State> relay_;
  ReplyRef asker_;
  uint64_t seq_;
  uint32_t attempt_;
  uint64_t wire_id_;
  std::string bytes_;
  std::vector<codec::Splice> splices_;  // large Bytes fields, shared rather than copied
  InvokeFn invoke_;
  CellPtr target_;
};

}  // namespace

Status Relay::State::park(uint64_t seq, Envelope&& env, uint32_t attempt) {
  // Called with mu held.
  if (parked.size() >= max_parked) {
    Status s(ErrorCode::mailbox_full, "relay: " + std::to_string(max_parked) +
                                          " messages already wait for the actor's next incarnation; slow down");
    if (env.reply) {
      ReplyRef r = std::move(env.reply);
      r->fail(s);
    }
    return s;
  }
  parked.emplace(seq, Parked{std::move(env), attempt});
  return {};
}

Status Relay::State::route(uint64_t seq, Envelope&& env, uint32_t attempt, bool from_flush) {
  CellPtr to;
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!final.ok() || !closed.ok()) {
      Status s = final.ok() ? closed : final;
      lock.unlock();
      if (env.reply) {
        ReplyRef r = std::move(env.reply);
        r->fail(s);
      }
      return s;
    }
    if (resolving || !target || cell_dead(target.get()) || (flushing && !from_flush)) {
      bool start = !resolving && (!target || cell_dead(target.get()));
      Status s = park(seq, std::move(env), attempt);
      if (start) {
        resolving = true;
        target = CellPtr();
        lock.unlock();
        resolve([self = shared_from_this()](Result<CellPtr> next) { self->resolved(std::move(next)); });
      }
      return s;
    }
    to = target;
  }
  RetryReply* wrapper = nullptr;
  if (env.reply && max_retries > attempt) {
    // Keep the message's bytes: a retry rebuilds it for the next incarnation.
    std::string bytes;
    std::vector<codec::Splice> splices;
    uint64_t wire_id = env.box.ops() ? env.box.ops()->wire_id : 0;
    std::shared_ptr<Node> n;
    {
      std::lock_guard<std::mutex> lock(mu);
      n = node.lock();
      if (!n) {
        // A relay made by a supervisor (remote child) learns its runtime's
        // node from the first incarnation's proxy.
        if (auto found = cell_of(to.get())->runtime()->node()) node = n = *found;
      }
    }
    bool encoded = false;
    if (wire_id != 0 && n) {
      CodecScope scope(n.get());
      encoded = env.box.encode(bytes, &splices);
    }
    if (encoded) {
      wrapper = new RetryReply(shared_from_this(), std::move(env.reply), seq, attempt, wire_id, std::move(bytes),
                               std::move(splices), env.invoke, to);
      env.reply = ReplyRef(wrapper);
    }
  }
  bool kept = false;
  Status s = detail::send_unless_lost(to.get(), env, kept);
  if (s.ok() || !incarnation_lost(s.code())) return s;
  lost(to);
  if (!kept) return s;
  // It reached nothing: the incarnation is gone, though this process had
  // not heard yet (its connection closed a moment ago). The message waits
  // for the next one like one sent a moment later; it is not a retry.
  if (wrapper) env.reply = wrapper->take_asker();
  return route(seq, std::move(env), attempt, from_flush);
}

void Relay::State::watch(const CellPtr& target) {
  if (!target) return;
  std::weak_ptr<State> weak = weak_from_this();
  CellControl* raw = target.get();
  cell_of(raw)->attach_functor([weak, raw](const caf::error&) {
    auto self = weak.lock();
    if (!self) return;
    CellPtr seen;
    {
      std::lock_guard<std::mutex> lock(self->mu);
      if (self->target.get() != raw) return;
      seen = self->target;
    }
    self->lost(seen);
  });
}

void Relay::State::lost(const CellPtr& seen) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (resolving || !final.ok() || target != seen) return;  // already known
    resolving = true;
    target = CellPtr();
  }
  resolve([self = shared_from_this()](Result<CellPtr> next) { self->resolved(std::move(next)); });
}

void Relay::State::resolved(Result<CellPtr> next) {
  if (!next && next.error().code() == ErrorCode::timeout) {
    // Not back in time: what waits fails, and the next message looks again.
    std::map<uint64_t, Parked> waiting;
    {
      std::lock_guard<std::mutex> lock(mu);
      resolving = false;
      waiting.swap(parked);
    }
    Status s(ErrorCode::timeout, next.error().message());
    for (auto& [seq, p] : waiting) {
      if (p.env.reply) {
        ReplyRef r = std::move(p.env.reply);
        r->fail(s);
      }
    }
    return;
  }
  caf::strong_actor_ptr self_cell;
  CellPtr watch_next;
  bool flush = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    resolving = false;
    // One flush at a time: a flush already running (the previous target was
    // lost while it ran) sends what waits to this target, in order.
    flush = !flushing;
    flushing = true;
    if (next && *next) {
      target = *next;
      watch_next = target;
    } else {
      final = next ? Status(ErrorCode::actor_dead, "relay: the actor has no incarnation any more")
                   : Status(next.error().code(), next.error().message());
      self_cell = cell.lock();
    }
  }
  watch(watch_next);
  // In order, before anything sent meanwhile (which parks while flushing);
  // each goes through route() again: the new incarnation may be gone
  // already, or this may be the end.
  while (flush) {
    std::map<uint64_t, Parked> waiting;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (parked.empty() || resolving) {
        flushing = false;
        break;
      }
      waiting.swap(parked);
    }
    for (auto it = waiting.begin(); it != waiting.end(); it = waiting.erase(it)) {
      {
        // Lost again meanwhile, or an earlier message parked since (a kept
        // one, a retried ask): the rest waits behind it, in order.
        std::lock_guard<std::mutex> lock(mu);
        if (resolving || (!parked.empty() && parked.begin()->first < it->first)) {
          parked.merge(waiting);  // `it` onwards: the loop erased the rest
          break;
        }
      }
      (void)route(it->first, std::move(it->second.env), it->second.attempt, /*from_flush=*/true);
    }
  }
  if (self_cell) {
    ExitReason why = ExitReason::killed(final.message());
    send_command(reinterpret_cast<CellControl*>(self_cell.get()), Command{Command::Kind::remote_down, {}, why});
  }
}

Relay::Relay(CellPtr first, Resolver resolve, uint32_t max_retries, size_t max_parked)
    : state_(std::make_shared<State>()) {
  state_->target = std::move(first);
  state_->resolve = std::move(resolve);
  state_->max_retries = max_retries;
  state_->max_parked = max_parked;
  state_->watch(state_->target);
}

Relay::~Relay() = default;

CellPtr Relay::current() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->target && !cell_dead(state_->target.get())) return state_->target;
  return CellPtr();
}

Relay* relay_of(CellControl* cell) { return cell ? cell_of(cell)->relay() : nullptr; }

Result<std::pair<uint64_t, std::string>> encode_message(CellControl* context, const MessageBox& box) {
  uint64_t wire_id = box.ops() ? box.ops()->wire_id : 0;
  if (wire_id == 0) {
    return error(ErrorCode::invalid_argument, "message " + box.type_name() +
                                                  " cannot leave its process: declare it with TROUPE_MESSAGE");
  }
  auto node = cell_of(context)->runtime()->node();
  if (!node) return error(node.error());
  std::string bytes;
  CodecScope scope(node->get());
  box.encode(bytes);
  return std::make_pair(wire_id, std::move(bytes));
}

Result<CellPtr> cell_at(CellControl* context, const std::string& address, uint64_t id) {
  auto node = cell_of(context)->runtime()->node();
  if (!node) return error(node.error());
  CellPtr cell;
  std::string problem;
  if (!(*node)->ref_for(address, id, &cell, &problem)) return error(ErrorCode::invalid_argument, problem);
  if (!cell) return error(ErrorCode::actor_dead, "no actor " + std::to_string(id) + " at " + address);
  return cell;
}

Status tell_encoded(CellControl* context, CellControl* to, uint64_t wire_id, std::string_view bytes) {
  auto node = cell_of(context)->runtime()->node();
  if (!node) return node.error();
  MessageBox box;
  std::string problem;
  bool decoded;
  {
    CodecScope scope(node->get());
    decoded = decode_wire_message(wire_id, bytes, &box, &problem);
  }
  if (!decoded) return Status(ErrorCode::malformed, "encoded message: " + problem);
  return detail::send(to, Envelope(std::move(box), nullptr, ReplyRef()));
}

void Relay::retarget(CellPtr next) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->closed = Status();
  }
  state_->resolved(Result<CellPtr>(std::move(next)));
}

void Relay::adopt(uint64_t cell_id) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->owner = cell_id;
}

void Relay::close(uint64_t cell_id, Status why) {
  std::map<uint64_t, State::Parked> waiting;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->owner != cell_id) return;  // a cell replaced by a fresh one
    state_->closed = why;
    waiting.swap(state_->parked);
  }
  // A flush running now routes what it already took: route() fails it too.
  size_t tells = 0;
  for (auto& [seq, p] : waiting) {
    if (p.env.reply) {
      ReplyRef r = std::move(p.env.reply);
      r->fail(why);
    } else {
      ++tells;
    }
  }
  if (tells > 0) {
    TROUPE_LOG(warn, "event=dead_letters messages={} reason=\"{}\"", tells, why.message());
  }
}

Status Relay::send(Envelope&& env) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    seq = state_->next_seq++;
  }
  return state_->route(seq, std::move(env), 0);
}

CellPtr spawn_relay(Runtime& rt, std::shared_ptr<Relay> relay, std::string name) {
  SpawnSpec spec;
  spec.name = std::move(name);
  spec.factory = [] { return std::unique_ptr<ActorBase>(new RelayActor()); };
  spec.actor_type = type_key<RelayActor>();
  spec.actor_type_name = &type_name<RelayActor>;
  std::shared_ptr<Relay::State> state = relay->state_;
  spec.relay = std::move(relay);
  CellPtr cell = spawn_from_spec(rt, std::move(spec));
  if (cell) {
    std::shared_ptr<Node> node;
    if (auto n = cell_of(cell.get())->runtime()->node()) node = *n;
    std::lock_guard<std::mutex> lock(state->mu);
    state->node = node;
    state->cell = caf::actor_cast<caf::weak_actor_ptr>(
        caf::strong_actor_ptr(reinterpret_cast<caf::actor_control_block*>(cell.get())));
  }
  return cell;
}

}  // namespace troupe::detail
