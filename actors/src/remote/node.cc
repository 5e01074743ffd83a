#include "node.h"

#include "cuda_staging.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "cell.h"
#include "log.h"
#include "receive_pool.h"
#include "runtime_impl.h"
#include "troupe/detail/fault_points.h"
#include "troupe/future.h"
#include "troupe/message.h"

namespace troupe::detail {

namespace {

// How long a connection this node refused stays open for the dialer to read
// the reason (it closes it itself on reading it).
constexpr std::chrono::milliseconds kRefusalLinger{1000};

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t random_u64() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

/// Compares secrets in time independent of where they differ.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

/// "troupe://h:p", "h:p" -> "SCHEME://h:p" (the key peers are known by),
/// with this node's transport as the scheme.
Result<std::string> normalize(const std::string& address, const char* scheme) {
  std::string a = address;
  if (a.rfind("troupe://", 0) == 0) a = a.substr(9);
  auto e = transport::parse_endpoint(a);
  if (!e) return error(e.error());
  if (e->scheme.empty()) e->scheme = scheme;
  if (e->scheme != scheme) {
    return error(ErrorCode::invalid_argument, "address " + address + ": this runtime speaks " + scheme +
                                                  "; set RuntimeConfig::listen or ::transport to " + e->scheme +
                                                  " to reach it");
  }
  return e->to_uri();
}

// The answer to an ask that came from another process.
class RemoteReply final : public ReplyBase {
 public:
  RemoteReply(std::weak_ptr<Node> node, transport::PeerId peer, uint64_t correlation)
      : ReplyBase(type_key<AnyRemoteReply>()), node_(std::move(node)), peer_(peer), correlation_(correlation) {}
  void* codec_context() const override { return node_.lock().get(); }
  void fail(Status status) override {
    if (auto n = node_.lock()) n->send_error(peer_, correlation_, status);
  }
  void complete_bytes(std::string_view bytes, std::shared_ptr<const void>) override {
    if (auto n = node_.lock()) n->send_reply(peer_, correlation_, std::string(bytes), {});
  }
  void complete_encoded(std::string body, std::vector<codec::Splice> splices) override {
    if (auto n = node_.lock()) n->send_reply(peer_, correlation_, std::move(body), std::move(splices));
  }

 private:
  std::weak_ptr<Node> node_;
  transport::PeerId peer_;
  uint64_t correlation_;
};

struct WireTypeEntry {
  std::string name;
  TypeKey key;
  WireDecodeFn decode;
};

std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
std::unordered_map<uint64_t, WireTypeEntry>& registry() {
  static std::unordered_map<uint64_t, WireTypeEntry> map;
  return map;
}

const WireTypeEntry* find_wire_type(uint64_t id) {
  std::lock_guard<std::mutex> lock(registry_mu());
  auto it = registry().find(id);
  return it == registry().end() ? nullptr : &it->second;
}

}  // namespace

bool decode_wire_message(uint64_t wire_id, std::string_view bytes, MessageBox* out, std::string* error) {
  const WireTypeEntry* type = find_wire_type(wire_id);
  if (type == nullptr) {
    *error = "message type id " + std::to_string(wire_id) + " is unknown";
    return false;
  }
  return type->decode(bytes, nullptr, out, error);
}

bool register_wire_type(uint64_t wire_id, std::string_view name, TypeKey key, WireDecodeFn decode) {
  std::lock_guard<std::mutex> lock(registry_mu());
  auto [it, inserted] = registry().emplace(wire_id, WireTypeEntry{std::string(name), key, decode});
  if (!inserted && it->second.key != key) {
    std::fprintf(stderr,
                 "troupe: two message types are registered as '%.*s' (or collide on its wire id); give one of "
                 "them another name with TROUPE_MESSAGE_NAMED\n",
                 static_cast<int>(name.size()), name.data());
    std::abort();
  }
  return true;
}

Result<std::string> resolve_cluster_token(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (const char* env = std::getenv("TROUPE_CLUSTER_TOKEN"); env && *env) return std::string(env);
  namespace fs = std::filesystem;
  fs::path home;
  if (const char* th = std::getenv("TROUPE_HOME"); th && *th) {
    home = th;
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    home = fs::path(h) / ".troupe";
  } else {
    return error(ErrorCode::invalid_argument,
                 "cluster token: none configured and neither TROUPE_HOME nor HOME is set; set "
                 "RuntimeConfig::cluster_token or TROUPE_CLUSTER_TOKEN");
  }
  fs::path file = home / "cluster_token";
  std::error_code ec;
  if (fs::exists(file, ec)) {
    std::ifstream in(file);
    std::string token;
    std::getline(in, token);
    if (!token.empty()) return token;
  }
  fs::create_directories(home, ec);
  std::string token;
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 4; ++i) {
    uint64_t r = random_u64();
    for (int j = 0; j < 16; ++j) token += kHex[(r >> (4 * j)) & 15];
  }
  std::string tmp = file.string() + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    out << token << "\n";
    if (!out) {
      return error(ErrorCode::invalid_argument, "cluster token: cannot write " + file.string() +
                                                    "; set TROUPE_CLUSTER_TOKEN or make the folder writable");
    }
  }
  chmod(tmp.c_str(), 0600);
  // Two processes starting at once: the first rename wins, both read it back.
  if (!fs::exists(file, ec)) fs::rename(tmp, file, ec);
  fs::remove(tmp, ec);
  std::ifstream in(file);
  std::string stored;
  std::getline(in, stored);
  return stored.empty() ? token : stored;
}

namespace {
thread_local void* tl_codec_node = nullptr;
}  // namespace

CodecScope::CodecScope(void* node) : prev_(tl_codec_node) { tl_codec_node = node; }

std::shared_ptr<Node> codec_node() {
  auto* node = static_cast<Node*>(tl_codec_node);
  return node ? node->shared_from_this() : nullptr;
}
CodecScope::~CodecScope() { tl_codec_node = prev_; }

