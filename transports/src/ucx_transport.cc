// UCX transport: UCP active messages for frames (the header travels as the
// AM header, the payload as its data, so UCX picks eager or rendezvous by
// size and large payloads are not copied on the way out), client-server
// endpoints with PEER error handling, and one progress thread that sleeps on
// the worker's wakeup fd when idle. Transports follow UCX_TLS as UCX users
// expect; shared memory keeps working with error handling on because
// UCX_MM_ERROR_HANDLING=y is set unless the user set it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <random>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bulk_copy.h"
#include "free_later.h"
#include "log.h"
#include "progress_gate.h"
#include "receive_pool.h"
#include "transport.h"

namespace troupe::transport {

namespace {

// How long a transport that stops waits for rendezvous receives on
// connections it closed to end (see Ep::receiving).
constexpr std::chrono::milliseconds kReceiveDrain{2000};
/// A rendezvous frame received whole keeps its peer's allowance until it is
/// handed up, and at least this long (microseconds) from then: the hand-up
/// comes after the progress call that ended the receive, normally within
/// microseconds.
constexpr int64_t kHandUpAllowance_us = 1'000'000;

int64_t steady_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Active message ids.
constexpr unsigned kDataAm = 7;   // a frame (no reply flag)
constexpr unsigned kHelloAm = 8;  // client -> server: its tag (reply flag)
constexpr unsigned kAckAm = 9;    // server -> client: both tags
constexpr unsigned kBatchAm = 10; // several small frames in one message

uint64_t random_tag() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  uint64_t t;
  do {
    t = rng();
  } while (t == 0);
  return t;
}

Status ucx_error(const std::string& what, ucs_status_t s) {
  return Status(ErrorCode::peer_lost, what + ": " + ucs_status_string(s));
}

class UcxTransport;

/// The transport whose ucp_worker_progress this thread is inside, if any:
/// its callbacks run under UCX's lock and must defer what takes locks.
thread_local const UcxTransport* tl_progressing = nullptr;

/// One endpoint. `mu` orders UCX calls on it against its close. Lock
/// order: never take `mu` while holding UCX's worker lock, which the
/// progress thread holds inside callbacks; so callbacks defer their sends
/// and closes until ucp_worker_progress returns.
struct Ep : std::enable_shared_from_this<Ep> {
  std::mutex mu;
  PeerId id = 0;
  ucp_ep_h handle = nullptr;
  bool closed = false;
  /// Tags route frames to connections without UCX's reply flag (see
  /// post()): each side picks a random tag for its end and tells the other,
  /// which stamps it on every frame. Random, so that one connection cannot
  /// pass its frames off as another's.
  uint64_t local_tag = 0;
  uint64_t remote_tag = 0;  // known once the transport hello is answered
  std::vector<OutFrame> waiting;  // frames sent before that
  /// A graceful close asked for while frames still waited for the tags: it
  /// happens once they are handed to UCX (a refusal must reach the peer).
  std::optional<Status> close_when_sent;
  /// Coalescing: while UCX still holds frames of this connection (the
  /// receiver's queue is full), small frames gather in `batch` and leave as
  /// one message when those complete. Frames go out one per message when
  /// nothing is in flight, so coalescing costs latency only under load.
  int in_flight = 0;
  size_t in_flight_bytes = 0;
  std::string batch;
  uint64_t batch_frames = 0;
  /// Unpacked remote keys of the peer's regions, by packed key. Kept for the
  /// connection's life: unpacking costs more than a small read.
  std::unordered_map<std::string, ucp_rkey_h> rkeys;
  /// Rendezvous receives UCX is still moving into our buffers. UCX 1.13
  /// asserts (and aborts the process) when an endpoint goes with one of
  /// these or of its sends (in_flight) still on it, so a close waits for
  /// them (`close_later`, with its force flag). Atomics: UCX callbacks,
  /// which run under UCX's lock, must not take `mu` (senders hold it across
  /// UCX calls).
  std::atomic<int> receiving{0};
  /// Rendezvous frames received whole and not yet handed up (on_frame):
  /// the receive has ended, but the layer above has not seen the frame, so
  /// the time until it does is no silence of the peer's.
  std::atomic<int> handing_up{0};
  /// While `receiving` or `handing_up`: until when the peer may be silent
  /// (see Transport::arriving_until_us), in steady-clock microseconds.
  std::atomic<int64_t> arriving_until_us{0};
  std::atomic<bool> close_later{false};
  bool close_later_force = false;  // under mu
  bool closed_in_ucx = false;      // under mu: ucp_ep_close_nbx was called
};

/// A one-sided operation in flight.
struct RmaOp {
  UcxTransport* self;
  RmaDone done;
};

// A frame travels as AM data only: payload, then the Cap'n Proto header,
// then the header's length (u64), then the receiver's connection tag (u64).
// No AM user header and no reply flag: UCX bounds AM headers to a few dozen
// bytes per worker, and with either one UCX 1.13's shared-memory transport
// takes a short-IOV path that loses messages over 100 bytes ("Invalid
// am_short_iov length"). Connections are told apart by tags exchanged in a
// tiny hello (which does use the reply flag, safely below that size). One
// contiguous buffer, because that path also takes no multi-part IOV.
// Appending to the payload usually fits its spare capacity; on the way in,
// trimming the tail leaves the payload in place, so a rendezvous receive
// copies nothing.
//
// Order: a large frame goes by rendezvous and lands after the small frames
// sent behind it, so frames of kRendezvousBytes and more are sent as
// rendezvous on purpose and carry the receiver's tag as their AM header (8
// bytes: well inside UCX's header bound, and never on the short path): the
// receiver learns the connection when the rendezvous is announced and holds
// that connection's later frames back until it has landed.
constexpr size_t kRendezvousBytes = 64 << 10;

struct SendRequest {
  std::string data;  // payload then header; kept alive until UCX is done
  uint64_t header_bytes = 0;
  uint64_t tag = 0;  // the AM header of rendezvous frames
  PeerId peer = 0;   // set for frames counted in the connection's in_flight
  std::shared_ptr<Ep> conn{};  // that connection (counted frames)
  UcxTransport* self = nullptr;
  /// Rendezvous frames: the payload stays in `data` untouched, its splices
  /// (large Bytes fields) where they lie, and the header, its length and
  /// the tag follow from `tail`: an IOV of the pieces, so that a large
  /// payload is never copied (the short path that loses IOV messages is an
  /// eager path; rendezvous never takes it).
  std::string tail{};
  std::vector<codec::Splice> splices{};
  std::vector<ucp_dt_iov_t> iov{};
  size_t bytes() const {
    size_t n = data.size() + tail.size();
    for (const codec::Splice& s : splices) n += s.bytes.size();
    return n;
  }
};

// A batch: per frame u64 payload bytes, u64 header bytes, payload, header;
// then u64 frame count and u64 receiver tag. Below kRendezvousBytes, so
// always eager.
constexpr size_t kBatchBytes = 32 << 10;

/// Whether UCX_TLS (unset: every transport) may load one of `transports`,
/// which `aliases` name all at once ("sm" for posix and sysv). A setting for
/// a transport that UCX does not load is reported by UCX as unused, on
/// standard output.
bool tls_may_use(std::initializer_list<std::string_view> aliases, std::initializer_list<std::string_view> transports) {
  const char* env = std::getenv("UCX_TLS");
  if (env == nullptr || *env == '\0') return true;
  std::string_view tls(env);
  const bool exclude = tls.front() == '^';
  if (exclude) tls.remove_prefix(1);
  auto in = [](std::initializer_list<std::string_view> names, std::string_view item) {
    return std::find(names.begin(), names.end(), item) != names.end();
  };
  size_t transports_listed = 0;
  bool alias_listed = false;
  while (!tls.empty()) {
    size_t comma = tls.find(',');
    std::string_view item = tls.substr(0, comma);
    tls = comma == std::string_view::npos ? std::string_view() : tls.substr(comma + 1);
    if (!exclude && item == "all") return true;
    alias_listed |= in(aliases, item);
    if (in(transports, item)) ++transports_listed;
  }
  if (exclude) return !alias_listed && transports_listed < transports.size();
  return alias_listed || transports_listed > 0;
}

/// A frame of a connection, in arrival order; rendezvous ones fill later.
/// A rendezvous frame's count in its connection's Ep::handing_up, given
/// back when this goes (once the frame was handed up, or dropped).
class HandUp {
 public:
  HandUp() = default;
  explicit HandUp(std::shared_ptr<Ep> ep) : ep_(std::move(ep)) {
    if (ep_) ep_->handing_up.fetch_add(1);
  }
  HandUp(HandUp&& o) noexcept = default;
  HandUp& operator=(HandUp&& o) noexcept {
    if (this != &o) {
      reset();
      ep_ = std::move(o.ep_);
    }
    return *this;
  }
  HandUp(const HandUp&) = delete;
  HandUp& operator=(const HandUp&) = delete;
  ~HandUp() { reset(); }
  void reset() {
    if (ep_) ep_->handing_up.fetch_sub(1);
    ep_.reset();
  }

