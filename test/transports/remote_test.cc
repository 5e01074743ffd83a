// Remote actors: refs that cross processes behave like local ones (tell, ask,
// errors, monitors), failures are prompt (peer_lost), wrong tokens and bad
// messages are refused with clear errors. Uses real OS processes where a
// process has to die.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <sstream>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "support/journal.h"
#include "support/peer_process.h"
#include "support/remote_actors.h"
#include "transport.h"
#include "wire.h"

using namespace std::chrono_literals;
using namespace troupe::test;
using troupe::ErrorCode;

TEST_CASE("remote: tell and ask across runtimes behave like local ones", "[remote]") {
  troupe::Runtime server(test_config());
  troupe::Runtime client(test_config("tcp", false));
  auto service = server.spawn<Service>();
  REQUIRE(server.publish("service", service).ok());
  REQUIRE_FALSE(server.address().empty());
  auto remote = client.resolve<Service>(server.address() + "/service");
  REQUIRE(remote.has_value());
  auto r = remote->ask(Echo{"hi"}).get();
  REQUIRE(r.has_value());
  CHECK(*r == "echo: hi");
  // A handler failure on the other side arrives with its code and message.
  auto boom = remote->ask(Boom{}).get();
  REQUIRE_FALSE(boom.has_value());
  CHECK(boom.error().code() == ErrorCode::handler_failed);
  CHECK_THAT(boom.error().message(), Catch::Contains("remote boom"));
  // The crash stopped the (unsupervised) service: later asks fail fast.
  auto later = remote->ask(Echo{"again"}, 5s).get();
  REQUIRE_FALSE(later.has_value());
  CHECK(later.error().code() == ErrorCode::actor_dead);
}