void encode_ref(codec::Writer& w, CellControl* cell) {
  auto* node = static_cast<Node*>(tl_codec_node);
  if (node == nullptr || cell == nullptr) {
    codec::write(w, std::string());
    codec::write(w, uint64_t{0});
    return;
  }
  node->encode_ref(w, cell);
}

bool decode_ref(codec::Reader& r, CellPtr* out) {
  auto* node = static_cast<Node*>(tl_codec_node);
  std::string address;
  uint64_t id = 0;
  if (!codec::read(r, address) || !codec::read(r, id)) return false;
  if (address.empty() || id == 0 || node == nullptr) {
    *out = CellPtr();
    return true;
  }
  std::string problem;
  if (!node->ref_for(address, id, out, &problem)) return r.fail(problem);
  return true;
}

Result<std::pair<std::string, uint64_t>> Node::locate(CellControl* cell) {
  Cell* c = cell_of(cell);
  if (c->is_remote()) return std::make_pair(c->remote_address(), c->remote_id());
  if (address_.empty()) {
    return error(ErrorCode::invalid_argument, "actor " + c->path() + " cannot be reached from other processes: " +
                                                  "its runtime does not listen (set RuntimeConfig::listen)");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    exports_.emplace(c->id(), caf::weak_actor_ptr(caf::actor_control_block::from(c)));
  }
  return std::make_pair(address_, c->id());
}

void Node::encode_ref(codec::Writer& w, CellControl* cell) {
  auto where = locate(cell);
  if (!where) {
    TROUPE_LOG(warn, "event=ref_not_exported reason=\"{}\"", where.error().message());
    codec::write(w, std::string());
    codec::write(w, uint64_t{0});
    return;
  }
  codec::write(w, where->first);
  codec::write(w, where->second);
}

bool Node::ref_for(const std::string& address, uint64_t id, CellPtr* out, std::string* problem) {
  if (address == address_) {
    *out = find_export(id);  // our own actor, back home: empty if it stopped
    return true;
  }
  auto norm = normalize(address, transport_->scheme());
  if (!norm) {
    *problem = "actor ref with a bad address '" + address + "'";
    return false;
  }
  *out = proxy_for(*norm, id);
  return true;
}

Node::Node(RuntimeImpl* rt, NodeConfig config) : rt_(rt), config_(std::move(config)), node_id_(random_u64()) {}

Node::~Node() { stop(); }

Status Node::start() {
  transport::TransportLimits limits;
  limits.frame = config_.limits;
  limits.max_send_queue_bytes = config_.max_send_queue_bytes;
  limits.slowest_frame_bytes_per_s = config_.slowest_frame_bytes_per_s;
  std::string scheme = config_.transport;
  Result<transport::Endpoint> at = transport::Endpoint{};
  if (!config_.listen.empty()) {
    at = transport::parse_endpoint(config_.listen);
    if (!at) return at.error();
    if (!at->scheme.empty()) scheme = at->scheme;
  }
  transport::Events events{
      [this](transport::PeerId p, transport::InFrame f) { on_frame(p, std::move(f)); },
      [this](transport::PeerId p, bool inbound) { on_connected(p, inbound); },
      [this](transport::PeerId p, Status s) { on_lost(p, std::move(s)); },
      [this](transport::PeerId p) {
        if (auto peer = find_peer(p)) peer->last_recv_us = now_us();
      },
  };
  if (scheme == "ucx") {
    auto t = transport::make_ucx_transport(std::move(events), limits);
    if (!t) return t.error();
    transport_ = std::move(*t);
  } else if (scheme == "tcp") {
    transport_ = transport::make_tcp_transport(std::move(events), limits);
  } else {
    return Status(ErrorCode::invalid_argument, "transport: unknown '" + scheme + "' (use tcp or ucx)");
  }
  if (!config_.listen.empty()) {
    auto bound = transport_->listen(*at);
    if (!bound) return bound.error();
    address_ = *bound;
    TROUPE_LOG(info, "event=node_listening address={} node_id={:016x}", address_, node_id_);
  }
  rt_->net_poller().attach(transport_.get());
  hb_thread_ = std::thread([this] { heartbeat_loop(); });
  return {};
}

std::string Node::address() const { return address_; }

void Node::stop() {
  {
    std::lock_guard<std::mutex> lock(hb_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  hb_cv_.notify_all();
  if (hb_thread_.joinable()) hb_thread_.join();
  if (transport_) {
    // Tell peers this is an orderly departure, not a crash.
    std::vector<std::shared_ptr<Peer>> peers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, p] : peers_) peers.push_back(p);
    }
    for (auto& p : peers) {
      p->leaving = true;
      if (p->ready) (void)send_frame(*p, wire::Goodbye{"runtime shutdown"}, {});
    }
    rt_->net_poller().detach();  // no scheduler thread inside it from here on
    transport_->stop();  // reports every connection lost
  }
  // Proxies whose peer never connected still need to go.
  std::vector<caf::weak_actor_ptr> proxies;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, weak] : proxies_) proxies.push_back(weak);
    proxies_.clear();
  }
  for (auto& w : proxies) {
    if (auto strong = w.lock()) {
      send_command(reinterpret_cast<CellControl*>(strong.get()),
                   Command{Command::Kind::remote_down, CellPtr(), ExitReason::killed("runtime shutdown")});
    }
  }
}

Status Node::publish(const std::string& name, CellControl* cell) {
  if (name.empty() || name.find('/') != std::string::npos) {
    return Status(ErrorCode::invalid_argument, "publish: name '" + name + "' must be non-empty and without '/'");
  }
  Cell* c = cell_of(cell);
  if (c->is_remote()) return Status(ErrorCode::invalid_argument, "publish: " + c->path() + " is a remote actor");
  std::lock_guard<std::mutex> lock(mu_);
  names_[name] = c->id();
  exports_[c->id()] = caf::weak_actor_ptr(caf::actor_control_block::from(c));
  return {};
}