 private:
  std::shared_ptr<Ep> ep_;
};

struct Arrival {
  bool ready = false;
  bool failed = false;
  std::string data;
  bool batch = false;  // a kBatchAm message (several frames)
  HandUp hand_up;      // a rendezvous frame received whole
};

/// A received frame waiting to be handed up after ucp_worker_progress.
struct DeferredFrame {
  PeerId peer;
  InFrame frame;
  HandUp hand_up;
};

struct RecvRequest {
  UcxTransport* self;
  PeerId peer;
  std::shared_ptr<Arrival> arrival;
  std::shared_ptr<Ep> ep;  // its connection, to close once its last receive is done
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(Events events, TransportLimits limits) : events_(std::move(events)), limits_(limits) {}

  Status init() {
    // Without it, UCX disables shared memory when error handling is on and
    // silently falls back to TCP loopback.
    if (tls_may_use({"sm", "shm", "mm"}, {"posix", "sysv"})) {
      setenv("UCX_MM_ERROR_HANDLING", "y", /*overwrite=*/0);
    }
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return ucx_error("ucx: reading the configuration (UCX_* variables)", s);
    // Without this, UCX gives a peer on this host extra lanes over TCP for
    // one-sided bandwidth (TCP's put), and an endpoint with a TCP lane turns
    // the TCP interface's progress on: one epoll_wait system call in every
    // ucp_worker_progress, most of a spinning thread's time on a VM (the
    // shared-memory round trip 18.5-19.3 -> 4.0-4.9 us on 2026-11-26's
    // machine, docs/transports.md).
    // Same-host reads map the owner's memory (rkey_ptr) or go through UCP's
    // emulation over the shared-memory lane; peers on other hosts still talk
    // over TCP, with one-sided operations emulated over active messages
    // there. Set in the context's configuration, not the environment, so
    // that child processes (ucx_perftest) see only the user's settings;
    // UCX_TCP_PUT_ENABLE, when set, wins.
    if (getenv("UCX_TCP_PUT_ENABLE") == nullptr && tls_may_use({}, {"tcp"})) {
      s = ucp_config_modify(config, "PUT_ENABLE", "n");  // TCP's; no other transport has the key
      if (s != UCS_OK) TROUPE_LOG(warn, "event=ucx_config key=TCP_PUT_ENABLE status=\"{}\"", ucs_status_string(s));
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1;
    s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) return ucx_error("ucx: ucp_init", s);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_MULTI;  // senders write from their own threads
    s = ucp_worker_create(context_, &wp, &worker_);
    if (s != UCS_OK) return ucx_error("ucx: ucp_worker_create", s);
    ucp_am_handler_param_t ap{};
    ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                    UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    ap.id = kDataAm;
    ap.cb = &UcxTransport::on_am;
    ap.arg = this;
    ap.flags = UCP_AM_FLAG_WHOLE_MSG;
    s = ucp_worker_set_am_recv_handler(worker_, &ap);
    if (s != UCS_OK) return ucx_error("ucx: registering the message handler", s);
    ap.id = kBatchAm;
    ap.cb = &UcxTransport::on_batch;
    s = ucp_worker_set_am_recv_handler(worker_, &ap);
    if (s != UCS_OK) return ucx_error("ucx: registering the batch handler", s);
    ap.id = kHelloAm;
    ap.cb = &UcxTransport::on_hello;
    s = ucp_worker_set_am_recv_handler(worker_, &ap);
    if (s != UCS_OK) return ucx_error("ucx: registering the hello handler", s);
    ap.id = kAckAm;
    ap.cb = &UcxTransport::on_ack;
    s = ucp_worker_set_am_recv_handler(worker_, &ap);
    if (s != UCS_OK) return ucx_error("ucx: registering the ack handler", s);
    s = ucp_worker_get_efd(worker_, &efd_);
    if (s != UCS_OK) return ucx_error("ucx: ucp_worker_get_efd", s);
    thread_ = std::thread([this] { loop(); });
    return {};
  }

  ~UcxTransport() override { stop(); }

  const char* scheme() const override { return "ucx"; }

  int64_t arriving_until_us(PeerId peer) override {
    auto ep = find(peer);
    return ep && (ep->receiving.load() > 0 || ep->handing_up.load() > 0) ? ep->arriving_until_us.load() : 0;
  }

  Result<std::string> listen(const Endpoint& at) override {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(at.port);
    if (at.host.empty() || at.host == "0.0.0.0") {
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
    } else if (inet_pton(AF_INET, at.host.c_str(), &addr.sin_addr) != 1) {
      return error(ErrorCode::invalid_argument, "listen: '" + at.host + "' is not an IPv4 address");
    }
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    lp.sockaddr.addrlen = sizeof(addr);
    lp.conn_handler.cb = &UcxTransport::on_conn_request;
    lp.conn_handler.arg = this;
    // Not under mu_: UCX takes its own lock here, and its callbacks take mu_.
    ucp_listener_h listener = nullptr;
    ucs_status_t s = ucp_listener_create(worker_, &lp, &listener);
    if (s != UCS_OK) {
      return error(ErrorCode::invalid_argument, "listen: cannot listen on " + at.to_uri() + ": " +
                                                    ucs_status_string(s) + " (is the port in use?)");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      listener_ = listener;
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    ucp_listener_query(listener, &attr);
    auto* bound = reinterpret_cast<const sockaddr_in*>(&attr.sockaddr);
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &bound->sin_addr, host, sizeof(host));
    Endpoint actual{"ucx", at.host.empty() || at.host == "0.0.0.0" ? std::string(host) : at.host,
                    ntohs(bound->sin_port)};
    return actual.to_uri();
  }

