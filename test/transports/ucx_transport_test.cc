// The UCX transport driven directly: a large frame (a rendezvous) keeps its
// peer's allowance (Transport::arriving_until_us) from its announcement
// until the frame has been handed up, so the moment between the end of the
// receive and the layer above seeing the frame is not taken for silence.
// (Before, the allowance ended with the receive; a heartbeat sweep in that
// moment closed a live connection: a CI failure of remote_ucx_test.cc's
// 50 ms test.) The runtime-level tests: remote_ucx_test.cc.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

#include <catch2/catch.hpp>

#include "support/transport_recorder.h"
#include "transport.h"

using namespace std::chrono_literals;
using namespace troupe::transport;
using troupe::test::heartbeat;
using troupe::test::Recorder;

namespace {

int64_t steady_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TEST_CASE("ucx: a large frame keeps its peer's allowance until it has been handed up, and not after",
          "[transports][ucx]") {
  Recorder server_rec, client_rec;
  // The server's layer above holds the large frame until the test has
  // looked at the allowance.
  std::mutex mu;
  std::condition_variable cv;
  bool holding = false, release = false;
  Events events = server_rec.events();
  auto record = events.on_frame;
  events.on_frame = [&](PeerId p, InFrame f) {
    if (f.payload.size() > (1 << 20)) {
      std::unique_lock<std::mutex> l(mu);
      holding = true;
      cv.notify_all();
      cv.wait(l, [&] { return release; });
    }
    record(p, std::move(f));
  };
  auto server = make_ucx_transport(events, {});
  REQUIRE(server.has_value());
  auto client = make_ucx_transport(client_rec.events(), {});
  REQUIRE(client.has_value());
  auto addr = (*server)->listen(parse_endpoint("ucx://127.0.0.1:0").value());
  REQUIRE(addr.has_value());
  auto peer = (*client)->connect(parse_endpoint(*addr).value());
  REQUIRE(peer.has_value());
  REQUIRE((*client)->send(*peer, heartbeat(1)).ok());
  REQUIRE(server_rec.wait([&] { return server_rec.frames.size() == 1; }));
  const PeerId from = server_rec.frames[0].first;
  CHECK((*server)->arriving_until_us(from) == 0);  // nothing large on its way

  // 16 MiB (a rendezvous), then a small frame behind it.
  REQUIRE((*client)->send(*peer, heartbeat(2, std::string(16 << 20, 'x'))).ok());
  REQUIRE((*client)->send(*peer, heartbeat(3)).ok());
  {
    std::unique_lock<std::mutex> l(mu);
    REQUIRE(cv.wait_for(l, 30s, [&] { return holding; }));
  }
  // Received whole, not yet seen above: the peer still has its allowance.
  CHECK((*server)->arriving_until_us(from) > steady_us());
  {
    std::lock_guard<std::mutex> l(mu);
    release = true;
  }
  cv.notify_all();
  // The small frame is handed up after the large one's hand-up ended.
  REQUIRE(server_rec.wait([&] { return server_rec.frames.size() == 3; }, 30s));
  CHECK(server_rec.frames[1].second.payload.size() == (16u << 20));
  CHECK((*server)->arriving_until_us(from) == 0);
}
