// troupe::Bytes: large message fields that cross processes without being
// copied into or out of frames. The codec (splices on the way out, slices of
// the received frame on the way in, 16-byte alignment, bad padding), both
// transports' gather sends, and whole messages and replies between processes.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "receive_pool.h"

#include "support/peer_process.h"
#include "support/remote_actors.h"
#include "support/transport_recorder.h"
#include "transport.h"
#include "troupe/bytes.h"
#include "troupe/codec.h"

using namespace std::chrono_literals;
using namespace troupe::test;
using troupe::Bytes;
using troupe::codec::Splice;

namespace {

/// `n` bytes of a pattern that differs with `seed` and with the position.
Bytes pattern(size_t n, unsigned seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 2654435761u >> 11) + seed * 97);
  return Bytes(std::move(s));
}

struct Packet {
  uint8_t flag = 0;
  Bytes big;
  std::string name;
  Bytes small;
  std::vector<Bytes> parts;
  TROUPE_FIELDS(flag, big, name, small, parts);
};

struct One {
  uint8_t x = 0;
  Bytes b;
  TROUPE_FIELDS(x, b);
};

}  // namespace

TEST_CASE("bytes: large fields are spliced on encode and sliced on decode, and the flat encoding is the same either way",
          "[transports][codec]") {
  Packet p{7, pattern(300'000, 1), "abc", pattern(100, 2), {pattern(70'000, 3), pattern(10, 4), pattern(65'536, 5)}};

  std::string flat = troupe::codec::encode(p);  // no splice list: everything copied in
  std::string body;
  std::vector<Splice> splices;
  troupe::codec::Writer w(body, &splices);
  troupe::codec::write(w, p);
  // The three fields of 64 KiB or more went to the splice list, in order;
  // the small ones were copied into the body.
  REQUIRE(splices.size() == 3);
  CHECK(splices[0].bytes.shares_storage_with(p.big));
  CHECK(splices[1].bytes.shares_storage_with(p.parts[0]));
  CHECK(splices[2].bytes.shares_storage_with(p.parts[2]));
  CHECK(body.size() + 300'000 + 70'000 + 65'536 == flat.size());
  CHECK(troupe::codec::flatten(body, splices) == flat);

  // Decoded with the buffer's owner: large fields are slices of it, 16-byte
  // aligned within it; small ones are copies (they must not pin the frame).
  auto owner = std::make_shared<const std::string>(flat);
  auto* base = owner->data();
  auto got = troupe::codec::decode<Packet>(*owner, owner);
  REQUIRE(got.has_value());
  CHECK(got->flag == 7);
  CHECK(got->name == "abc");
  CHECK(got->big == p.big);
  CHECK(got->small == p.small);
  REQUIRE(got->parts.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(got->parts[i] == p.parts[i]);
  for (const Bytes* b : {&got->big, &got->parts[0], &got->parts[2]}) {
    CHECK(b->data() >= base);
    CHECK(b->data() + b->size() <= base + owner->size());
    CHECK((b->data() - base) % Bytes::kAlignment == 0);
  }
  CHECK(got->big.shares_storage_with(got->parts[0]));
  CHECK((got->small.data() < base || got->small.data() >= base + owner->size()));
  CHECK((got->parts[1].data() < base || got->parts[1].data() >= base + owner->size()));

  // Without an owner every field is a copy, and still equal.
  auto copied = troupe::codec::decode<Packet>(flat);
  REQUIRE(copied.has_value());
  CHECK(copied->big == p.big);
  CHECK_FALSE(copied->big.shares_storage_with(copied->parts[0]));
}

TEST_CASE("bytes: padding that is not zero, a length past the end and a truncated field are refused",
          "[transports][codec]") {
  std::string good = troupe::codec::encode(One{1, Bytes(std::string("hello"))});
  // u8, u32 length, then zeros up to offset 16, then the 5 bytes.
  REQUIRE(good.size() == 16 + 5);
  REQUIRE(troupe::codec::decode<One>(good).has_value());

  std::string bad_pad = good;
  bad_pad[9] = 1;
  auto r1 = troupe::codec::decode<One>(bad_pad);
  REQUIRE_FALSE(r1.has_value());
  CHECK(r1.error().code() == troupe::ErrorCode::malformed);
  CHECK_THAT(r1.error().message(), Catch::Contains("padding"));

  std::string long_len = good;
  long_len[1] = static_cast<char>(0xff);  // length 255 with 5 bytes left
  auto r2 = troupe::codec::decode<One>(long_len);
  REQUIRE_FALSE(r2.has_value());
  CHECK_THAT(r2.error().message(), Catch::Contains("exceeds the bytes left"));

  auto r3 = troupe::codec::decode<One>(std::string_view(good).substr(0, 12));
  REQUIRE_FALSE(r3.has_value());
  CHECK_THAT(r3.error().message(), Catch::Contains("truncated"));
}

TEST_CASE("bytes: a frame with splices arrives as its body with every splice in place, in order with small frames, "
          "on both transports",
          "[transports]") {
  std::string scheme = GENERATE(as<std::string>{}, "tcp", "ucx");
  INFO("transport " << scheme);
  Recorder server_rec, client_rec;
  auto make = [&](Recorder& r) {
    if (scheme == "tcp") return troupe::transport::make_tcp_transport(r.events(), {});
    return std::move(troupe::transport::make_ucx_transport(r.events(), {}).value());
  };
  auto server = make(server_rec);
  auto client = make(client_rec);
  auto addr = server->listen(troupe::transport::parse_endpoint(scheme + "://127.0.0.1:0").value()).value();
  auto peer = client->connect(troupe::transport::parse_endpoint(addr).value()).value();

  // Splices at the start, two at one offset, one empty, one at the end; and
  // a frame of 100 splices (more than one sendmsg's gather list takes).
  std::vector<troupe::transport::OutFrame> frames;
  frames.push_back(heartbeat(0, "small before"));
  auto mixed = heartbeat(1, std::string(40, 'b'));
  mixed.splices = {{0, pattern(100'000, 1)}, {10, pattern(1 << 20, 2)}, {10, pattern(70'000, 3)},
                   {20, Bytes()},            {40, pattern(3 << 20, 4)}};
  frames.push_back(std::move(mixed));
  frames.push_back(heartbeat(2, "small between"));
  auto many = heartbeat(3, std::string(200, 'm'));
  for (unsigned i = 0; i < 100; ++i) many.splices.push_back({i * 2, pattern(70'000 + i, i)});
  frames.push_back(std::move(many));
  frames.push_back(heartbeat(4, "small after"));

  std::vector<std::string> expected;
  for (const auto& f : frames) expected.push_back(troupe::codec::flatten(f.payload, f.splices));
  for (auto& f : frames) REQUIRE(client->send(peer, std::move(f)).ok());
  REQUIRE(server_rec.wait([&] { return server_rec.frames.size() == expected.size(); }, 60s));
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("frame " << i);
    CHECK(beat(server_rec.frames[i].second) == i);
    CHECK(server_rec.frames[i].second.payload == expected[i]);
  }
  client->stop();
  server->stop();
}

TEST_CASE("bytes: a message with large Bytes fields reaches another process intact, as aligned slices of one frame, "
          "and comes back in a reply, on both transports",
          "[remote][ucx]") {
  std::string scheme = GENERATE(as<std::string>{}, "tcp", "ucx");
  INFO("transport " << scheme);
  PeerProcess peer("test-token", scheme);
  troupe::Runtime client(test_config(scheme, false));
  auto remote = client.resolve<Service>(peer.address() + "/service").value();
  for (size_t size : {size_t{0}, size_t{1000}, size_t{64} << 10, size_t{5} << 20, size_t{40} << 20}) {
    INFO("size " << size);
    Blobs b{pattern(size, 1), "tag", pattern(300, 2), pattern(size / 2 + 3, 3)};
    auto report = remote.ask(b, 60s).get();
    REQUIRE(report.has_value());
    CHECK(report->big_size == size);
    CHECK(report->big_sum == weighted_sum(b.big));
    CHECK(report->small_sum == weighted_sum(b.small));
    CHECK(report->big2_sum == weighted_sum(b.big2));
    CHECK(report->tag == "tag");
    // Slices of the frame when large (64 KiB or more), aligned either way.
    bool both_large = size >= Bytes::kZeroCopyMinBytes && size / 2 + 3 >= Bytes::kZeroCopyMinBytes;
    CHECK(report->bigs_share_storage == both_large);
    if (size > 0) CHECK(report->big_aligned);
    CHECK(report->big2_aligned);

    auto back = remote.ask(Mirror{b.big}, 60s).get();
    REQUIRE(back.has_value());
    CHECK(*back == b.big);
    if (size > 0) CHECK(aligned16(*back));
  }
}

TEST_CASE("bytes: a large frame's receive buffer serves a later frame once its last slice is dropped, never "
          "while one lives, on both transports",
          "[remote][ucx]") {
  std::string scheme = GENERATE(as<std::string>{}, "tcp", "ucx");
  INFO("transport " << scheme);
  PeerProcess peer("test-token", scheme);
  troupe::Runtime client(test_config(scheme, false));
  auto remote = client.resolve<Service>(peer.address() + "/service").value();
  Bytes sent = pattern(size_t{5} << 20, 7);
  troupe::detail::drain_receive_pool();
  const auto start = troupe::detail::receive_pool_stats();
  // Each reply is a slice of its frame's buffer (docs/transports.md): the
  // first is held while the second comes, so the second cannot reuse it.
  auto first = remote.ask(Mirror{sent}, 60s).get();
  REQUIRE(first.has_value());
  auto second = remote.ask(Mirror{sent}, 60s).get();
  REQUIRE(second.has_value());
  CHECK_FALSE(first->shares_storage_with(*second));
  CHECK(*first == sent);
  CHECK(*second == sent);
  CHECK(troupe::detail::receive_pool_stats().reused == start.reused);
  const char* first_at = first->data();
  const char* second_at = second->data();
  // Dropped: both buffers go back, and the next reply lands in one of them.
  first = troupe::Result<Bytes>(Bytes());
  second = troupe::Result<Bytes>(Bytes());
  CHECK(troupe::detail::receive_pool_stats().kept == 2);
  auto third = remote.ask(Mirror{sent}, 60s).get();
  REQUIRE(third.has_value());
  CHECK(*third == sent);
  CHECK(troupe::detail::receive_pool_stats().reused == start.reused + 1);
  // The same storage, at the same place in the frame.
  CHECK((third->data() == first_at || third->data() == second_at));
}

TEST_CASE("bytes: within a process a Bytes field is shared, not copied", "[remote]") {
  troupe::Runtime rt(test_config("tcp", false));
  auto service = rt.spawn<Service>();
  Bytes big = pattern(1 << 20, 9);
  auto back = service.ask(Mirror{big}).get();
  REQUIRE(back.has_value());
  CHECK(back->shares_storage_with(big));
}