  Result<PeerId> connect(const Endpoint& to) override {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(to.port);
    if (inet_pton(AF_INET, to.host.c_str(), &addr.sin_addr) != 1) {
      return error(ErrorCode::invalid_argument, "connect: '" + to.host + "' is not an IPv4 address");
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    ep.sockaddr.addrlen = sizeof(addr);
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxTransport::on_ep_error;
    ep.err_handler.arg = this;
    ucp_ep_h handle = nullptr;
    ucs_status_t s = ucp_ep_create(worker_, &ep, &handle);
    if (s != UCS_OK) return error(ucx_error("connect: " + to.to_uri(), s));
    PeerId id = add(handle);
    if (in_progress_thread()) {
      deferred_hellos_.push_back(id);
    } else {
      send_hello(id);
      ucp_worker_signal(worker_);
    }
    return id;
  }

  Status send(PeerId peer, OutFrame frame) override {
    if (frame.header.size() > limits_.frame.max_header_bytes ||
        frame.payload_bytes() > limits_.frame.max_payload_bytes) {
      return Status(ErrorCode::invalid_argument, "send: frame of " + std::to_string(frame.payload_bytes()) +
                                                     " payload bytes exceeds max_frame_bytes (" +
                                                     std::to_string(limits_.frame.max_payload_bytes) + ")");
    }
    if (in_progress_thread()) {
      // Inside a UCX callback: send once progress returns (lock order).
      deferred_sends_.emplace_back(peer, std::move(frame));
      return {};
    }
    std::shared_ptr<Ep> ep = find(peer);
    if (!ep) return Status(ErrorCode::peer_lost, "send: connection " + std::to_string(peer) + " is closed");
    return post(*ep, std::move(frame));
  }

  /// Hands a frame to UCX, or queues it until the connection's tags are
  /// known. Not on the progress thread inside callbacks.
  Status post(Ep& ep, OutFrame frame) {
    std::lock_guard<std::mutex> lock(ep.mu);
    if (ep.closed) return Status(ErrorCode::peer_lost, "send: the connection is closed");
    if (ep.remote_tag == 0) {
      ep.waiting.push_back(std::move(frame));
      return {};
    }
    return post_locked(ep, std::move(frame));
  }

  /// REQUIRES: ep.mu held, remote tag known.
  Status post_locked(Ep& ep, OutFrame frame) {
    size_t payload_bytes = frame.payload_bytes();
    size_t bytes = payload_bytes + frame.header.size() + 16;
    // Splices are worth a gather list only in a rendezvous frame; a smaller
    // frame takes them into its one buffer.
    if (bytes < kRendezvousBytes) frame.flatten();
    if (ep.in_flight_bytes + ep.batch.size() + bytes > limits_.max_send_queue_bytes && ep.in_flight > 0) {
      return Status(ErrorCode::mailbox_full, "send: " + std::to_string(ep.in_flight_bytes + ep.batch.size()) +
                                                 " bytes to peer " + std::to_string(ep.id) +
                                                 " are still queued; the peer is slow or stuck");
    }
    if (ep.in_flight > 0 && bytes < kBatchBytes) {
      if (ep.batch.size() + bytes > kBatchBytes) {
        if (Status s = flush_batch_locked(ep); !s.ok()) return s;
      }
      uint64_t lengths[2] = {frame.payload.size(), frame.header.size()};
      ep.batch.append(reinterpret_cast<const char*>(lengths), sizeof(lengths));
      ep.batch.append(frame.payload);
      ep.batch.append(frame.header);
      ++ep.batch_frames;
      return {};
    }
    if (Status s = flush_batch_locked(ep); !s.ok()) return s;  // what gathered goes first
    auto* req = new SendRequest{std::move(frame.payload), frame.header.size()};
    req->splices = std::move(frame.splices);
    req->peer = ep.id;
    // Large frames: payload untouched, the rest in `tail` (no copy under
    // this lock, which heartbeats and other senders wait on).
    bool rendezvous = bytes >= kRendezvousBytes;
    std::string& rest = rendezvous ? req->tail : req->data;
    rest.append(frame.header);
    rest.append(reinterpret_cast<const char*>(&req->header_bytes), sizeof(req->header_bytes));
    rest.append(reinterpret_cast<const char*>(&ep.remote_tag), sizeof(ep.remote_tag));
    if (rendezvous) {
      req->tag = ep.remote_tag;
      return send_raw(&ep, ep.handle, kDataAm, req, UCP_AM_SEND_FLAG_RNDV, /*with_tag_header=*/true);
    }
    return send_raw(&ep, ep.handle, kDataAm, req, UCP_AM_SEND_FLAG_EAGER);
  }

  /// Sends what gathered in the connection's batch, as one message.
  /// REQUIRES: ep.mu held.
  Status flush_batch_locked(Ep& ep) {
    if (ep.batch_frames == 0) return {};
    auto* req = new SendRequest{std::move(ep.batch), 0};
    req->data.append(reinterpret_cast<const char*>(&ep.batch_frames), sizeof(ep.batch_frames));
    req->data.append(reinterpret_cast<const char*>(&ep.remote_tag), sizeof(ep.remote_tag));
    req->peer = ep.id;
    ep.batch = std::string();
    ep.batch_frames = 0;
    return send_raw(&ep, ep.handle, kBatchAm, req, UCP_AM_SEND_FLAG_EAGER);
  }

  /// Sends req->data as an active message; takes ownership of `req`. With
  /// `ep` (whose mu is held), a message UCX keeps counts as in flight.
  Status send_raw(Ep* ep, ucp_ep_h handle, unsigned am, SendRequest* req, uint32_t flags,
                  bool with_tag_header = false) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = flags;
    p.cb.send = [](void* request, ucs_status_t, void* user_data) {
      auto* req = static_cast<SendRequest*>(user_data);
      // Inside progress, under UCX's lock: the connection's books (its
      // mutex) are settled after progress returns.
      if (req->conn) req->self->deferred_sent_.emplace_back(std::move(req->conn), req->bytes());
      // A large frame's buffers are freed off this thread: unmapping them
      // could hold every connection's progress (see free_later.h).
      if (req->bytes() >= detail::kFreeLaterMinBytes) {
        detail::delete_later(req);
      } else {
        delete req;
      }
      ucp_request_free(request);
    };
    p.user_data = req;
    req->self = this;
    size_t bytes = req->bytes();
    bool counted = ep != nullptr && req->peer != 0;
    // Once UCX has it, the request belongs to whichever thread completes it:
    // everything its callback reads is set now.
    if (counted) {
      req->conn = ep->shared_from_this();
    } else {
      req->peer = 0;
    }
    const void* buffer = req->data.data();
    size_t count = req->data.size();
    if (!req->tail.empty()) {
      codec::for_each_piece(req->data, req->splices,
                            [&](const char* d, size_t n) { req->iov.push_back({const_cast<char*>(d), n}); });
      req->iov.push_back({req->tail.data(), req->tail.size()});
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
      p.datatype = ucp_dt_make_iov();
      buffer = req->iov.data();
      count = req->iov.size();
    }
    ucs_status_ptr_t r = ucp_am_send_nbx(handle, am, with_tag_header ? &req->tag : nullptr,
                                         with_tag_header ? sizeof(req->tag) : 0, buffer, count, &p);
    if (UCS_PTR_IS_ERR(r)) {
      delete req;
      return ucx_error("send", UCS_PTR_STATUS(r));
    }
    if (r == nullptr) {
      delete req;  // done at once (eager): nobody needs waking
      return {};
    }
    if (counted) {
      // Under ep->mu, which sent() takes too: counted before it is uncounted.
      ++ep->in_flight;
      ep->in_flight_bytes += bytes;
    }
    if (tl_progressing != this) ucp_worker_signal(worker_);  // in flight: whoever sleeps must progress it
    return {};
  }

