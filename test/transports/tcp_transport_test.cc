// The TCP transport: frames in order both ways, big payloads, bad input from
// a raw socket closes only that connection, a closed peer is reported.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support/transport_recorder.h"
#include "transport.h"

using namespace std::chrono_literals;
using namespace troupe::transport;
using troupe::test::beat;
using troupe::test::heartbeat;
using troupe::test::Recorder;
using troupe::ErrorCode;

namespace {

int raw_connect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

}  // namespace

TEST_CASE("tcp: frames arrive in order, both ways, payloads intact", "[transports][tcp]") {
  Recorder server_rec, client_rec;
  auto server = make_tcp_transport(server_rec.events(), {});
  auto client = make_tcp_transport(client_rec.events(), {});
  auto addr = server->listen(parse_endpoint("tcp://127.0.0.1:0").value());
  REQUIRE(addr.has_value());
  auto peer = client->connect(parse_endpoint(*addr).value());
  REQUIRE(peer.has_value());
  constexpr int kFrames = 5000;
  for (int i = 0; i < kFrames; ++i) REQUIRE(client->send(*peer, heartbeat(i, std::string(i % 97, 'x'))).ok());
  REQUIRE(server_rec.wait([&] { return server_rec.frames.size() == kFrames; }));
  for (int i = 0; i < kFrames; ++i) {
    CHECK(beat(server_rec.frames[i].second) == static_cast<uint64_t>(i));
    CHECK(server_rec.frames[i].second.payload.size() == static_cast<size_t>(i % 97));
  }
  // And back, on the accepted connection.
  PeerId back = server_rec.frames[0].first;
  REQUIRE(server->send(back, heartbeat(77)).ok());
  REQUIRE(client_rec.wait([&] { return client_rec.frames.size() == 1; }));
  CHECK(beat(client_rec.frames[0].second) == 77);
}

TEST_CASE("tcp: a 64 MiB payload arrives whole and checksummed, and counts as life while it arrives",
          "[transports][tcp]") {
  Recorder server_rec, client_rec;
  auto server = make_tcp_transport(server_rec.events(), {});
  auto client = make_tcp_transport(client_rec.events(), {});
  auto addr = server->listen(parse_endpoint("tcp://127.0.0.1:0").value()).value();
  auto peer = client->connect(parse_endpoint(addr).value()).value();
  std::string big(64 << 20, '\0');
  uint64_t sum = 0;
  for (size_t i = 0; i < big.size(); ++i) {
    big[i] = static_cast<char>(i * 2654435761u >> 13);
    sum += static_cast<unsigned char>(big[i]);
  }
  REQUIRE(client->send(peer, heartbeat(1, big)).ok());
  REQUIRE(server_rec.wait([&] { return server_rec.frames.size() == 1; }, 60s));
  const std::string& got = server_rec.frames[0].second.payload;
  REQUIRE(got.size() == big.size());
  uint64_t got_sum = 0;
  for (unsigned char c : got) got_sum += c;
  CHECK(got_sum == sum);
  CHECK(got == big);
  // No whole frame for the length of the transfer, yet the peer was heard
  // from: the heartbeat deadline must not run out on a large frame.
  std::lock_guard<std::mutex> l(server_rec.mu);
  REQUIRE_FALSE(server_rec.activity.empty());
  CHECK(server_rec.activity[0] == server_rec.frames[0].first);
}

