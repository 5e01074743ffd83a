// TCP transport: one epoll thread per transport reads every connection and
// finishes writes that would block; senders write directly from their own
// thread when the socket has room, so a send usually costs one writev.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "free_later.h"
#include "log.h"
#include "progress_gate.h"
#include "receive_pool.h"
#include "transport.h"

namespace troupe::transport {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

Status lost(const std::string& what) { return Status(ErrorCode::peer_lost, what); }

/// A frame being written: prefix, header and payload (with its splices),
/// with a write offset.
struct Pending {
  std::byte prefix[wire::kPrefixBytes];
  OutFrame frame;
  size_t payload_bytes = 0;  // frame.payload_bytes(), once
  size_t offset = 0;         // bytes of prefix+header+payload already written
  size_t total() const { return wire::kPrefixBytes + frame.header.size() + payload_bytes; }
};

/// Most pieces one sendmsg takes (a frame with more splices goes in several).
constexpr int kMaxIov = 64;

struct Conn {
  PeerId id = 0;
  int fd = -1;
  bool inbound = false;
  /// Set once, by fail(); the epoll thread then closes fd and reports.
  std::atomic<bool> closed{false};
  Status why;  // written by the fail() that set closed
  std::mutex out_mu;  // guards everything below it and writes to fd
  bool connected = false;
  bool want_out = false;  // EPOLLOUT armed
  std::deque<Pending> out;
  size_t queued_bytes = 0;
  // Read state (transport thread only).
  std::byte prefix[wire::kPrefixBytes];
  size_t prefix_got = 0;
  wire::Prefix current{};
  std::string header;
  std::string payload;
  size_t body_got = 0;  // bytes of header+payload read so far
  std::chrono::steady_clock::time_point activity_reported{};
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(Events events, TransportLimits limits) : events_(std::move(events)), limits_(limits) {
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    wakefd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeTag;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev);
    thread_ = std::thread([this] { loop(); });
  }

  ~TcpTransport() override { stop(); }

  const char* scheme() const override { return "tcp"; }

  Result<std::string> listen(const Endpoint& at) override {
    auto addr = resolve(at);
    if (!addr) return error(addr.error());
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return error(ErrorCode::invalid_argument, "listen: socket: " + errno_text(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) != 0 || ::listen(fd, 512) != 0) {
      int err = errno;
      ::close(fd);
      return error(ErrorCode::invalid_argument, "listen: cannot listen on " + at.to_uri() + ": " + errno_text(err) +
                                                    " (is the port in use? use port 0 for any free port)");
    }
    sockaddr_in bound{};
    socklen_t len = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    {
      std::lock_guard<std::mutex> lock(mu_);
      listen_fds_.push_back(fd);
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenTag | static_cast<uint64_t>(fd);
    epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &bound.sin_addr, host, sizeof(host));
    Endpoint actual{"tcp", host, ntohs(bound.sin_port)};
    return actual.to_uri();
  }