CellPtr Node::find_export(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = exports_.find(id);
  if (it == exports_.end()) return {};
  auto strong = it->second.lock();
  if (!strong) {
    exports_.erase(it);
    return {};
  }
  return CellPtr(reinterpret_cast<CellControl*>(strong.get()));
}

std::shared_ptr<Node::Peer> Node::find_peer(transport::PeerId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : it->second;
}

std::shared_ptr<Node::Peer> Node::peer_for(const std::string& address, Status* why) {
  std::unique_lock<std::mutex> lock(mu_);
  if (auto it = by_address_.find(address); it != by_address_.end()) {
    if (!it->second->refused.ok()) {
      *why = it->second->refused;
      return nullptr;
    }
    return it->second;
  }
  auto ep = transport::parse_endpoint(address);
  if (!ep) {
    *why = ep.error();
    return nullptr;
  }
  // Not under mu_: the transport takes its own locks, and its thread calls
  // back into this node under them. A loss it reports before the peer is
  // registered below is remembered in lost_early_ instead.
  lock.unlock();
  auto id = transport_->connect(*ep);
  if (!id) {
    *why = id.error();
    return nullptr;
  }
  lock.lock();
  if (auto it = by_address_.find(address); it != by_address_.end()) {
    // Another thread connected meanwhile: use its connection.
    transport_->close(*id, "duplicate connection");
    return it->second;
  }
  if (lost_early_.erase(*id) != 0) {
    *why = Status(ErrorCode::peer_lost, "connect: " + address + " is unreachable");
    return nullptr;
  }
  auto peer = std::make_shared<Peer>();
  peer->id = *id;
  peer->address = address;
  peer->last_recv_us = now_us();
  peers_[peer->id] = peer;
  by_address_[address] = peer;
  lock.unlock();
  // The transport queues frames until connected: the Hello goes first.
  wire::Hello hello{wire::kProtocolVersion, node_id_, config_.token, address_};
  *why = send_frame(*peer, hello, {});
  return why->ok() ? peer : nullptr;
}

Status Node::send_frame(Peer& peer, const wire::Message& header, std::string payload,
                        std::vector<codec::Splice> splices) {
  Status s;
  {
    std::lock_guard<std::mutex> lock(peer.send_mu);
    transport::OutFrame f;
    const bool envelope = std::holds_alternative<wire::EnvelopeHeader>(header);
    if (envelope) {
      wire::EnvelopeHeader h = std::get<wire::EnvelopeHeader>(header);
      h.sequence = peer.next_seq;
      f.header = wire::encode(h);
    } else {
      f.header = wire::encode(header);
    }
    f.payload = std::move(payload);
    f.splices = std::move(splices);
    peer.last_send_us = now_us();
    s = transport_->send(peer.id, std::move(f));
    // Only a frame that went out takes a sequence number: after one the
    // transport refused (a full send queue), the next follows without a gap
    // (the receiver closes a connection that skips one).
    if (s.ok() && envelope) ++peer.next_seq;
  }
  if (s.ok()) return s;
  // A frame lost this way may have taken frames batched before it along: the
  // connection cannot go on. Closing it (a no-op where the transport already
  // has) makes the loss known (on_lost), so that peer_lost here always means
  // the connection is gone. Outside send_mu: the close may report at once.
  if (s.code() == ErrorCode::peer_lost) transport_->close(peer.id, s.message());
  // The peer refused our hello and the connection closed after a caller
  // found it open: the refusal (set before that close, which this failed
  // send observed) is the reason, not the closed connection.
  if (!peer.refused.ok()) return peer.refused;
  return s;
}

CellPtr Node::proxy_for(const std::string& address, uint64_t id) {
  CellPtr cell;
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_pair(address, id);
    if (auto it = proxies_.find(key); it != proxies_.end()) {
      if (auto strong = it->second.lock()) return CellPtr(reinterpret_cast<CellControl*>(strong.get()));
    }
    cell = rt_->spawn_proxy(shared_from_this(), address, id);
    if (!cell) return {};
    proxies_[key] = caf::weak_actor_ptr(reinterpret_cast<caf::actor_control_block*>(cell.get()));
    if (auto it = by_address_.find(address); it != by_address_.end()) peer = it->second;
  }
  // Learn when the remote actor stops: its node answers with Down. A ref
  // that came from a third node may name a node we have no connection to
  // yet: connect (the request waits behind the handshake).
  if (!peer) {
    Status why;
    peer = peer_for(address, &why);
    if (!peer) {
      TROUPE_LOG(warn, "event=monitor_request_failed address={} actor={} reason=\"{}\"", address, id, why.message());
    }
  }
  if (peer) (void)send_frame(*peer, wire::MonitorRequest{id}, {});
  return cell;
}

Result<CellPtr> Node::resolve(const std::string& address, const std::string& name, std::chrono::milliseconds timeout) {
  auto norm = normalize(address, transport_->scheme());
  if (!norm) return error(norm.error());
  Status why;
  auto peer = peer_for(*norm, &why);
  if (!peer) return error(why);
  uint64_t corr = next_correlation_.fetch_add(1);
  auto* state = new FutureState<uint64_t>();
  ReplyRef reply(state);
  ReplyRef mine = reply;
  {
    std::lock_guard<std::mutex> lock(mu_);
    resolves_[corr] = PendingResolve{std::move(reply), *norm};
  }
  Status sent = send_frame(*peer, wire::Resolve{corr, name}, {});
  Future<uint64_t> answer(std::move(mine), timeout);
  if (!sent.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    resolves_.erase(corr);
    return error(sent);
  }
  auto id = answer.get();
  {
    std::lock_guard<std::mutex> lock(mu_);
    resolves_.erase(corr);
  }
  if (!id) return error(id.error());
  CellPtr proxy = proxy_for(*norm, *id);
  if (!proxy) return error(ErrorCode::shutting_down, "resolve: the runtime is shutting down");
  return proxy;
}