TEST_CASE("tcp: garbage from a raw socket closes that connection only", "[transports][tcp]") {
  Recorder server_rec, client_rec;
  auto server = make_tcp_transport(server_rec.events(), {});
  auto client = make_tcp_transport(client_rec.events(), {});
  auto addr = server->listen(parse_endpoint("tcp://127.0.0.1:0").value()).value();
  auto port = parse_endpoint(addr).value().port;
  auto good = client->connect(parse_endpoint(addr).value()).value();

  SECTION("bad magic") {
    int fd = raw_connect(port);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    REQUIRE(write(fd, junk, sizeof(junk)) > 0);
    REQUIRE(server_rec.wait([&] { return !server_rec.lost.empty(); }));
    CHECK(server_rec.lost[0].second.code() == ErrorCode::malformed);
    CHECK_THAT(server_rec.lost[0].second.message(), Catch::Contains("magic"));
    ::close(fd);
  }
  SECTION("a valid prefix followed by a malformed header") {
    int fd = raw_connect(port);
    std::byte prefix[troupe::wire::kPrefixBytes];
    troupe::wire::write_prefix(prefix, 16, 0);
    REQUIRE(write(fd, prefix, sizeof(prefix)) == sizeof(prefix));
    const unsigned char bad[16] = {0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
    REQUIRE(write(fd, bad, sizeof(bad)) == sizeof(bad));
    REQUIRE(server_rec.wait([&] { return !server_rec.lost.empty(); }));
    CHECK(server_rec.lost[0].second.code() == ErrorCode::malformed);
    ::close(fd);
  }
  SECTION("an oversized payload announcement") {
    int fd = raw_connect(port);
    std::byte prefix[troupe::wire::kPrefixBytes];
    troupe::wire::write_prefix(prefix, 16, uint64_t{1} << 50);
    REQUIRE(write(fd, prefix, sizeof(prefix)) == sizeof(prefix));
    REQUIRE(server_rec.wait([&] { return !server_rec.lost.empty(); }));
    CHECK_THAT(server_rec.lost[0].second.message(), Catch::Contains("max_frame_bytes"));
    ::close(fd);
  }
  // The well-behaved connection still works.
  REQUIRE(client->send(good, heartbeat(5)).ok());
  REQUIRE(server_rec.wait([&] { return !server_rec.frames.empty(); }));
  CHECK(beat(server_rec.frames.back().second) == 5);
}

TEST_CASE("tcp: a peer that goes away is reported lost and sends to it fail", "[transports][tcp]") {
  Recorder server_rec, client_rec;
  auto server = make_tcp_transport(server_rec.events(), {});
  auto client = make_tcp_transport(client_rec.events(), {});
  auto addr = server->listen(parse_endpoint("tcp://127.0.0.1:0").value()).value();
  auto peer = client->connect(parse_endpoint(addr).value()).value();
  REQUIRE(client->send(peer, heartbeat(1)).ok());
  REQUIRE(server_rec.wait([&] { return !server_rec.frames.empty(); }));
  server->stop();
  // Keep writing into the closed connection until the transport says so.
  // (A write that reaches the dead socket first gets EPIPE; the transport
  // uses MSG_NOSIGNAL so that this is an error, not a SIGPIPE. That race is
  // rare here and was seen under TSan, in the kill -9 tests.)
  std::string chunk(1 << 16, 'x');
  troupe::Status last;
  for (int i = 0; i < 10000 && last.ok(); ++i) last = client->send(peer, heartbeat(i, chunk));
  CHECK(last.code() == ErrorCode::peer_lost);
  REQUIRE(client_rec.wait([&] { return !client_rec.lost.empty(); }));
  CHECK(client_rec.lost[0].first == peer);
  CHECK(client_rec.lost[0].second.code() == ErrorCode::peer_lost);
  CHECK(client->send(peer, heartbeat(2)).code() == ErrorCode::peer_lost);
}

TEST_CASE("tcp: connecting to a port nobody listens on reports the peer lost", "[transports][tcp]") {
  Recorder rec;
  auto t = make_tcp_transport(rec.events(), {});
  // Bind a port and close it again, so that nothing listens there.
  Recorder tmp_rec;
  auto tmp = make_tcp_transport(tmp_rec.events(), {});
  auto addr = tmp->listen(parse_endpoint("tcp://127.0.0.1:0").value()).value();
  tmp->stop();
  auto peer = t->connect(parse_endpoint(addr).value());
  REQUIRE(peer.has_value());
  REQUIRE(rec.wait([&] { return !rec.lost.empty(); }));
  CHECK(rec.lost[0].second.code() == ErrorCode::peer_lost);
}

TEST_CASE("addresses are parsed with clear errors", "[transports]") {
  auto e = parse_endpoint("ucx://10.0.0.1:7000").value();
  CHECK(e.scheme == "ucx");
  CHECK(e.host == "10.0.0.1");
  CHECK(e.port == 7000);
  CHECK(parse_endpoint("troupe://h:1/name").error().message().find("unknown scheme") != std::string::npos);
  CHECK(parse_endpoint("tcp://nohost").error().message().find("host:port") != std::string::npos);
  CHECK(parse_endpoint("tcp://h:99999").error().message().find("bad port") != std::string::npos);
}