  /// A counted message of `peer` completed: when none is left in flight,
  /// what gathered meanwhile goes out.
  void sent(const std::shared_ptr<Ep>& ep, size_t bytes) {
    std::lock_guard<std::mutex> lock(ep->mu);
    if (ep->in_flight == 0) return;
    --ep->in_flight;
    ep->in_flight_bytes -= std::min(ep->in_flight_bytes, bytes);
    if (ep->closed) {
      if (ep->in_flight == 0) close_when_idle_locked(*ep);
      return;
    }
    if (ep->in_flight == 0) (void)flush_batch_locked(*ep);
  }

  /// Client side of the transport hello: our tag, with the reply flag so
  /// that the server learns which endpoint it came from.
  void send_hello(PeerId peer) {
    auto ep = find(peer);
    if (!ep) return;
    std::lock_guard<std::mutex> lock(ep->mu);
    if (ep->closed) return;
    auto* req = new SendRequest{std::string(reinterpret_cast<const char*>(&ep->local_tag), sizeof(uint64_t)), 0};
    (void)send_raw(nullptr, ep->handle, kHelloAm, req, UCP_AM_SEND_FLAG_REPLY);
  }

  /// Both sides: the peer's tag is known; send what waited.
  void set_remote_tag(PeerId peer, uint64_t tag, bool answer) {
    auto ep = find(peer);
    if (!ep) return;
    std::lock_guard<std::mutex> lock(ep->mu);
    if (ep->closed || ep->remote_tag != 0) return;
    ep->remote_tag = tag;
    if (answer) {
      std::string ack(16, '\0');
      std::memcpy(ack.data(), &tag, 8);
      std::memcpy(ack.data() + 8, &ep->local_tag, 8);
      (void)send_raw(nullptr, ep->handle, kAckAm, new SendRequest{std::move(ack), 0}, 0);
    }
    for (auto& f : ep->waiting) (void)post_locked(*ep, std::move(f));
    ep->waiting.clear();
    if (ep->close_when_sent) {
      (void)flush_batch_locked(*ep);
      // On the progress thread (a callback): the drop runs after it.
      deferred_drops_.push_back({peer, std::move(*ep->close_when_sent), false});
      ep->close_when_sent.reset();
    }
  }

  void close(PeerId peer, std::string why) override {
    if (in_progress_thread()) {
      deferred_drops_.push_back({peer, Status(ErrorCode::peer_lost, std::move(why)), false});
      return;
    }
    drop(peer, Status(ErrorCode::peer_lost, std::move(why)));
  }

  Result<MemoryRegion> register_memory(void* data, size_t size) override {
    if (size == 0) return MemoryRegion{0, reinterpret_cast<uint64_t>(data), {}, data};
    return map_memory(data, size);
  }

  Result<MemoryRegion> allocate_memory(size_t size) override {
    if (size == 0) return error(ErrorCode::invalid_argument, "allocate_buffer: size 0");
    return map_memory(nullptr, size);
  }

  /// Registers `data` (or, when null, has UCX allocate: shared memory that a
  /// peer on this host maps directly) and packs its remote key.
  Result<MemoryRegion> map_memory(void* data, size_t size) {
    const char* what = data ? "register_buffer" : "allocate_buffer";
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = data;
    mp.length = size;
    mp.flags = data ? 0 : UCP_MEM_MAP_ALLOCATE;
    ucp_mem_h memh = nullptr;
    ucs_status_t s = ucp_mem_map(context_, &mp, &memh);
    if (s != UCS_OK) {
      return error(ErrorCode::invalid_argument, std::string(what) + ": ucx cannot map " + std::to_string(size) +
                                                    " bytes: " + ucs_status_string(s));
    }
    if (!data) {
      ucp_mem_attr_t attr{};
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
      if ((s = ucp_mem_query(memh, &attr)) != UCS_OK) {
        ucp_mem_unmap(context_, memh);
        return error(ErrorCode::invalid_argument, std::string(what) + ": ucp_mem_query: " + ucs_status_string(s));
      }
      data = attr.address;
    }
    void* packed = nullptr;
    size_t packed_bytes = 0;
    s = ucp_rkey_pack(context_, memh, &packed, &packed_bytes);
    if (s != UCS_OK) {
      ucp_mem_unmap(context_, memh);
      return error(ErrorCode::invalid_argument, std::string(what) + ": ucx cannot pack a remote key: " +
                                                    ucs_status_string(s));
    }
    MemoryRegion region{0, reinterpret_cast<uint64_t>(data), std::string(static_cast<char*>(packed), packed_bytes),
                        data};
    ucp_rkey_buffer_release(packed);
    std::lock_guard<std::mutex> lock(mu_);
    region.id = next_region_++;
    memory_[region.id] = memh;
    return region;
  }

  void deregister_memory(uint64_t id) override {
    ucp_mem_h memh = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = memory_.find(id);
      if (it == memory_.end()) return;
      memh = it->second;
      memory_.erase(it);
    }
    ucp_mem_unmap(context_, memh);
  }

  void rma(PeerId peer, bool write, void* local, size_t n, uint64_t remote_address, const std::string& remote_key,
           RmaDone done) override {
    Status failed = rma_start(peer, write, local, n, remote_address, remote_key, done);
    if (!failed.ok()) done(std::move(failed));
  }