Status Node::send_envelope(Cell* proxy, Envelope& env, bool* kept) {
  // A frame the transport refused with peer_lost never left: nothing of it
  // reached the actor, so the caller may send it elsewhere.
  if (kept != nullptr) *kept = false;
  auto keep = [&](const Status& s) { return kept != nullptr && s.code() == ErrorCode::peer_lost; };
  auto fail = [&](Status s) {
    if (keep(s)) {
      *kept = true;
    } else if (env.reply) {
      ReplyRef r = std::move(env.reply);
      r->fail(s);
    }
    return s;
  };
  std::string payload;
  std::vector<codec::Splice> splices;  // large Bytes fields: sent from where they lie
  bool encoded;
  {
    CodecScope scope(this);
    encoded = env.box.encode(payload, &splices);
  }
  if (!encoded) {
    return fail(Status(ErrorCode::invalid_argument,
                       "send: message type " + env.box.type_name() + " cannot go to another process (to " +
                           proxy->path() + "); declare it with TROUPE_MESSAGE(Type, fields...)"));
  }
  Status why;
  auto peer = peer_for(proxy->remote_address(), &why);
  if (!peer) return fail(why);
  wire::EnvelopeHeader h;
  h.kind = env.reply ? wire::EnvelopeKind::ask : wire::EnvelopeKind::tell;
  h.destination = proxy->remote_id();
  h.type_id = env.box.ops()->wire_id;
  if (env.reply) {
    // Registered before the frame goes, for an answer may come at once. The
    // connection's loss handler leaves it to this sender until the
    // transport has taken or refused the frame: refused, it never left.
    h.correlation = next_correlation_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      peer->asks.emplace(h.correlation, Peer::PendingAsk{std::move(env.reply), /*sending=*/true});
    }
    if (faults::armed(faults::Point::before_ask_sent)) {
      faults::reach(faults::Point::before_ask_sent, proxy->remote_address());
    }
  }
  Status s = send_frame(*peer, h, std::move(payload), std::move(splices));
  if (h.correlation == 0) return s.ok() ? s : fail(s);  // a tell
  ReplyRef r;
  Status lost;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = peer->asks.find(h.correlation); it != peer->asks.end()) {
      it->second.sending = false;
      if (!s.ok() || !peer->lost.ok()) {
        r = std::move(it->second.reply);
        peer->asks.erase(it);
        lost = peer->lost;
      }
    }
  }
  if (s.ok()) {
    // The frame went, and the connection was lost before an answer came:
    // the loss handler left this ask to its sender. It was in flight.
    if (r) r->fail(lost);
    return s;
  }
  if (!r) return s;  // answered: cannot be for a frame that never went
  env.reply = std::move(r);
  return fail(s);
}

void Node::send_reply(transport::PeerId id, uint64_t correlation, std::string bytes,
                      std::vector<codec::Splice> splices) {
  auto peer = find_peer(id);
  if (!peer) return;  // the asker is gone; its ask already failed with peer_lost
  wire::EnvelopeHeader h;
  h.kind = wire::EnvelopeKind::reply;
  h.correlation = correlation;
  (void)send_frame(*peer, h, std::move(bytes), std::move(splices));
}

void Node::send_error(transport::PeerId id, uint64_t correlation, const Status& status) {
  auto peer = find_peer(id);
  if (!peer) return;
  wire::EnvelopeHeader h;
  h.kind = wire::EnvelopeKind::error;
  h.correlation = correlation;
  h.error_code = static_cast<uint8_t>(status.code());
  h.error_message = status.message();
  (void)send_frame(*peer, h, {});
}

// -- transport events ----------------------------------------------------------

void Node::on_connected(transport::PeerId id, bool inbound) {
  if (!inbound) return;  // outbound peers were registered by peer_for
  auto peer = std::make_shared<Peer>();
  peer->id = id;
  peer->inbound = true;
  peer->last_recv_us = now_us();
  std::lock_guard<std::mutex> lock(mu_);
  peers_[id] = peer;
}

void Node::on_frame(transport::PeerId id, transport::InFrame frame) {
  int64_t start = now_us();
  handling_since_us_.store(start);
  handle_frame(id, std::move(frame));
  int64_t end = now_us();
  handling_since_us_.store(0);
  auto interval_us = std::chrono::duration_cast<std::chrono::microseconds>(config_.heartbeat_interval).count();
  if (end - start > interval_us) {
    // Nothing was read while this frame was handled: every peer gets a
    // fresh window rather than being declared dead for our own stall.
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [pid, p] : peers_) p->last_recv_us = std::max(p->last_recv_us.load(), end);
  }
}