  Result<PeerId> connect(const Endpoint& to) override {
    auto addr = resolve(to);
    if (!addr) return error(addr.error());
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return error(ErrorCode::peer_lost, "connect: socket: " + errno_text(errno));
    tune(fd);
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr));
    if (rc != 0 && errno != EINPROGRESS) {
      int err = errno;
      ::close(fd);
      return error(ErrorCode::peer_lost, "connect: " + to.to_uri() + ": " + errno_text(err));
    }
    auto c = add_conn(fd, /*inbound=*/false, /*connected=*/false);
    return c->id;
  }

  Status send(PeerId peer, OutFrame frame) override {
    std::shared_ptr<Conn> c = find(peer);
    if (!c) return lost("send: connection " + std::to_string(peer) + " is closed");
    size_t payload_bytes = frame.payload_bytes();
    if (frame.header.size() > limits_.frame.max_header_bytes || payload_bytes > limits_.frame.max_payload_bytes) {
      return Status(ErrorCode::invalid_argument, "send: frame of " + std::to_string(payload_bytes) +
                                                     " payload bytes exceeds max_frame_bytes (" +
                                                     std::to_string(limits_.frame.max_payload_bytes) + ")");
    }
    std::unique_lock<std::mutex> lock(c->out_mu);
    if (c->closed.load()) return lost("send: connection " + std::to_string(peer) + " is closed");
    Pending p;
    wire::write_prefix(p.prefix, static_cast<uint32_t>(frame.header.size()), payload_bytes);
    p.frame = std::move(frame);
    p.payload_bytes = payload_bytes;
    size_t bytes = p.total();
    if (c->queued_bytes + bytes > limits_.max_send_queue_bytes && !c->out.empty()) {
      return Status(ErrorCode::mailbox_full, "send: send queue to peer " + std::to_string(peer) + " holds " +
                                                 std::to_string(c->queued_bytes) + " bytes; the peer is slow or stuck");
    }
    c->out.push_back(std::move(p));
    c->queued_bytes += bytes;
    if (c->connected && c->out.size() == 1) {
      // Nothing ahead of us: write from this thread, no hand-off.
      if (!flush(*c)) {
        lock.unlock();
        fail(c, lost("send: connection to peer " + std::to_string(peer) + " broke: " + errno_text(errno)));
        return lost("send: connection " + std::to_string(peer) + " broke");
      }
    }
    return {};
  }

  void close(PeerId peer, std::string why) override {
    if (auto c = find(peer)) fail(c, lost(why));
  }

  bool poll() override {
    if (stopping_.load(std::memory_order_relaxed)) return false;
    return gate_.try_poll([this] {
      epoll_event events[kMaxEvents];
      int n = epoll_wait(epfd_, events, kMaxEvents, 0);
      if (n <= 0) return false;
      handle(events, n);
      return true;
    });
  }

  Result<MemoryRegion> register_memory(void*, size_t) override {
    return error(ErrorCode::unsupported, "tcp: no one-sided access (the node emulates it with frames)");
  }
  Result<MemoryRegion> allocate_memory(size_t) override {
    return error(ErrorCode::unsupported, "tcp: no one-sided access (the node emulates it with frames)");
  }
  void deregister_memory(uint64_t) override {}
  void rma(PeerId, bool, void*, size_t, uint64_t, const std::string&, RmaDone done) override {
    done(Status(ErrorCode::unsupported, "tcp: no one-sided access (the node emulates it with frames)"));
  }

  void spin(bool on, bool idle) override { gate_.spin(on, idle); }

  void stop() override {
    if (stopping_.exchange(true)) return;
    gate_.stop();
    uint64_t one = 1;
    (void)!write(wakefd_, &one, sizeof(one));
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> token(gate_.token());  // against a straggling poller
    std::vector<std::shared_ptr<Conn>> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, c] : conns_) all.push_back(c);
      for (int fd : listen_fds_) ::close(fd);
      listen_fds_.clear();
    }
    for (auto& c : all) fail(c, lost("transport stopped"));
    reap();  // the epoll thread is gone: report from here
    ::close(epfd_);
    ::close(wakefd_);
  }

 private:
  static constexpr uint64_t kWakeTag = uint64_t{1} << 63;
  static constexpr uint64_t kListenTag = uint64_t{1} << 62;

  Result<sockaddr_in> resolve(const Endpoint& e) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(e.port);
    if (e.host.empty() || e.host == "0.0.0.0" || e.host == "*") {
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
      return addr;
    }
    if (inet_pton(AF_INET, e.host.c_str(), &addr.sin_addr) == 1) return addr;
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = getaddrinfo(e.host.c_str(), nullptr, &hints, &res);
    if (rc != 0 || res == nullptr) {
      return error(ErrorCode::invalid_argument, "address: cannot resolve host '" + e.host + "': " + gai_strerror(rc));
    }
    addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return addr;
  }

  static void tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }

  std::shared_ptr<Conn> add_conn(int fd, bool inbound, bool connected) {
    auto c = std::make_shared<Conn>();
    c->id = next_id_.fetch_add(1);
    c->fd = fd;
    c->inbound = inbound;
    c->connected = connected;
    {
      std::lock_guard<std::mutex> lock(mu_);
      conns_.emplace(c->id, c);
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | (connected ? 0u : static_cast<uint32_t>(EPOLLOUT));
    c->want_out = !connected;
    ev.data.u64 = c->id;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
    return c;
  }

  std::shared_ptr<Conn> find(PeerId id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : it->second;
  }

  /// Writes queued frames until done or the socket is full.
  /// REQUIRES: c.out_mu held. Returns false on a broken connection.
  bool flush(Conn& c) {
    while (!c.out.empty()) {
      Pending& p = c.out.front();
      iovec iov[kMaxIov];
      int n = 0;
      size_t off = p.offset;
      auto add = [&](const void* data, size_t size) {
        if (off >= size) {
          off -= size;
          return;
        }
        if (n == kMaxIov) return;  // the rest goes in the next call
        iov[n++] = {const_cast<char*>(static_cast<const char*>(data)) + off, size - off};
        off = 0;
      };
      add(p.prefix, wire::kPrefixBytes);
      add(p.frame.header.data(), p.frame.header.size());
      p.frame.for_each_piece(add);
      // sendmsg with MSG_NOSIGNAL, not writev: writing to a peer that has
      // gone must be an error here, not a SIGPIPE that kills this process.
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      ssize_t w = ::sendmsg(c.fd, &msg, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          arm_out(c, true);
          return true;
        }
        return false;
      }
      p.offset += static_cast<size_t>(w);
      if (p.offset == p.total()) {
        c.queued_bytes -= p.total();
        if (p.total() >= detail::kFreeLaterMinBytes) {
          // Freed off this thread, which reads every connection (see
          // free_later.h).
          auto sent = std::make_shared<OutFrame>(std::move(p.frame));
          detail::free_later([sent]() mutable { sent.reset(); });
        }
        c.out.pop_front();
      }
    }
    arm_out(c, false);
    return true;
  }

  void arm_out(Conn& c, bool on) {
    if (c.want_out == on) return;
    c.want_out = on;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | (on ? static_cast<uint32_t>(EPOLLOUT) : 0u);
    ev.data.u64 = c.id;
    epoll_ctl(epfd_, EPOLL_CTL_MOD, c.fd, &ev);
  }

  /// Marks a connection dead. Any thread. The fd is shut down but not
  /// closed here: the epoll thread may still hold it from its current batch,
  /// and a closed fd number can be reused by a new socket at once. reap()
  /// closes it and reports on_lost on the epoll thread.
  void fail(const std::shared_ptr<Conn>& c, Status why) {
    {
      std::lock_guard<std::mutex> lock(c->out_mu);
      if (c->closed.load()) return;
      c->why = std::move(why);
      c->closed.store(true);
      ::shutdown(c->fd, SHUT_RDWR);
      c->out.clear();
      c->queued_bytes = 0;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      reap_.push_back(c);
    }
    uint64_t one = 1;
    (void)!write(wakefd_, &one, sizeof(one));
  }

  void reap() {
    std::vector<std::shared_ptr<Conn>> dead;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dead.swap(reap_);
      for (auto& c : dead) conns_.erase(c->id);
    }
    for (auto& c : dead) {
      epoll_ctl(epfd_, EPOLL_CTL_DEL, c->fd, nullptr);
      ::close(c->fd);
      TROUPE_LOG(debug, "event=connection_closed transport=tcp peer={} reason=\"{}\"", c->id, c->why.message());
      if (events_.on_lost) events_.on_lost(c->id, c->why);
    }
  }

  void loop() {
    epoll_event events[kMaxEvents];
    while (!stopping_.load()) {
      gate_.wait_for_turn();  // while idle scheduler threads poll, stay out of their way
      if (stopping_.load()) break;
      // Waits without the token, so that pollers are not shut out; another
      // thread may handle these same events first, which leaves them
      // harmless here (reads find nothing, writes find an empty queue).
      int n = epoll_wait(epfd_, events, kMaxEvents, -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        TROUPE_LOG(err, "event=epoll_failed error=\"{}\"", errno_text(errno));
        return;
      }
      std::lock_guard<std::mutex> token(gate_.token());
      handle(events, n);
    }
  }

  /// Reads, writes, accepts and reports for `n` epoll events, then reports
  /// closed connections. REQUIRES: the gate's token.
  void handle(const epoll_event* events, int n) {
    for (int i = 0; i < n; ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) {
        uint64_t drained;
        (void)!read(wakefd_, &drained, sizeof(drained));
        continue;
      }
      if (tag & kListenTag) {
        accept_all(static_cast<int>(tag & ~kListenTag));
        continue;
      }
      std::shared_ptr<Conn> c = find(tag);
      if (!c || c->closed.load()) continue;
      uint32_t ev = events[i].events;
      if (ev & EPOLLOUT) on_writable(c);
      if (!c->closed.load() && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) on_readable(c, read_buf_);
    }
    reap();
  }

  void accept_all(int lfd) {
    for (;;) {
      int fd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          TROUPE_LOG(warn, "event=accept_failed error=\"{}\"", errno_text(errno));
        }
        return;
      }
      tune(fd);
      auto c = add_conn(fd, /*inbound=*/true, /*connected=*/true);
      if (events_.on_connected) events_.on_connected(c->id, true);
    }
  }

  void on_writable(const std::shared_ptr<Conn>& c) {
    bool just_connected = false;
    bool ok = true;
    {
      std::lock_guard<std::mutex> lock(c->out_mu);
      if (c->closed.load()) return;
      if (!c->connected) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          errno = err;
          ok = false;
        } else {
          c->connected = true;
          just_connected = true;
        }
      }
      if (ok) ok = flush(*c);
    }
    if (!ok) {
      fail(c, lost("connection to peer " + std::to_string(c->id) + " failed: " + errno_text(errno)));
      return;
    }
    if (just_connected && events_.on_connected) events_.on_connected(c->id, false);
  }

  void on_readable(const std::shared_ptr<Conn>& c, std::vector<std::byte>& buf) {
    for (;;) {
      // Inside a large payload: read straight into it, not through `buf`
      // (one copy fewer for every large frame).
      size_t direct = payload_left(*c);
      bool into_payload = direct >= buf.size();
      char* dst = into_payload ? c->payload.data() + (c->body_got - c->current.header_bytes)
                               : reinterpret_cast<char*>(buf.data());
      size_t want = into_payload ? direct : buf.size();
      ssize_t r = ::read(c->fd, dst, want);
      if (r == 0) {
        fail(c, lost("peer closed the connection"));
        return;
      }
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        fail(c, lost("connection reset: " + errno_text(errno)));
        return;
      }
      if (into_payload) {
        c->body_got += static_cast<size_t>(r);
        if (payload_left(*c) == 0 && !finish_frame(c)) return;
      } else if (!consume(c, buf.data(), static_cast<size_t>(r))) {
        return;
      }
      if (c->prefix_got == wire::kPrefixBytes && events_.on_activity) {
        // In the middle of a frame: a large one can take longer than the
        // peer-death bound to arrive, and its sender is not dead.
        auto now = std::chrono::steady_clock::now();
        if (now - c->activity_reported >= kActivityInterval) {
          c->activity_reported = now;
          events_.on_activity(c->id);
        }
      }
      if (static_cast<size_t>(r) < want) return;
    }
  }

  /// Payload bytes of the current frame not yet read, once its header is
  /// in (0 otherwise).
  static size_t payload_left(const Conn& c) {
    if (c.prefix_got < wire::kPrefixBytes || c.body_got < c.current.header_bytes) return 0;
    return c.current.header_bytes + c.current.payload_bytes - c.body_got;
  }

  /// Feeds bytes into the connection's frame parser. False when the
  /// connection was closed for bad input.
  bool consume(const std::shared_ptr<Conn>& c, const std::byte* data, size_t n) {
    while (n > 0) {
      if (c->prefix_got < wire::kPrefixBytes) {
        size_t take = std::min(n, wire::kPrefixBytes - c->prefix_got);
        std::memcpy(c->prefix + c->prefix_got, data, take);
        c->prefix_got += take;
        data += take;
        n -= take;
        if (c->prefix_got < wire::kPrefixBytes) return true;
        auto p = wire::read_prefix(std::span<const std::byte, wire::kPrefixBytes>(c->prefix), limits_.frame);
        if (!p) return reject(c, p.error());
        c->current = *p;
        c->header.resize(p->header_bytes);
        // Not zeroed: every byte is written by the reads that follow; a
        // large one's pages come from an earlier frame's when one is back.
        c->payload = detail::take_receive_buffer(p->payload_bytes);
        c->body_got = 0;
      }
      size_t need = c->current.header_bytes + c->current.payload_bytes - c->body_got;
      size_t take = std::min(n, need);
      size_t h = c->current.header_bytes;
      for (size_t done = 0; done < take;) {
        size_t pos = c->body_got + done;
        size_t chunk;
        if (pos < h) {
          chunk = std::min(take - done, h - pos);
          std::memcpy(c->header.data() + pos, data + done, chunk);
        } else {
          chunk = take - done;
          std::memcpy(c->payload.data() + (pos - h), data + done, chunk);
        }
        done += chunk;
      }
      c->body_got += take;
      data += take;
      n -= take;
      if (c->body_got < c->current.header_bytes + c->current.payload_bytes) return true;
      if (!finish_frame(c)) return false;
    }
    return true;
  }

  /// The current frame is all in: decodes its header and hands it up.
  /// False when the connection was closed (bad header, or by the handler).
  bool finish_frame(const std::shared_ptr<Conn>& c) {
    auto msg = wire::decode(std::span<const std::byte>(reinterpret_cast<const std::byte*>(c->header.data()),
                                                       c->header.size()),
                            limits_.frame);
    c->prefix_got = 0;
    if (!msg) return reject(c, msg.error());
    InFrame f{std::move(*msg), std::move(c->payload)};
    c->payload = std::string();
    if (events_.on_frame) events_.on_frame(c->id, std::move(f));
    return !c->closed.load();
  }

  bool reject(const std::shared_ptr<Conn>& c, const Status& why) {
    TROUPE_LOG(warn, "event=bad_frame transport=tcp peer={} reason=\"{}\" action=close_connection", c->id,
               why.message());
    fail(c, Status(ErrorCode::malformed, why.message()));
    return false;
  }

  static constexpr int kMaxEvents = 64;

  Events events_;
  TransportLimits limits_;
  ProgressGate gate_;
  std::vector<std::byte> read_buf_ = std::vector<std::byte>(1 << 16);  // under the token
  int epfd_ = -1;
  int wakefd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<PeerId> next_id_{1};
  std::mutex mu_;
  std::unordered_map<PeerId, std::shared_ptr<Conn>> conns_;
  std::vector<std::shared_ptr<Conn>> reap_;
  std::vector<int> listen_fds_;
};

}  // namespace