TEST_CASE("remote: per-sender order holds for concurrent senders and mixed sizes, on both transports",
          "[remote][ucx]") {
  std::string scheme = GENERATE(as<std::string>{}, "tcp", "ucx");
  INFO("transport " << scheme);
  troupe::Runtime server(test_config(scheme));
  troupe::Runtime client(test_config(scheme, false));
  REQUIRE(server.publish("service", server.spawn<Service>()).ok());
  auto remote = client.resolve<Service>(server.address() + "/service").value();
  constexpr int kSenders = 4, kEach = 5000;
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < kSenders; ++s) {
    threads.emplace_back([&, s] {
      for (int n = 0; n < kEach; ++n) {
        // Every 100th is large: over UCX it travels by rendezvous, and the
        // small ones after it must still not overtake it.
        std::string pad = n % 100 == 0 ? std::string(300'000, 'x') : std::string();
        if (!remote.tell(Record{s, n, std::move(pad)}).ok()) refused.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(refused.load() == 0);
  auto tally = remote.ask(Check{}, 60s).get();
  REQUIRE(tally.has_value());
  CHECK(tally->violations == 0);
  CHECK(tally->received == kSenders * kEach);
}

TEST_CASE("remote: a message without a wire declaration is refused before it leaves", "[remote]") {
  troupe::Runtime server(test_config());
  troupe::Runtime client(test_config("tcp", false));
  REQUIRE(server.publish("service", server.spawn<Service>()).ok());
  auto remote = client.resolve<Service>(server.address() + "/service").value();
  auto r = remote.ask(Local{3}).get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::invalid_argument);
  CHECK_THAT(r.error().message(), Catch::Contains("TROUPE_MESSAGE"));
  // A registered type the remote actor does not handle: unknown_message.
  auto any = client.resolve_any(server.address() + "/service").value();
  auto stray = any.ask<int>(Stray{}).get();
  REQUIRE_FALSE(stray.has_value());
  CHECK(stray.error().code() == ErrorCode::unknown_message);
  // An unpublished name: not_found.
  auto missing = client.resolve_any(server.address() + "/nobody");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code() == ErrorCode::not_found);
}

TEST_CASE("remote: a wrong cluster token is refused with a clear error, on both transports", "[remote][ucx]") {
  std::string scheme = GENERATE(as<std::string>{}, "tcp", "ucx");
  INFO("transport " << scheme);
  troupe::Runtime server(test_config(scheme, true, "right-token"));
  troupe::Runtime client(test_config(scheme, false, "wrong-token"));
  REQUIRE(server.publish("service", server.spawn<Service>()).ok());
  auto r = client.resolve_any(server.address() + "/service", 5s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::refused);
  CHECK_THAT(r.error().message(), Catch::Contains("wrong cluster token"));
}

TEST_CASE("remote: monitors of a remote actor fire when it stops", "[remote]") {
  troupe::Runtime server(test_config());
  troupe::Runtime client(test_config("tcp", false));
  REQUIRE(server.publish("service", server.spawn<Service>()).ok());
  auto remote = client.resolve<Service>(server.address() + "/service").value();
  REQUIRE(remote.ask(Echo{"warm up"}).get().has_value());
  auto down = client.monitor(remote, 10s);
  REQUIRE(remote.tell(Quit{}).ok());
  auto reason = down.get();
  REQUIRE(reason.has_value());
  CHECK(reason->kind == troupe::ExitReason::Kind::normal);
}

TEST_CASE("remote: kill -9 of the peer process fails pending asks with peer_lost within a second, on both transports",
          "[remote][ucx]") {
  std::string scheme = GENERATE(as<std::string>{}, "tcp", "ucx");
  INFO("transport " << scheme);
  PeerProcess peer("test-token", scheme);
  troupe::Runtime client(test_config(scheme, false));
  auto remote = client.resolve<Service>(peer.address() + "/service");
  REQUIRE(remote.has_value());
  REQUIRE(remote->ask(Echo{"alive?"}).get().value() == "echo: alive?");
  auto down = client.monitor(*remote, 10s);
  auto pending = remote->ask(Nap{30'000}, 30s);  // would answer after 30 s
  auto t0 = std::chrono::steady_clock::now();
  peer.kill9();
  auto r = pending.get();
  auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::peer_lost);
  CHECK(waited < 1s);
  auto reason = down.get();
  REQUIRE(reason.has_value());
  CHECK(reason->kind == troupe::ExitReason::Kind::killed);
  CHECK_THAT(reason->message, Catch::Contains("lost the connection"));
  // Later sends to the dead peer fail at once too.
  auto after = remote->ask(Echo{"anyone?"}, 10s).get();
  REQUIRE_FALSE(after.has_value());
  CHECK((after.error().code() == ErrorCode::actor_dead || after.error().code() == ErrorCode::peer_lost));
}

TEST_CASE(
    "remote: sends refused by a full send queue to a stopped peer leave the connection working once it reads "
    "again",
    "[remote]") {
  PeerProcess peer;
  auto config = test_config("tcp", false);
  config.max_send_queue_bytes = 1 << 20;
  troupe::Runtime client(config);
  auto remote = client.resolve<Service>(peer.address() + "/service");
  REQUIRE(remote.has_value());
  REQUIRE(remote->ask(Echo{"alive?"}).get().value() == "echo: alive?");
  // The peer stops reading: the sockets' buffers fill, then the queue, then
  // a send is refused (well before the peer would be declared dead).
  REQUIRE(::kill(peer.pid(), SIGSTOP) == 0);
  const Sum big{std::vector<uint8_t>(256 << 10, 7)};
  troupe::Status refused;
  for (int i = 0; i < 10'000 && refused.ok(); ++i) refused = remote->tell(big);
  CHECK(refused.code() == ErrorCode::mailbox_full);
  REQUIRE(::kill(peer.pid(), SIGCONT) == 0);
  // A refused frame took no place in the connection's sequence: the peer,
  // reading again, takes what was queued and answers what comes after.
  auto after = remote->ask(Echo{"still there?"}, 30s).get();
  REQUIRE(after.has_value());
  CHECK(*after == "echo: still there?");
}

TEST_CASE("remote: a separate process answers asks and refuses the wrong token", "[remote]") {
  PeerProcess peer("process-token");
  {
    troupe::Runtime client(test_config("tcp", false, "process-token"));
    auto remote = client.resolve<Service>(peer.address() + "/service");
    REQUIRE(remote.has_value());
    CHECK(remote->ask(Echo{"from another process"}).get().value() == "echo: from another process");
  }
  troupe::Runtime intruder(test_config("tcp", false, "not-the-token"));
  auto r = intruder.resolve_any(peer.address() + "/service", 5s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::refused);
}

namespace {
class JournalListener : public troupe::Actor<JournalListener, Notify> {
 public:
  explicit JournalListener(troupe::test::JournalPtr j) : j_(std::move(j)) {}
  void handle(const Notify& n) { j_->add(n.what); }

 private:
  troupe::test::JournalPtr j_;
};
}  // namespace

TEST_CASE("remote: refs inside messages stay usable across the boundary, and come home as local refs", "[remote]") {
  troupe::Runtime server(test_config());
  troupe::Runtime client(test_config());  // listens too: the server calls back
  REQUIRE(server.publish("hub", server.spawn<Hub>()).ok());
  auto hub = client.resolve<Hub>(server.address() + "/hub").value();
  auto journal = std::make_shared<troupe::test::Journal>();
  troupe::AnyRef listener = client.spawn<JournalListener>(journal);
  auto echoed = hub.ask(Subscribe{listener}).get();
  REQUIRE(echoed.has_value());
  // The ref went out and came back: it is the same local actor again.
  CHECK(*echoed == listener);
  REQUIRE(hub.ask(Publish{"first"}).get().value() == 1);
  REQUIRE(hub.ask(Publish{"second"}).get().value() == 1);
  // The hub reaches the listener through a proxy on its side, over the
  // connection it dials to this runtime.
  REQUIRE(journal->wait_size(2));
  CHECK(journal->lines() == std::vector<std::string>{"first", "second"});
}

TEST_CASE("remote buffer: another process's memory reads and writes intact, and its kill -9 fails reads with "
          "peer_lost, on both transports",
          "[remote][buffer][ucx]") {
  std::string transport = GENERATE("tcp", "ucx");
  INFO("transport " << transport);
  PeerProcess peer("test-token", transport);
  troupe::Runtime client(test_config(transport, false));
  auto keeper = client.resolve<BufferKeeper>(peer.address() + "/buffers").value();
  auto handle = keeper.ask(GetBuffer{}).get().value();
  CHECK(handle.remote_key().empty() == (transport == "tcp"));
  std::vector<uint8_t> local(handle.size());
  REQUIRE(handle.read_into(local.data(), local.size()).get().has_value());
  size_t wrong = 0;
  for (size_t i = 0; i < local.size(); ++i) wrong += local[i] != pattern(i);
  CHECK(wrong == 0);

  // A write, read back from the peer's memory.
  std::vector<uint8_t> mine(1 << 20);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<uint8_t>(i * 7 + 3);
  REQUIRE(handle.write_from(mine.data(), mine.size(), 4096).get().has_value());
  std::vector<uint8_t> back(mine.size() + 2);
  REQUIRE(handle.read_into(back.data(), back.size(), 4095).get().has_value());
  CHECK(back.front() == pattern(4095));
  CHECK(std::equal(mine.begin(), mine.end(), back.begin() + 1));
  CHECK(back.back() == pattern(4096 + mine.size()));

  peer.kill9();
  auto r = handle.read_into(local.data(), local.size(), 0, 10s).get();
  REQUIRE_FALSE(r.has_value());
  CHECK((r.error().code() == ErrorCode::peer_lost || r.error().code() == ErrorCode::actor_dead));
}

namespace {
/// User + system CPU seconds of a process, from /proc/PID/stat.
double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15; ++i) {
    rest >> field;
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}
}  // namespace

TEST_CASE("remote: an idle process with open connections uses almost no CPU", "[remote]") {
  PeerProcess peer;
  troupe::Runtime client(test_config("tcp", false));
  auto remote = client.resolve<Service>(peer.address() + "/service").value();
  REQUIRE(remote.ask(Echo{"connected"}).get().has_value());
  double before = cpu_seconds(peer.pid());
  auto t0 = std::chrono::steady_clock::now();
  // The measurement window itself, not a synchronisation: idleness can only
  // be observed over time.
  std::this_thread::sleep_for(2s);
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double used = cpu_seconds(peer.pid()) - before;
  INFO("idle peer used " << used << " s of CPU in " << wall << " s");
  CHECK(used / wall < 0.03);  // heartbeats and idle scheduler checks only
  // The connection is still up.
  CHECK(remote.ask(Echo{"still here"}).get().has_value());
}

namespace {
/// A raw TCP connection that speaks troupe's framing, for tests that play a
/// peer node by hand.
class RawPeer {
 public:
  explicit RawPeer(const std::string& address) {
    auto at = troupe::transport::parse_endpoint(address).value();
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(at.port);
    inet_pton(AF_INET, at.host.c_str(), &a.sin_addr);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  }
  ~RawPeer() { ::close(fd_); }
  void send(const troupe::wire::Message& m) {
    std::string header = troupe::wire::encode(m);
    std::byte prefix[troupe::wire::kPrefixBytes];
    troupe::wire::write_prefix(prefix, static_cast<uint32_t>(header.size()), 0);
    REQUIRE(::write(fd_, prefix, sizeof(prefix)) == static_cast<ssize_t>(sizeof(prefix)));
    REQUIRE(::write(fd_, header.data(), header.size()) == static_cast<ssize_t>(header.size()));
  }
  /// Reads until the other side closes (true) or `timeout` passes (false).
  bool closed_within(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      ssize_t r = ::read(fd_, buf, sizeof(buf));
      if (r <= 0) return true;
    }
    return false;
  }

 private:
  int fd_ = -1;
};
}  // namespace

TEST_CASE("remote: a node that dials again supersedes its old connection, so nothing old arrives after new",
          "[remote]") {
  troupe::Runtime server(test_config());
  troupe::wire::Hello hello{troupe::wire::kProtocolVersion, 0x1234, "test-token", ""};
  RawPeer first(server.address());
  first.send(hello);
  // The same node again (its old connection is dead to it): the server drops
  // the old one rather than keep reading it beside the new one.
  RawPeer second(server.address());
  second.send(hello);
  CHECK(first.closed_within(5s));
  CHECK_FALSE(second.closed_within(300ms));
  // A different node does not supersede anybody.
  RawPeer other(server.address());
  other.send(troupe::wire::Hello{troupe::wire::kProtocolVersion, 0x5678, "test-token", ""});
  CHECK_FALSE(second.closed_within(300ms));
  CHECK_FALSE(other.closed_within(100ms));
}

TEST_CASE("remote: a refused dialer gets the reason before the close, and one that stays is closed within seconds",
          "[remote]") {
  troupe::Runtime server(test_config());
  // A wrong token with a frame pipelined behind the hello (as troupe's own
  // dialer does): the server answers and leaves the connection for the
  // dialer to close, so no reset destroys the answer.
  RawPeer raw(server.address());
  raw.send(troupe::wire::Hello{troupe::wire::kProtocolVersion, 0x9abc, "wrong-token", ""});
  raw.send(troupe::wire::Heartbeat{1});
  CHECK_FALSE(raw.closed_within(300ms));
  // A dialer that never closes is closed by the server after the linger.
  CHECK(raw.closed_within(5s));
}

TEST_CASE("remote: four processes ask, tell and relay between each other, on both transports", "[remote][ucx]") {
  std::string scheme = GENERATE(as<std::string>{}, "tcp", "ucx");
  INFO("transport " << scheme);
  std::vector<std::unique_ptr<PeerProcess>> peers;
  for (int i = 0; i < 3; ++i) peers.push_back(std::make_unique<PeerProcess>("test-token", scheme));
  troupe::Runtime client(test_config(scheme, false));
  std::vector<troupe::ActorRef<Service>> services;
  for (auto& p : peers) services.push_back(client.resolve<Service>(p->address() + "/service").value());

  // Every ordered pair of peers talks directly: the client asks i, i asks j.
  for (size_t i = 0; i < services.size(); ++i) {
    for (size_t j = 0; j < services.size(); ++j) {
      if (i == j) continue;
      std::string text = std::to_string(i) + "->" + std::to_string(j);
      auto r = services[i].ask(Relay{services[j], text}, 30s).get();
      REQUIRE(r.has_value());
      CHECK(*r == "echo: " + text);
    }
  }

  // Concurrent senders to every peer keep per-sender order.
  constexpr int kSenders = 3, kEach = 2000;
  std::vector<std::thread> threads;
  std::atomic<int> refused{0};
  for (int s = 0; s < kSenders; ++s) {
    threads.emplace_back([&, s] {
      for (int n = 0; n < kEach; ++n) {
        for (auto& svc : services) {
          if (!svc.tell(Record{s, n}).ok()) refused.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(refused.load() == 0);
  for (auto& svc : services) {
    auto tally = svc.ask(Check{}, 60s).get();
    REQUIRE(tally.has_value());
    CHECK(tally->violations == 0);
    CHECK(tally->received == kSenders * kEach);
  }
}

// [huge]: 256 MiB through UCX under TSan runs past UCX's own endpoint
// keepalive (see docs/transports.md); scripts/tsan.sh leaves it out.
TEST_CASE("remote: payloads from 0 bytes to 256 MiB reach another process intact, on both transports",
          "[remote][ucx][huge]") {
  std::string scheme = GENERATE(as<std::string>{}, "tcp", "ucx");
  INFO("transport " << scheme);
  PeerProcess peer("test-token", scheme);
  troupe::Runtime client(test_config(scheme, false));
  auto remote = client.resolve<Service>(peer.address() + "/service").value();
  for (size_t size : {size_t{0}, size_t{1}, size_t{100}, size_t{4096}, size_t{70'000}, size_t{1} << 20,
                      size_t{256} << 20}) {
    INFO("size " << size);
    std::vector<uint8_t> bytes(size);
    uint64_t sum = 0;
    for (size_t i = 0; i < size; ++i) {
      bytes[i] = static_cast<uint8_t>(i * 31 + 7);
      sum += bytes[i];
    }
    auto r = remote.ask(Sum{std::move(bytes)}, 120s).get();
    INFO((r ? std::string() : r.error().to_string()));
    REQUIRE(r.has_value());
    CHECK(*r == sum);
  }
}

TEST_CASE("remote: a ref to a node not yet connected to still reports its actor's stop to monitors", "[remote]") {
  troupe::Runtime owner(test_config());
  troupe::Runtime watcher(test_config());
  auto actor = owner.spawn<Service>();
  auto where = owner.locate(actor).value();  // as a directory would keep it
  auto ref = watcher.ref_at(where.first, where.second);
  REQUIRE(ref.has_value());  // no connection between the two yet
  auto down = watcher.monitor(*ref, 10s);  // nothing else makes the watcher connect
  owner.stop(actor);
  auto reason = down.get();
  REQUIRE(reason.has_value());
  CHECK_THAT(reason->to_string(), Catch::Contains("stopped by Runtime::stop"));
}