void Node::handle_frame(transport::PeerId id, transport::InFrame frame) {
  auto peer = find_peer(id);
  if (!peer) return;
  // A refused connection is closing; what it sent after the refusal (or a
  // second refusal behind the first) changes nothing, and does not keep it
  // alive (the heartbeat sweep closes it, see kRefusalLinger).
  if (!peer->ready && !peer->refused.ok()) return;
  peer->last_recv_us = now_us();
  if (!peer->ready) {
    if (peer->inbound) {
      const auto* hello = std::get_if<wire::Hello>(&frame.message);
      std::string problem;
      if (hello == nullptr) {
        problem = std::string("expected hello, got ") + wire::message_name(frame.message);
      } else if (hello->protocol_version != wire::kProtocolVersion) {
        problem = "protocol version " + std::to_string(hello->protocol_version) + " (this node speaks " +
                  std::to_string(wire::kProtocolVersion) + ")";
      } else if (!same_secret(hello->token, config_.token)) {
        problem = "wrong cluster token (set the same TROUPE_CLUSTER_TOKEN on every node)";
      }
      if (!problem.empty()) {
        peer->refused = Status(ErrorCode::refused, problem);
        TROUPE_LOG(warn, "event=connection_refused peer={} reason=\"{}\"", id, problem);
        (void)send_frame(*peer, wire::HelloReply{false, node_id_, address_, problem}, {});
        // Not closed here: the dialer may have pipelined frames behind its
        // hello, and closing a TCP socket with unread bytes sends a reset
        // that can destroy the reply before the dialer reads it (it then
        // sees a lost connection, not the reason). The dialer closes when it
        // reads the refusal; the heartbeat sweep closes one that does not.
        peer->last_recv_us = now_us();
        peer->refused_here = true;
        return;
      }
      // The reply is the first frame on the connection, before the peer is
      // findable by its address: from then on other threads may send on it
      // (a monitor, a message), and the dialer takes nothing before it.
      (void)send_frame(*peer, wire::HelloReply{true, node_id_, address_, ""}, {});
      peer->ready = true;
      peer->address = hello->listen_address;
      peer->node_id = hello->node_id;
      std::vector<transport::PeerId> superseded;
      {
        // Replies go back on this connection; sends to that node reuse it.
        std::lock_guard<std::mutex> lock(mu_);
        // An older connection dialed by the same node is dead to it, or it
        // would not have dialed again. Whatever of it is still unread here
        // must not be handed up after what comes on the new one: FIFO per
        // sender holds across a reconnect (at most once, as always).
        for (auto& [pid, p] : peers_) {
          if (p != peer && p->inbound && p->node_id == peer->node_id) superseded.push_back(pid);
        }
        if (!peer->address.empty()) {
          auto it = by_address_.find(peer->address);
          if (it == by_address_.end() || (it->second->inbound && it->second->node_id == peer->node_id)) {
            by_address_[peer->address] = peer;
          }
        }
      }
      for (transport::PeerId old : superseded) {
        TROUPE_LOG(info, "event=connection_superseded peer={} by={} node_id={:016x}", old, id, peer->node_id);
        transport_->close(old, "superseded: the node dialed again (what was still in flight on the old "
                               "connection is dropped, so that order holds)");
      }
      return;
    }
    const auto* reply = std::get_if<wire::HelloReply>(&frame.message);
    if (reply == nullptr) {
      transport_->close(id, std::string("protocol: expected hello_reply, got ") + wire::message_name(frame.message));
      return;
    }
    if (!reply->accepted) {
      peer->refused = Status(ErrorCode::refused, "connect: " + peer->address + " refused the connection: " + reply->error);
      TROUPE_LOG(err, "event=connection_refused_by_peer peer={} reason=\"{}\"", peer->address, reply->error);
      transport_->close(id, peer->refused.message());
      return;
    }
    peer->ready = true;
    return;
  }
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, wire::EnvelopeHeader>) {
          if (m.sequence != peer->expect_seq) {
            transport_->close(id, "protocol: envelope sequence " + std::to_string(m.sequence) + ", expected " +
                                      std::to_string(peer->expect_seq));
            return;
          }
          ++peer->expect_seq;
          on_envelope(peer, m, std::move(frame.payload));
        } else if constexpr (std::is_same_v<T, wire::Resolve>) {
          uint64_t found = 0;
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (auto it = names_.find(m.name); it != names_.end()) found = it->second;
          }
          if (found != 0 && !find_export(found)) found = 0;  // published, since stopped
          (void)send_frame(*peer, wire::Resolved{m.correlation, found, found ? "" : "no actor published as '" + m.name + "'"},
                           {});
        } else if constexpr (std::is_same_v<T, wire::Resolved>) {
          ReplyRef r;
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (auto it = resolves_.find(m.correlation); it != resolves_.end()) r = std::move(it->second.reply);
          }
          if (!r) return;
          auto* st = static_cast<FutureState<uint64_t>*>(r.get());
          if (m.id != 0) {
            st->complete(Result<uint64_t>(m.id));
          } else {
            st->complete(Result<uint64_t>(error(ErrorCode::not_found, "resolve: " + peer->address + ": " + m.error)));
          }
        } else if constexpr (std::is_same_v<T, wire::MonitorRequest>) {
          CellPtr cell = find_export(m.actor);
          if (!cell) {
            (void)send_frame(*peer, wire::DownNotice{m.actor, static_cast<uint8_t>(ExitReason::Kind::killed), "no such actor"},
                             {});
            return;
          }
          std::weak_ptr<Node> self = weak_from_this();
          transport::PeerId pid = id;
          uint64_t actor = m.actor;
          cell_of(cell.get())->attach_functor([self, pid, actor](const caf::error& e) {
            auto node = self.lock();
            if (!node) return;
            auto p = node->find_peer(pid);
            if (!p) return;
            ExitReason r = decode_reason(e);
            (void)node->send_frame(*p, wire::DownNotice{actor, static_cast<uint8_t>(r.kind), r.message}, {});
          });
        } else if constexpr (std::is_same_v<T, wire::DownNotice>) {
          caf::strong_actor_ptr proxy;
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (auto it = proxies_.find({peer->address, m.actor}); it != proxies_.end()) proxy = it->second.lock();
          }
          if (proxy) {
            ExitReason r{static_cast<ExitReason::Kind>(std::min<uint8_t>(m.reason_kind, 3)), m.reason};
            send_command(reinterpret_cast<CellControl*>(proxy.get()), Command{Command::Kind::remote_down, CellPtr(), r});
          }
        } else if constexpr (std::is_same_v<T, wire::RegionRequest>) {
          std::string error_text;
          std::string bytes;
          {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = regions_.find(m.region);
            if (it == regions_.end()) {
              error_text = "remote buffer: region " + std::to_string(m.region) + " on " + address_ +
                           " is not registered (deregistered, or its owner restarted)";
            } else if (m.offset > it->second.size || m.length > it->second.size - m.offset) {
              error_text = "remote buffer: bytes [" + std::to_string(m.offset) + ", " +
                           std::to_string(m.offset + m.length) + ") are outside the region of " +
                           std::to_string(it->second.size) + " bytes";
            } else if (m.write) {
              if (frame.payload.size() != m.length) {
                error_text = "remote buffer: write of " + std::to_string(m.length) + " bytes carried " +
                             std::to_string(frame.payload.size());
              } else if (Status s = cuda::copy(it->second.data + m.offset, frame.payload.data(), m.length);
                         !s.ok()) {
                error_text = s.message();
              }
            } else {
              bytes = detail::take_receive_buffer(m.length);  // written over whole: not zeroed
              if (Status s = cuda::copy(bytes.data(), it->second.data + m.offset, m.length); !s.ok()) {
                error_text = s.message();
                bytes.clear();
              }
            }
          }
          detail::give_receive_buffer(std::move(frame.payload));  // a write's bytes are in place now
          (void)send_frame(*peer, wire::RegionResponse{m.correlation, error_text}, std::move(bytes));
        } else if constexpr (std::is_same_v<T, wire::RegionResponse>) {
          PendingRegionOp op;
          {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = region_ops_.find(m.correlation);
            if (it == region_ops_.end()) return;  // timed out and forgotten
            op = std::move(it->second);
            region_ops_.erase(it);
          }
          auto* st = static_cast<ReplyTo<void>*>(op.reply.get());
          if (!m.error.empty()) {
            st->complete(Result<void>(error(ErrorCode::not_found, m.error)));
          } else if (op.dst != nullptr && frame.payload.size() != op.n) {
            st->complete(Result<void>(error(ErrorCode::malformed, "remote buffer: read of " + std::to_string(op.n) +
                                                                      " bytes got " + std::to_string(frame.payload.size()))));
          } else if (Status s = op.dst != nullptr && op.n != 0 ? cuda::copy(op.dst, frame.payload.data(), op.n)
                                                                : Status();
                     !s.ok()) {
            st->complete(Result<void>(error(std::move(s))));
          } else {
            st->complete(Result<void>());
          }
          detail::give_receive_buffer(std::move(frame.payload));  // a read's bytes are in place now
        } else if constexpr (std::is_same_v<T, wire::Goodbye>) {
          peer->leaving = true;
          transport_->close(id, "the peer left (" + m.reason + ")");
        } else if constexpr (std::is_same_v<T, wire::Heartbeat>) {
          // last_recv_us was updated above; nothing else to do
        } else {
          transport_->close(id, std::string("protocol: unexpected ") + wire::message_name(frame.message) + " frame");
        }
      },
      frame.message);
}