  /// Starts an operation; `done` is kept (and called) only when it returns ok.
  Status rma_start(PeerId peer, bool write, void* local, size_t n, uint64_t remote_address,
                   const std::string& remote_key, RmaDone& done) {
    std::shared_ptr<Ep> ep = find(peer);
    if (!ep) return Status(ErrorCode::peer_lost, "remote buffer: connection " + std::to_string(peer) + " is closed");
    std::unique_lock<std::mutex> lock(ep->mu);
    if (ep->closed) return Status(ErrorCode::peer_lost, "remote buffer: the connection is closed");
    ucp_rkey_h rkey = nullptr;
    if (auto it = ep->rkeys.find(remote_key); it != ep->rkeys.end()) {
      rkey = it->second;
    } else {
      ucs_status_t s = ucp_ep_rkey_unpack(ep->handle, remote_key.data(), &rkey);
      if (s != UCS_OK) {
        return Status(ErrorCode::malformed, std::string("remote buffer: the region's remote key does not unpack: ") +
                                                ucs_status_string(s));
      }
      ep->rkeys.emplace(remote_key, rkey);
    }
    void* mapped = nullptr;
    if (ucp_rkey_ptr(rkey, remote_address, &mapped) == UCS_OK) {
      // The region is in shared memory this process has mapped (a peer on
      // this host that allocated it through UCX): copy here, with streaming
      // stores, rather than through UCX's get, which copies in fragments on
      // the progress thread (half the bandwidth, and the thread that carries
      // every message and heartbeat busy for the whole read).
      direct_copy(*ep, lock, write, local, static_cast<char*>(mapped), n, done);
      return {};
    }
    auto* op = new RmaOp{this, std::move(done)};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = [](void* request, ucs_status_t status, void* user_data) {
      auto* op = static_cast<RmaOp*>(user_data);
      // Inside progress, under UCX's lock: completions run after it returns.
      op->self->deferred_rma_.emplace_back(std::move(op->done),
                                           status == UCS_OK ? Status() : ucx_error("remote buffer", status));
      delete op;
      ucp_request_free(request);
    };
    p.user_data = op;
    ucs_status_ptr_t r;
    if (write) {
      // A put completes locally; the flush after it completes once the
      // bytes are in the peer's memory, which is what a writer waits for.
      ucp_request_param_t plain{};
      ucs_status_ptr_t put = ucp_put_nbx(ep->handle, local, n, remote_address, rkey, &plain);
      if (UCS_PTR_IS_ERR(put)) {
        done = std::move(op->done);
        delete op;
        return ucx_error("remote buffer: put", UCS_PTR_STATUS(put));
      }
      if (put != nullptr) ucp_request_free(put);  // UCX finishes it; the flush covers it
      r = ucp_ep_flush_nbx(ep->handle, &p);
    } else {
      r = ucp_get_nbx(ep->handle, local, n, remote_address, rkey, &p);
    }
    if (UCS_PTR_IS_ERR(r)) {
      done = std::move(op->done);
      delete op;
      return ucx_error(write ? "remote buffer: flush" : "remote buffer: get", UCS_PTR_STATUS(r));
    }
    if (r == nullptr) {
      // Done at once; report outside the endpoint's lock.
      RmaDone d = std::move(op->done);
      delete op;
      d(Status());
      return {};
    }
    if (tl_progressing != this) ucp_worker_signal(worker_);
    return {};
  }

  /// Copies to or from `mapped`, a peer's region mapped here, in slices:
  /// the mapping lives as long as the connection's remote key, which drop()
  /// destroys under `ep.mu`, so each slice is copied under it and the lock
  /// is let go between slices (sends on the connection wait one slice at
  /// most). Calls `done` on this thread. REQUIRES: `lock` holds `ep.mu`.
  static void direct_copy(Ep& ep, std::unique_lock<std::mutex>& lock, bool write, void* local, char* mapped, size_t n,
                          RmaDone& done) {
    constexpr size_t kSliceBytes = size_t{16} << 20;  // ~1.5 ms at 12 GB/s
    auto* here = static_cast<char*>(local);
    for (size_t off = 0; off < n; off += kSliceBytes) {
      if (!lock.owns_lock()) lock.lock();
      if (ep.closed) {
        lock.unlock();
        return done(Status(ErrorCode::peer_lost, "remote buffer: the connection closed during the copy"));
      }
      const size_t len = std::min(kSliceBytes, n - off);
      if (write) {
        detail::bulk_copy(mapped + off, here + off, len);
      } else {
        detail::bulk_copy(here + off, mapped + off, len);
      }
      lock.unlock();
    }
    if (lock.owns_lock()) lock.unlock();
    done(Status());
  }

  bool poll() override {
    if (stopping_.load(std::memory_order_relaxed)) return false;
    return gate_.try_poll([this] { return progress_locked(); });
  }

  void spin(bool on, bool idle) override { gate_.spin(on, idle); }

