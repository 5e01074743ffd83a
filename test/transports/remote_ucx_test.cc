// Remote actors over the UCX transport (shared memory or TCP underneath, as
// UCX_TLS and the machine allow): the same behaviour as over TCP.
#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support/peer_process.h"
#include "support/remote_actors.h"

using namespace std::chrono_literals;
using namespace troupe::test;
using troupe::ErrorCode;

namespace {
troupe::RuntimeConfig ucx(std::string token = "test-token", bool listen = true) {
  troupe::RuntimeConfig cfg;
  if (listen) cfg.listen = "ucx://127.0.0.1:0";
  cfg.transport = "ucx";
  cfg.cluster_token = std::move(token);
  cfg.log_level = "warn";
  return cfg;
}
}  // namespace

TEST_CASE("ucx: tell and ask across runtimes, payloads up to 64 MiB (rendezvous)", "[remote][ucx]") {
  troupe::Runtime server(ucx());
  troupe::Runtime client(ucx("test-token", false));
  REQUIRE(server.address().rfind("ucx://", 0) == 0);
  REQUIRE(server.publish("service", server.spawn<Service>()).ok());
  auto remote = client.resolve<Service>(server.address() + "/service");
  REQUIRE(remote.has_value());
  CHECK(remote->ask(Echo{"over ucx"}).get().value() == "echo: over ucx");
  for (size_t size : {size_t{0}, size_t{8}, size_t{64} << 10, size_t{64} << 20}) {
    std::vector<uint8_t> bytes(size);
    uint64_t sum = 0;
    for (size_t i = 0; i < size; ++i) sum += bytes[i] = static_cast<uint8_t>(i * 17 + 3);
    auto r = remote->ask(Sum{std::move(bytes)}, 60s).get();
    REQUIRE(r.has_value());
    CHECK(*r == sum);
  }
}

TEST_CASE("ucx: per-sender order holds for concurrent senders", "[remote][ucx]") {
  troupe::Runtime server(ucx());
  troupe::Runtime client(ucx("test-token", false));
  REQUIRE(server.publish("service", server.spawn<Service>()).ok());
  auto remote = client.resolve<Service>(server.address() + "/service").value();
  constexpr int kSenders = 4, kEach = 2000;
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < kSenders; ++s) {
    threads.emplace_back([&, s] {
      for (int n = 0; n < kEach; ++n) {
        if (!remote.tell(Record{s, n}).ok()) refused.fetch_add(1);
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

TEST_CASE("ucx: a wrong token is refused", "[remote][ucx]") {
  troupe::Runtime server(ucx("right"));
  troupe::Runtime client(ucx("wrong", false));
  REQUIRE(server.publish("service", server.spawn<Service>()).ok());
  auto r = client.resolve_any(server.address() + "/service", 5s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::refused);
}

TEST_CASE("ucx: kill -9 of the peer process fails pending asks with peer_lost within a second", "[remote][ucx]") {
  PeerProcess peer("test-token", "ucx");
  REQUIRE(peer.address().rfind("ucx://", 0) == 0);
  troupe::Runtime client(ucx("test-token", false));
  auto remote = client.resolve<Service>(peer.address() + "/service");
  REQUIRE(remote.has_value());
  REQUIRE(remote->ask(Echo{"alive?"}).get().value() == "echo: alive?");
  auto pending = remote->ask(Nap{30'000}, 30s);
  auto t0 = std::chrono::steady_clock::now();
  peer.kill9();
  auto r = pending.get();
  auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::peer_lost);
  INFO("detected after " << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count() << " ms");
  CHECK(waited < 1s);
}

TEST_CASE("ucx: messages of every small size arrive (UCX 1.13 short-protocol bug worked around)", "[remote][ucx]") {
  troupe::Runtime server(ucx());
  troupe::Runtime client(ucx("test-token", false));
  REQUIRE(server.publish("service", server.spawn<Service>()).ok());
  auto remote = client.resolve<Service>(server.address() + "/service").value();
  int failed = 0;
  for (size_t n = 0; n < 600; ++n) {
    auto r = remote.ask(Echo{std::string(n, 'a')}, 5s).get();
    if (!r || r->size() != n + 6) ++failed;
  }
  CHECK(failed == 0);
}