void Node::on_envelope(const std::shared_ptr<Peer>& peer, const wire::EnvelopeHeader& h, std::string payload) {
  // A payload large enough to hold a zero-copy Bytes field is kept in a
  // shared owner, so that such fields decode to slices of it; smaller ones
  // decode by copying (no allocation for the owner on the common path).
  // The last of the owner's holders gives its buffer back to the
  // transports for a later frame (receive_pool.h).
  std::shared_ptr<const std::string> owner;
  std::string_view bytes = payload;
  if (payload.size() >= Bytes::kZeroCopyMinBytes) {
    owner = std::shared_ptr<const std::string>(new std::string(std::move(payload)), [](const std::string* s) {
      detail::give_receive_buffer(std::move(*const_cast<std::string*>(s)));
      delete s;
    });
    bytes = *owner;
  }
  switch (h.kind) {
    case wire::EnvelopeKind::tell:
    case wire::EnvelopeKind::ask: {
      bool ask = h.kind == wire::EnvelopeKind::ask;
      auto refuse = [&](ErrorCode code, std::string why) {
        if (ask) {
          send_error(peer->id, h.correlation, Status(code, why));
        } else {
          TROUPE_LOG(warn, "event=tell_dropped from={} reason=\"{}\"", peer->address, why);
        }
      };
      const WireTypeEntry* type = find_wire_type(h.type_id);
      if (type == nullptr) {
        refuse(ErrorCode::unknown_message, "message type id " + std::to_string(h.type_id) +
                                               " is unknown in the receiving process (its build lacks that "
                                               "TROUPE_MESSAGE type)");
        return;
      }
      MessageBox box;
      std::string problem;
      bool decoded;
      {
        CodecScope scope(this);
        decoded = type->decode(bytes, owner, &box, &problem);
      }
      if (!decoded) {
        refuse(ErrorCode::malformed, "message " + type->name + " could not be decoded: " + problem);
        return;
      }
      CellPtr target = find_export(h.destination);
      if (!target) {
        refuse(ErrorCode::actor_dead, "no actor with id " + std::to_string(h.destination) + " on " + address_ +
                                          " (it stopped)");
        return;
      }
      ReplyRef reply;
      if (ask) reply = ReplyRef(new RemoteReply(weak_from_this(), peer->id, h.correlation));
      (void)send(target.get(), Envelope(std::move(box), nullptr, std::move(reply)));
      return;
    }
    case wire::EnvelopeKind::reply:
    case wire::EnvelopeKind::error: {
      ReplyRef r;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto it = peer->asks.find(h.correlation); it != peer->asks.end()) {
          r = std::move(it->second.reply);
          peer->asks.erase(it);
        }
      }
      if (!r) return;
      if (h.kind == wire::EnvelopeKind::reply) {
        CodecScope scope(this);
        r->complete_bytes(bytes, std::move(owner));  // `bytes` lives as long as complete_bytes reads it
      } else {
        auto code = static_cast<ErrorCode>(h.error_code);
        if (h.error_code == 0 || h.error_code > static_cast<uint8_t>(ErrorCode::storage)) code = ErrorCode::malformed;
        r->fail(Status(code, h.error_message));
      }
      return;
    }
  }
}