  void stop() override {
    if (stopping_.exchange(true)) return;
    gate_.stop();
    if (worker_) ucp_worker_signal(worker_);
    if (thread_.joinable()) thread_.join();
    // Pollers have been detached by now (the runtime does so before it
    // stops its node); the token guards against a straggler.
    std::lock_guard<std::mutex> token(gate_.token());
    std::vector<PeerId> peers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, ep] : eps_) peers.push_back(id);
    }
    for (PeerId p : peers) drop(p, Status(ErrorCode::peer_lost, "transport stopped"), /*force=*/true);
    ucp_listener_h listener = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);  // only to take the handle: callbacks below take mu_
      listener = std::exchange(listener_, nullptr);
    }
    if (listener) ucp_listener_destroy(listener);
    if (worker_) {
      // Let forced closes finish before the worker goes; operations still
      // in flight fail now, not by their timeouts.
      tl_progressing = this;
      for (int i = 0; i < 1000 && ucp_worker_progress(worker_) != 0; ++i) {
      }
      tl_progressing = nullptr;
      run_deferred();
      // Endpoints closed during a rendezvous receive go once it ends: give
      // the peers' ends (or deaths) a moment to end them.
      const auto deadline = std::chrono::steady_clock::now() + kReceiveDrain;
      while (receiving_on_closed() && std::chrono::steady_clock::now() < deadline) {
        tl_progressing = this;
        ucp_worker_progress(worker_);
        tl_progressing = nullptr;
        run_deferred();
      }
      if (receiving_on_closed()) {
        // UCX 1.13 would abort the process destroying such an endpoint (see
        // Ep::receiving): the worker and context stay, a leak at shutdown.
        TROUPE_LOG(warn,
                   "event=ucx_worker_kept reason=\"a closed connection's rendezvous receive did not end within "
                   "{} ms; UCX cannot destroy its endpoint\"",
                   kReceiveDrain.count());
        worker_ = nullptr;
        context_ = nullptr;
        return;
      }
      ucp_worker_destroy(worker_);
    }
    std::unordered_map<uint64_t, ucp_mem_h> memory;
    {
      std::lock_guard<std::mutex> lock(mu_);
      memory.swap(memory_);
    }
    for (auto& [id, memh] : memory) ucp_mem_unmap(context_, memh);
    worker_ = nullptr;
    if (context_) ucp_cleanup(context_);
    context_ = nullptr;
  }

 private:
  bool in_progress_thread() const { return tl_progressing == this; }

  /// Progresses until UCX is quiet, then does what callbacks deferred.
  /// REQUIRES: the gate's token.
  bool progress_locked() {
    bool any = false;
    tl_progressing = this;
    while (ucp_worker_progress(worker_) != 0) any = true;
    tl_progressing = nullptr;
    return run_deferred() || any;
  }

  void loop() {
    while (!stopping_.load()) {
      gate_.wait_for_turn();  // while idle scheduler threads poll, stay out of their way
      if (stopping_.load()) break;
      ucs_status_t s;
      {
        std::lock_guard<std::mutex> token(gate_.token());
        progress_locked();
        s = ucp_worker_arm(worker_);
      }
      if (s == UCS_ERR_BUSY) continue;  // more events arrived: progress again
      pollfd p{efd_, POLLIN, 0};
      ::poll(&p, 1, 1000);  // sleeps until UCX or ucp_worker_signal wakes it
    }
  }

  /// Everything UCX callbacks could not do under UCX's lock, in order:
  /// new connections, tags, received frames, sends, closes. True when there
  /// was any.
  bool run_deferred() {
    bool any = false;
    while (!deferred_sends_.empty() || !deferred_drops_.empty() || !deferred_hellos_.empty() ||
           !deferred_tags_.empty() || !deferred_frames_.empty() || !deferred_connected_.empty() ||
           !deferred_rma_.empty() || !deferred_activity_.empty() || !deferred_sent_.empty() ||
           !deferred_closes_.empty()) {
      any = true;
      auto connected = std::move(deferred_connected_);
      deferred_connected_.clear();
      for (PeerId p : connected) {
        if (events_.on_connected) events_.on_connected(p, true);
      }
      auto hellos = std::move(deferred_hellos_);
      deferred_hellos_.clear();
      for (PeerId p : hellos) send_hello(p);
      auto tags = std::move(deferred_tags_);
      deferred_tags_.clear();
      for (auto& t : tags) set_remote_tag(t.peer, t.tag, t.answer);
      auto frames = std::move(deferred_frames_);
      deferred_frames_.clear();
      for (auto& f : frames) {
        if (events_.on_frame) events_.on_frame(f.peer, std::move(f.frame));
        f.hand_up.reset();  // seen by the layer above: no more allowance for it
      }
      auto activity = std::move(deferred_activity_);
      deferred_activity_.clear();
      for (PeerId p : activity) events_.on_activity(p);
      auto rma_done = std::move(deferred_rma_);
      deferred_rma_.clear();
      for (auto& [done, status] : rma_done) done(std::move(status));
      auto sent_ = std::move(deferred_sent_);
      deferred_sent_.clear();
      for (auto& [ep, bytes] : sent_) sent(ep, bytes);
      auto sends = std::move(deferred_sends_);
      deferred_sends_.clear();
      for (auto& [peer, frame] : sends) {
        if (auto ep = find(peer)) (void)post(*ep, std::move(frame));
      }
      auto drops = std::move(deferred_drops_);
      deferred_drops_.clear();
      for (auto& d : drops) drop(d.peer, std::move(d.why), d.force);
      auto closes = std::move(deferred_closes_);
      deferred_closes_.clear();
      for (auto& ep : closes) {
        std::lock_guard<std::mutex> lock(ep->mu);
        close_when_idle_locked(*ep);
      }
    }
    return any;
  }

  PeerId add(ucp_ep_h handle) {
    auto ep = std::make_shared<Ep>();
    ep->handle = handle;
    ep->local_tag = random_tag();
    std::lock_guard<std::mutex> lock(mu_);
    PeerId id = next_id_++;
    ep->id = id;
    eps_[id] = ep;
    by_ep_[handle] = id;
    by_tag_[ep->local_tag] = id;
    return id;
  }

  PeerId peer_of_tag(uint64_t tag) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_tag_.find(tag);
    return it == by_tag_.end() ? 0 : it->second;
  }

  std::shared_ptr<Ep> find(PeerId id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = eps_.find(id);
    return it == eps_.end() ? nullptr : it->second;
  }

  /// Closes an endpoint and reports the peer lost (once). Not inside
  /// callbacks. `force` for endpoints UCX reported failed; otherwise what
  /// was sent (a refusal, a goodbye) is flushed first.
  void drop(PeerId peer, Status why, bool force = false) {
    std::shared_ptr<Ep> ep;
    if (!force) {
      // A graceful close delivers what was sent before it (UCX's flush
      // mode): frames still waiting for the connection's tags delay it until
      // they can go (a refusal must reach the peer), and a gathered batch
      // goes now.
      if (auto e = find(peer)) {
        std::lock_guard<std::mutex> lock(e->mu);
        if (!e->closed && e->remote_tag == 0 && !e->waiting.empty()) {
          e->close_when_sent = std::move(why);
          return;
        }
        if (!e->closed && e->remote_tag != 0) (void)flush_batch_locked(*e);
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = eps_.find(peer);
      if (it == eps_.end()) return;
      ep = it->second;
      eps_.erase(it);
      by_ep_.erase(ep->handle);
      by_tag_.erase(ep->local_tag);
    }
    {
      std::lock_guard<std::mutex> lock(ep->mu);
      ep->closed = true;
      for (auto& [packed, rkey] : ep->rkeys) ucp_rkey_destroy(rkey);
      ep->rkeys.clear();
      // seq_cst with finish_recv's decrement: one of the two sees the other.
      ep->close_later.store(true);
      if (ep->receiving.load() > 0 || ep->in_flight > 0) {
        // The connection is gone for everyone above; UCX's endpoint goes
        // once its receives and sends end (the peer finishes, or its death
        // fails them).
        ep->close_later_force = force;
        std::lock_guard<std::mutex> maps(mu_);  // order: ep->mu, then mu_ (receiving_on_closed takes them so too)
        closing_.push_back(ep);
        TROUPE_LOG(debug, "event=close_deferred transport=ucx peer={} receives={} sends={}", peer, ep->receiving.load(),
                   ep->in_flight);
      } else {
        ep->closed_in_ucx = true;
        close_handle(*ep, force);
      }
    }
    TROUPE_LOG(debug, "event=connection_closed transport=ucx peer={} reason=\"{}\"", peer, why.message());
    if (events_.on_lost) events_.on_lost(peer, std::move(why));
  }

  PeerId peer_of(ucp_ep_h ep) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_ep_.find(ep);
    return it == by_ep_.end() ? 0 : it->second;
  }

  static void on_conn_request(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<UcxTransport*>(arg);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.conn_request = request;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxTransport::on_ep_error;
    ep.err_handler.arg = self;
    ucp_ep_h handle = nullptr;
    ucs_status_t s = ucp_ep_create(self->worker_, &ep, &handle);
    if (s != UCS_OK) {
      TROUPE_LOG(warn, "event=accept_failed transport=ucx error=\"{}\"", ucs_status_string(s));
      return;
    }
    PeerId id = self->add(handle);
    self->deferred_connected_.push_back(id);  // reported after progress returns
  }

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* self = static_cast<UcxTransport*>(arg);
    PeerId id = self->peer_of(ep);
    if (id != 0) self->deferred_drops_.push_back({id, ucx_error("connection lost", status), true});
  }

  static ucs_status_t on_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                            const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxTransport*>(arg);
    constexpr size_t kTrailer = 2 * sizeof(uint64_t);  // header length, receiver tag
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    // Frames that cannot be ours, or that no limit allows, are dropped unread.
    if (header_length != (rndv ? sizeof(uint64_t) : 0) || length < kTrailer ||
        length > self->limits_.frame.max_payload_bytes + self->limits_.frame.max_header_bytes + kTrailer) {
      TROUPE_LOG(warn, "event=bad_frame transport=ucx bytes={} reason=\"not a troupe frame or over the limits\"", length);
      return UCS_OK;
    }
    if (rndv) {
      // Rendezvous: UCX moves the whole frame straight into our buffer.
      // The header names the connection now, so that its later frames wait
      // for this one (see kRendezvousBytes).
      uint64_t tag = 0;
      std::memcpy(&tag, header, sizeof(tag));
      PeerId peer = self->peer_of_tag(tag);
      if (peer == 0) return UCS_OK;  // its connection is gone: dropped unread
      // The announcement is a sign of life; the data may take a while.
      if (self->events_.on_activity) self->deferred_activity_.push_back(peer);
      std::shared_ptr<Ep> ep = self->find(peer);
      if (!ep) return UCS_OK;
      ep->receiving.fetch_add(1);
      if (const uint64_t rate = self->limits_.slowest_frame_bytes_per_s; rate > 0) {
        const int64_t until = steady_now_us() + static_cast<int64_t>(static_cast<double>(length) * 1e6 / rate);
        int64_t seen = ep->arriving_until_us.load();
        while (seen < until && !ep->arriving_until_us.compare_exchange_weak(seen, until)) {
        }
      }
      auto arrival = std::make_shared<Arrival>();
      // Not zeroed: UCX writes every byte; a large one's pages come from
      // an earlier frame's when one is back.
      arrival->data = detail::take_receive_buffer(length);
      self->arrivals_[peer].push_back(arrival);
      auto* req = new RecvRequest{self, peer, arrival, std::move(ep)};
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
        auto* r = static_cast<RecvRequest*>(user_data);
        r->self->finish_recv(r, status);
        ucp_request_free(request);
      };
      p.user_data = req;
      ucs_status_ptr_t r = ucp_am_recv_data_nbx(self->worker_, data, arrival->data.data(), length, &p);
      if (UCS_PTR_IS_ERR(r)) {
        self->finish_recv(req, UCS_PTR_STATUS(r));
      } else if (r == nullptr) {
        self->finish_recv(req, UCS_OK);
      }
      return UCS_OK;
    }
    self->route(std::string(static_cast<const char*>(data), length));
    return UCS_OK;
  }

  /// Several small frames of one connection in one message (see kBatchAm).
  static ucs_status_t on_batch(void* arg, const void*, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxTransport*>(arg);
    if (header_length != 0 || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length < 16 ||
        length > kBatchBytes + 16) {
      TROUPE_LOG(warn, "event=bad_frame transport=ucx bytes={} reason=\"not a troupe batch\"", length);
      return UCS_OK;
    }
    self->route(std::string(static_cast<const char*>(data), length), /*batch=*/true);
    return UCS_OK;
  }

  /// An eager frame or batch: its connection from the trailing tag; behind
  /// a rendezvous of that connection still in flight, it waits its turn.
  void route(std::string data, bool batch = false) {
    uint64_t tag = 0;
    std::memcpy(&tag, data.data() + data.size() - 8, 8);
    PeerId peer = peer_of_tag(tag);
    if (peer == 0) return;
    if (auto it = arrivals_.find(peer); it != arrivals_.end()) {
      it->second.push_back(std::make_shared<Arrival>(Arrival{true, false, std::move(data), batch, {}}));
      // Held back behind a rendezvous, but a sign of life all the same (a
      // large transfer may take longer than the peer-death bound).
      if (events_.on_activity) deferred_activity_.push_back(peer);
      return;
    }
    batch ? unpack_batch(peer, std::move(data), /*tag_checked=*/true) : unpack(peer, std::move(data), true);
  }

  /// Splits a batch into its frames and hands them up in order; a batch
  /// that does not add up closes its connection.
  void unpack_batch(PeerId peer, std::string data, bool tag_checked = false) {
    uint64_t count = 0, tag = 0;
    std::memcpy(&tag, data.data() + data.size() - 8, 8);
    std::memcpy(&count, data.data() + data.size() - 16, 8);
    if (!tag_checked && peer_of_tag(tag) != peer) return;
    size_t end = data.size() - 16, pos = 0;
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t lengths[2];
      if (end - pos < sizeof(lengths)) break;
      std::memcpy(lengths, data.data() + pos, sizeof(lengths));
      pos += sizeof(lengths);
      uint64_t payload_bytes = lengths[0], header_bytes = lengths[1];
      if (header_bytes == 0 || header_bytes > limits_.frame.max_header_bytes || payload_bytes > end - pos ||
          header_bytes > end - pos - payload_bytes) {
        break;
      }
      std::string payload = data.substr(pos, payload_bytes);
      std::string_view header(data.data() + pos + payload_bytes, header_bytes);
      pos += payload_bytes + header_bytes;
      if (!deliver(peer, header, std::move(payload))) return;  // closed already
      if (i + 1 == count && pos == end) return;
    }
    if (count == 0 && pos == end) return;
    reject(peer, Status(ErrorCode::malformed, "frame: a batch of " + std::to_string(count) +
                                                  " frames does not add up to its " + std::to_string(end) + " bytes"));
  }

  /// Hands up the connection's frames that are complete, in order.
  void drain(PeerId peer) {
    auto it = arrivals_.find(peer);
    if (it == arrivals_.end()) return;
    auto& queue = it->second;
    while (!queue.empty() && queue.front()->ready) {
      std::shared_ptr<Arrival> a = std::move(queue.front());
      queue.pop_front();
      if (a->failed) continue;
      a->batch ? unpack_batch(peer, std::move(a->data))
               : unpack(peer, std::move(a->data), /*tag_checked=*/false, std::move(a->hand_up));
    }
    if (queue.empty()) arrivals_.erase(it);
  }

  /// Client hello on the server: the client's tag, and (reply flag) its endpoint.
  static ucs_status_t on_hello(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxTransport*>(arg);
    if (length != sizeof(uint64_t) || (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return UCS_OK;
    PeerId peer = self->peer_of(param->reply_ep);
    uint64_t tag = 0;
    std::memcpy(&tag, data, sizeof(tag));
    if (peer != 0 && tag != 0) self->deferred_tags_.push_back({peer, tag, /*answer=*/true});
    return UCS_OK;
  }

  /// Server ack on the client: [the client's tag, the server's tag].
  static ucs_status_t on_ack(void* arg, const void*, size_t, void* data, size_t length, const ucp_am_recv_param_t*) {
    auto* self = static_cast<UcxTransport*>(arg);
    if (length != 2 * sizeof(uint64_t)) return UCS_OK;
    uint64_t mine = 0, theirs = 0;
    std::memcpy(&mine, data, 8);
    std::memcpy(&theirs, static_cast<const char*>(data) + 8, 8);
    PeerId peer = self->peer_of_tag(mine);
    if (peer != 0 && theirs != 0) self->deferred_tags_.push_back({peer, theirs, /*answer=*/false});
    return UCS_OK;
  }

  /// Splits payload | header | u64 header length | u64 tag, checks the
  /// bounds, and hands the frame up. A frame whose tag is not its
  /// connection's is dropped (the sender is not who it claims); bad frames
  /// close their connection.
  void unpack(PeerId peer, std::string data, bool tag_checked = false, HandUp hand_up = {}) {
    uint64_t tag = 0, header_bytes = 0;
    std::memcpy(&tag, data.data() + data.size() - 8, 8);
    std::memcpy(&header_bytes, data.data() + data.size() - 16, 8);
    if (!tag_checked && peer_of_tag(tag) != peer) return;
    size_t body = data.size() - 16;
    if (header_bytes == 0 || header_bytes > body || header_bytes > limits_.frame.max_header_bytes) {
      reject(peer, Status(ErrorCode::malformed, "frame: header size " + std::to_string(header_bytes) +
                                                    " is zero, over the limit, or larger than the frame"));
      return;
    }
    size_t payload_bytes = body - header_bytes;
    if (payload_bytes > limits_.frame.max_payload_bytes) {
      reject(peer, Status(ErrorCode::malformed, "frame: payload of " + std::to_string(payload_bytes) +
                                                    " bytes exceeds max_frame_bytes (" +
                                                    std::to_string(limits_.frame.max_payload_bytes) + ")"));
      return;
    }
    // Decoded in place; then the payload stays where it was received.
    auto msg = decode_header(peer, std::string_view(data.data() + payload_bytes, header_bytes));
    if (!msg) return;
    data.resize(payload_bytes);
    deferred_frames_.push_back(DeferredFrame{peer, InFrame{std::move(*msg), std::move(data)}, std::move(hand_up)});
  }

  /// Decodes a frame header; a bad one closes the peer (nullopt).
  std::optional<wire::Message> decode_header(PeerId peer, std::string_view header) {
    auto msg = wire::decode(std::span<const std::byte>(reinterpret_cast<const std::byte*>(header.data()), header.size()),
                            limits_.frame);
    if (!msg) {
      reject(peer, Status(ErrorCode::malformed, msg.error().message()));
      return std::nullopt;
    }
    return std::move(*msg);
  }

  /// Decodes a header and hands the frame up; bad headers close the peer
  /// (false).
  bool deliver(PeerId peer, std::string_view header, std::string payload) {
    auto msg = decode_header(peer, header);
    if (!msg) return false;
    // Handed up after ucp_worker_progress returns: the layer above takes
    // its own locks and sends, which must not happen under UCX's lock.
    deferred_frames_.push_back(DeferredFrame{peer, InFrame{std::move(*msg), std::move(payload)}, {}});
    return true;
  }

  void finish_recv(RecvRequest* r, ucs_status_t status) {
    if (status != UCS_OK) {
      TROUPE_LOG(warn, "event=receive_failed transport=ucx peer={} error=\"{}\"", r->peer, ucs_status_string(status));
      r->arrival->failed = true;
    }
    r->arrival->ready = true;
    if (status == UCS_OK) {
      // Until the frame is handed up (after this progress call returns),
      // the peer keeps its allowance, at least kHandUpAllowance from now:
      // its heartbeats were behind this frame, and the layer above has not
      // seen it yet.
      r->arrival->hand_up = HandUp(r->ep);
      const int64_t until = steady_now_us() + kHandUpAllowance_us;
      int64_t seen = r->ep->arriving_until_us.load();
      while (seen < until && !r->ep->arriving_until_us.compare_exchange_weak(seen, until)) {
      }
    }
    // Closed while this receive ran: the close UCX could not take then
    // (settled after progress returns, under the connection's mutex).
    if (r->ep->receiving.fetch_sub(1) == 1 && r->ep->close_later.load()) deferred_closes_.push_back(r->ep);
    drain(r->peer);
    delete r;
  }

  /// Whether an endpoint closed during a rendezvous receive still waits for
  /// it to end.
  bool receiving_on_closed() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& ep : closing_) {
      std::lock_guard<std::mutex> ep_lock(ep->mu);
      if (ep->receiving > 0 || ep->in_flight > 0) return true;
    }
    return false;
  }

  /// ucp_ep_close_nbx, once, on an endpoint taken out of the maps whose
  /// close waited (see Ep::receiving), when nothing of it is in flight any
  /// more. With ep.mu held, and outside UCX callbacks.
  void close_when_idle_locked(Ep& ep) {
    if (ep.closed_in_ucx || !ep.close_later.load() || ep.in_flight > 0 || ep.receiving.load() > 0) return;
    ep.closed_in_ucx = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::erase_if(closing_, [&](const std::shared_ptr<Ep>& e) { return e.get() == &ep; });
    }
    close_handle(ep, ep.close_later_force);
  }

  /// ucp_ep_close_nbx. With ep->mu held, and outside UCX callbacks.
  static void close_handle(Ep& ep, bool force) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep.handle, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
  }

  void reject(PeerId peer, Status why) {
    TROUPE_LOG(warn, "event=bad_frame transport=ucx peer={} reason=\"{}\" action=close_connection", peer, why.message());
    deferred_drops_.push_back({peer, std::move(why), false});  // always inside a callback
  }

  Events events_;
  TransportLimits limits_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int efd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  ProgressGate gate_;
  std::mutex mu_;  // the maps below; never held across a UCX call
  PeerId next_id_ = 1;
  std::unordered_map<PeerId, std::shared_ptr<Ep>> eps_;
  std::unordered_map<ucp_ep_h, PeerId> by_ep_;
  std::unordered_map<uint64_t, PeerId> by_tag_;
  uint64_t next_region_ = 1;
  std::unordered_map<uint64_t, ucp_mem_h> memory_;  // registered regions
  // Under the gate's token (callbacks and run_deferred).
  std::vector<std::pair<PeerId, OutFrame>> deferred_sends_;
  struct Drop {
    PeerId peer;
    Status why;
    bool force;
  };
  std::vector<Drop> deferred_drops_;
  std::vector<std::shared_ptr<Ep>> deferred_closes_;  // endpoints whose last receive just ended
  std::vector<std::shared_ptr<Ep>> closing_;          // closed during a receive, not yet closed in UCX (under mu_)
  std::vector<PeerId> deferred_hellos_;
  struct TagUpdate {
    PeerId peer;
    uint64_t tag;
    bool answer;
  };
  std::vector<TagUpdate> deferred_tags_;
  std::vector<DeferredFrame> deferred_frames_;
  std::vector<PeerId> deferred_connected_;
  std::vector<std::pair<RmaDone, Status>> deferred_rma_;
  std::vector<PeerId> deferred_activity_;
  std::vector<std::pair<std::shared_ptr<Ep>, size_t>> deferred_sent_;  // counted messages UCX finished
  /// Connections with a rendezvous frame in flight: their frames in order.
  std::unordered_map<PeerId, std::deque<std::shared_ptr<Arrival>>> arrivals_;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_ucx_transport(Events events, TransportLimits limits) {
  auto t = std::make_unique<UcxTransport>(std::move(events), limits);
  if (Status s = t->init(); !s.ok()) return error(s);
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace troupe::transport