std::string Endpoint::to_uri() const {
  return (scheme.empty() ? std::string() : scheme + "://") + host + ":" + std::to_string(port);
}

Result<Endpoint> parse_endpoint(const std::string& uri) {
  Endpoint e;
  std::string rest = uri;
  if (auto pos = rest.find("://"); pos != std::string::npos) {
    e.scheme = rest.substr(0, pos);
    rest = rest.substr(pos + 3);
    if (e.scheme != "tcp" && e.scheme != "ucx") {
      return error(ErrorCode::invalid_argument,
                   "address '" + uri + "': unknown scheme '" + e.scheme + "' (use tcp:// or ucx://)");
    }
  }
  if (auto slash = rest.find('/'); slash != std::string::npos) rest = rest.substr(0, slash);
  auto colon = rest.rfind(':');
  if (colon == std::string::npos) {
    return error(ErrorCode::invalid_argument, "address '" + uri + "': expected host:port");
  }
  e.host = rest.substr(0, colon);
  std::string port = rest.substr(colon + 1);
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < 0 || p > 65535) {
    return error(ErrorCode::invalid_argument, "address '" + uri + "': bad port '" + port + "'");
  }
  e.port = static_cast<uint16_t>(p);
  return e;
}

std::unique_ptr<Transport> make_tcp_transport(Events events, TransportLimits limits) {
  return std::make_unique<TcpTransport>(std::move(events), limits);
}

}  // namespace troupe::transport