namespace {
constexpr size_t kFaultPoints = 3;
std::atomic<bool> fault_armed[kFaultPoints];
std::mutex fault_mu;
std::function<void(const std::string&)> fault_hooks[kFaultPoints];  // REQUIRES: fault_mu
}  // namespace

void faults::set(Point point, std::function<void(const std::string& address)> hook) {
  const auto i = static_cast<size_t>(point);
  std::lock_guard<std::mutex> lock(fault_mu);
  fault_armed[i].store(static_cast<bool>(hook), std::memory_order_relaxed);
  fault_hooks[i] = std::move(hook);
}

bool faults::armed(Point point) { return fault_armed[static_cast<size_t>(point)].load(std::memory_order_relaxed); }

void faults::reach(Point point, const std::string& address) {
  if (!armed(point)) return;
  std::function<void(const std::string&)> hook;
  {
    std::lock_guard<std::mutex> lock(fault_mu);
    hook = fault_hooks[static_cast<size_t>(point)];
  }
  if (hook) hook(address);
}

void Node::on_lost(transport::PeerId id, Status why) {
  if (faults::armed(faults::Point::before_peer_lost)) {
    std::string address;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = peers_.find(id); it != peers_.end()) address = it->second->address;
    }
    faults::reach(faults::Point::before_peer_lost, address);
  }
  std::shared_ptr<Peer> peer;
  std::vector<ReplyRef> resolves;
  std::vector<caf::strong_actor_ptr> proxies;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(id);
    if (it == peers_.end()) {
      // Lost before peer_for registered it (it checks this set).
      if (lost_early_.size() < 4096) lost_early_.insert(id);
      return;
    }
    peer = it->second;
    peers_.erase(it);
    if (auto a = by_address_.find(peer->address); a != by_address_.end() && a->second == peer) {
      // A refused peer stays known as refused, so callers get the reason.
      if (peer->refused.ok()) by_address_.erase(a);
    }
    for (auto r = resolves_.begin(); r != resolves_.end();) {
      if (r->second.address == peer->address && r->second.reply) {
        resolves.push_back(std::move(r->second.reply));
        r = resolves_.erase(r);
      } else {
        ++r;
      }
    }
    for (auto p = proxies_.begin(); p != proxies_.end();) {
      if (p->first.first == peer->address) {
        if (auto strong = p->second.lock()) proxies.push_back(strong);
        p = proxies_.erase(p);
      } else {
        ++p;
      }
    }
  }
  Status status = !peer->refused.ok()
                      ? peer->refused
                      : Status(ErrorCode::peer_lost, "lost the connection to " +
                                                         (peer->address.empty() ? std::string("peer") : peer->address) +
                                                         ": " + why.message());
  if (peer->leaving) {
    TROUPE_LOG(debug, "event=peer_left peer={} reason=\"{}\"", peer->address, why.message());
  } else if (peer->ready || !peer->refused.ok()) {
    TROUPE_LOG(warn, "event=peer_lost peer={} reason=\"{}\" pending_asks={} proxies={}", peer->address, why.message(),
               peer->asks.size(), proxies.size());
  }
  // Proxies know they are cut off before anyone hears of a failed ask, so
  // that a sender reacting to that failure does not try them again.
  for (auto& p : proxies) cell_of(reinterpret_cast<CellControl*>(p.get()))->mark_remote_lost();
  std::map<uint64_t, ReplyRef> asks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer->lost = status;
    for (auto it = peer->asks.begin(); it != peer->asks.end();) {
      if (it->second.sending) {
        ++it;  // its sender settles it once the transport has taken or refused its frame
        continue;
      }
      asks.emplace(it->first, std::move(it->second.reply));
      it = peer->asks.erase(it);
    }
  }
  for (auto& [corr, r] : asks) r->fail(status);
  for (auto& r : resolves) r->fail(status);
  std::vector<ReplyRef> region_ops;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = region_ops_.begin(); it != region_ops_.end();) {
      if (it->second.address == peer->address) {
        region_ops.push_back(std::move(it->second.reply));
        it = region_ops_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& r : region_ops) r->fail(status);
  for (auto& p : proxies) {
    send_command(reinterpret_cast<CellControl*>(p.get()),
                 Command{Command::Kind::remote_down, CellPtr(), ExitReason::killed(status.message())});
  }
  faults::reach(faults::Point::after_peer_lost, peer->address);
}

Result<RemoteBuffer> Node::register_region(void* data, size_t size) {
  if (data == nullptr && size != 0) return error(ErrorCode::invalid_argument, "register_buffer: null data");
  uint64_t id = next_region_.fetch_add(1);
  // One-sided access where the transport has it (UCX); else frames. Device
  // memory always goes by frames, staged through pinned host memory
  // (cuda_staging.h).
  transport::MemoryRegion mr;
  if (cuda::is_device(data)) {
    // no transport registration
  } else if (auto r = transport_->register_memory(data, size)) {
    mr = std::move(*r);
  } else if (r.error().code() != ErrorCode::unsupported) {
    return error(r.error());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    regions_[id] = Region{static_cast<std::byte*>(data), size, mr.id};
  }
  return RemoteBuffer(address_, id, size, mr.address, std::move(mr.remote_key), shared_from_this());
}

Result<std::pair<RemoteBuffer, void*>> Node::allocate_region(size_t size) {
  if (size == 0) return error(ErrorCode::invalid_argument, "allocate_buffer: size 0");
  uint64_t id = next_region_.fetch_add(1);
  transport::MemoryRegion mr;
  bool heap = false;
  if (auto r = transport_->allocate_memory(size)) {
    mr = std::move(*r);
  } else if (r.error().code() == ErrorCode::unsupported) {
    // No one-sided access (TCP): plain memory, served by frames.
    mr.data = std::malloc(size);
    if (mr.data == nullptr) {
      return error(ErrorCode::invalid_argument, "allocate_buffer: out of memory for " + std::to_string(size) +
                                                    " bytes");
    }
    heap = true;
  } else {
    return error(r.error());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    regions_[id] = Region{static_cast<std::byte*>(mr.data), size, mr.id, heap};
  }
  void* data = mr.data;
  return std::make_pair(RemoteBuffer(address_, id, size, mr.address, std::move(mr.remote_key), shared_from_this()),
                        data);
}

void Node::deregister_region(uint64_t region) {
  Region gone{};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(region);
    if (it == regions_.end()) return;
    gone = it->second;
    regions_.erase(it);
  }
  if (gone.transport_region != 0) transport_->deregister_memory(gone.transport_region);
  if (gone.heap_owned) std::free(gone.data);
}

void Node::region_op(const RemoteBuffer& buffer, void* ptr, size_t n, uint64_t offset, bool write, ReplyRef reply) {
  auto* state = static_cast<ReplyTo<void>*>(reply.get());
  auto fail = [&](ErrorCode code, std::string why) { state->complete(Result<void>(error(code, std::move(why)))); };
  if (offset > buffer.size() || n > buffer.size() - offset) {
    fail(ErrorCode::invalid_argument, "remote buffer: bytes [" + std::to_string(offset) + ", " +
                                          std::to_string(offset + n) + ") are outside the region of " +
                                          std::to_string(buffer.size()) + " bytes");
    return;
  }
  if (buffer.owner() == address_) {
    // Our own region: a local copy.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(buffer.region());
    if (it == regions_.end()) {
      fail(ErrorCode::not_found, "remote buffer: region " + std::to_string(buffer.region()) + " is not registered");
    } else {
      Status s = write ? cuda::copy(it->second.data + offset, ptr, n) : cuda::copy(ptr, it->second.data + offset, n);
      state->complete(s.ok() ? Result<void>() : Result<void>(error(std::move(s))));
    }
    return;
  }
  if (buffer.owner().empty()) {
    fail(ErrorCode::invalid_argument, "remote buffer: its owner does not listen (set RuntimeConfig::listen there)");
    return;
  }
  auto norm = normalize(buffer.owner(), transport_->scheme());
  Status why;
  auto peer = norm ? peer_for(*norm, &why) : nullptr;
  if (!peer) {
    fail(norm ? why.code() : ErrorCode::invalid_argument, norm ? why.message() : norm.error().message());
    return;
  }
  bool one_sided = false;
  if (!buffer.remote_key().empty() && n > 0 && !cuda::is_device(ptr)) {
    // Once the handshake is done the connection is wired up and the key
    // unpacks; before that, frames (queued until the handshake) serve.
    std::lock_guard<std::mutex> lock(mu_);
    one_sided = peer->ready;
  }
  if (one_sided) {
    transport_->rma(peer->id, write, ptr, n, buffer.address() + offset, buffer.remote_key(),
                    [reply](Status s) mutable {
                      auto* st = static_cast<ReplyTo<void>*>(reply.get());
                      st->complete(s.ok() ? Result<void>() : Result<void>(error(std::move(s))));
                    });
    return;
  }
  uint64_t corr = next_correlation_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    region_ops_[corr] = PendingRegionOp{reply, write ? nullptr : ptr, n, *norm};
  }
  std::string payload;
  if (write) {
    payload.resize(n);
    if (Status s = cuda::copy(payload.data(), ptr, n); !s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (region_ops_.erase(corr)) fail(s.code(), s.message());
      return;
    }
  }
  Status s = send_frame(*peer, wire::RegionRequest{corr, buffer.region(), offset, n, write}, std::move(payload));
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (region_ops_.erase(corr)) fail(s.code(), s.message());
  }
  return;
}

void Node::heartbeat_loop() {
  std::unique_lock<std::mutex> lock(hb_mu_);
  while (!stopping_) {
    hb_cv_.wait_for(lock, config_.heartbeat_interval / 2);
    if (stopping_) return;
    lock.unlock();
    std::vector<std::shared_ptr<Peer>> peers;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto& [id, p] : peers_) peers.push_back(p);
    }
    int64_t now = now_us();
    auto interval_us = std::chrono::duration_cast<std::chrono::microseconds>(config_.heartbeat_interval).count();
    auto dead_us = std::chrono::duration_cast<std::chrono::microseconds>(config_.dead_after).count();
    int64_t handling_since = handling_since_us_.load();
    bool stalled = handling_since != 0 && now - handling_since > interval_us;  // see handling_since_us_
    const auto linger_us = std::chrono::duration_cast<std::chrono::microseconds>(kRefusalLinger).count();
    for (auto& p : peers) {
      if (p->refused_here.load()) {
        // Refused by this node and left open for the dialer to read why.
        if (now - p->last_recv_us.load() > linger_us) {
          transport_->close(p->id, "refused (its hello was refused; the reason was logged and sent to it)");
        }
        continue;
      }
      // A large frame still arriving (one the transport sees no progress
      // of) holds the peer's heartbeats back: it has until then.
      if (!stalled && now - p->last_recv_us.load() > dead_us && now > transport_->arriving_until_us(p->id)) {
        transport_->close(p->id, "no frame for " + std::to_string(config_.dead_after.count()) +
                                     " ms (heartbeat timeout): the peer is hung or unreachable");
      } else if (p->ready && now - p->last_send_us.load() > interval_us) {
        (void)send_frame(*p, wire::Heartbeat{static_cast<uint64_t>(now)}, {});
      }
    }
    lock.lock();
  }
}

}  // namespace troupe::detail
