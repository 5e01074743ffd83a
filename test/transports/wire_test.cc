// The wire codec: every frame kind round-trips, and bad input of every sort
// is an error value, never a crash. Replays the fuzzing corpus.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "fuzz/wire_samples.h"
#include "wire.h"

using namespace troupe::wire;

namespace {

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// The fuzz target's logic, for replaying its corpus.
void decode_any(const std::string& input) {
  Limits limits;
  limits.max_header_bytes = 1 << 16;
  auto bytes = as_bytes(input);
  if (bytes.size() >= kPrefixBytes) {
    auto prefix = read_prefix(bytes.first<kPrefixBytes>(), limits);
    if (prefix && bytes.size() - kPrefixBytes >= prefix->header_bytes) {
      (void)decode(bytes.subspan(kPrefixBytes).first(prefix->header_bytes), limits);
    }
  }
  (void)decode(bytes, limits);
}

}  // namespace

TEST_CASE("every frame kind survives an encode/decode round trip", "[transports][wire]") {
  std::vector<Message> samples = troupe::wire::samples();
  for (const auto& m : samples) {
    std::string header = encode(m);
    CHECK(header.size() % 8 == 0);
    auto back = decode(as_bytes(header), Limits{});
    REQUIRE(back.has_value());
    CHECK(back->index() == m.index());
  }
  auto e = decode(as_bytes(encode(samples[3])), Limits{});
  const auto& env = std::get<EnvelopeHeader>(*e);
  CHECK(env.kind == EnvelopeKind::error);
  CHECK(env.correlation == 42);
  CHECK(env.error_message == "dead");
  auto h = std::get<Hello>(*decode(as_bytes(encode(samples[0])), Limits{}));
  CHECK(h.token == std::string("tok\0en", 6));
}

TEST_CASE("a stream prefix with bad magic, bad sizes or an oversized payload is refused", "[transports][wire]") {
  Limits limits;
  limits.max_header_bytes = 1024;
  limits.max_payload_bytes = 1 << 20;
  std::byte p[kPrefixBytes];
  write_prefix(p, 64, 100);
  REQUIRE(read_prefix(std::span<const std::byte, kPrefixBytes>(p), limits).has_value());
  write_prefix(p, 60, 0);  // not whole words
  CHECK_FALSE(read_prefix(std::span<const std::byte, kPrefixBytes>(p), limits).has_value());
  write_prefix(p, 2048, 0);  // header over the limit
  CHECK_FALSE(read_prefix(std::span<const std::byte, kPrefixBytes>(p), limits).has_value());
  write_prefix(p, 64, uint64_t{1} << 40);  // payload over the limit
  auto big = read_prefix(std::span<const std::byte, kPrefixBytes>(p), limits);
  REQUIRE_FALSE(big.has_value());
  CHECK_THAT(big.error().message(), Catch::Contains("max_frame_bytes"));
  std::memcpy(p, "HTTP", 4);
  auto magic = read_prefix(std::span<const std::byte, kPrefixBytes>(p), limits);
  REQUIRE_FALSE(magic.has_value());
  CHECK_THAT(magic.error().message(), Catch::Contains("magic"));
}

TEST_CASE("truncated, corrupted and random headers decode to errors", "[transports][wire]") {
  std::string good = encode(EnvelopeHeader{EnvelopeKind::ask, 1, 2, 3, 4, 5, 0, "some text here"});
  // Every truncation to a whole number of words.
  for (size_t n = 8; n < good.size(); n += 8) {
    auto r = decode(as_bytes(good.substr(0, n)), Limits{});
    CHECK_FALSE(r.has_value());
  }
  CHECK_FALSE(decode(as_bytes(good.substr(0, 12)), Limits{}).has_value());  // not whole words
  CHECK_FALSE(decode({}, Limits{}).has_value());
  // An unknown frame kind (a union discriminant past the last field). The
  // root's data section starts after the 8-byte segment table and the 8-byte
  // root pointer; the discriminant is its first 16 bits.
  std::string unknown = encode(Heartbeat{1});
  uint16_t bad = 999;
  std::memcpy(unknown.data() + 16, &bad, 2);
  auto u = decode(as_bytes(unknown), Limits{});
  REQUIRE_FALSE(u.has_value());
  CHECK_THAT(u.error().message(), Catch::Contains("unknown frame kind 999"));
  // Random bytes, seeded: almost none of them are valid frames, and none may
  // crash the decoder (this test failing means a crash, or a random buffer
  // that parsed as a frame, which would be suspicious).
  std::mt19937_64 rng(12345);
  int accepted_junk = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string junk(8 * (1 + rng() % 32), '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    if (decode(as_bytes(junk), Limits{}).has_value()) ++accepted_junk;
    std::string corrupted = good;
    corrupted[rng() % corrupted.size()] = static_cast<char>(rng());
    (void)decode(as_bytes(corrupted), Limits{});
  }
  CHECK(accepted_junk < 20);
}

TEST_CASE("the fuzzing corpus replays without a crash and its seeds decode", "[transports][wire]") {
  namespace fs = std::filesystem;
  fs::path dir = TROUPE_WIRE_CORPUS_DIR;
  REQUIRE(fs::is_directory(dir));
  size_t files = 0, seeds = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::string input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    decode_any(input);
    ++files;
    if (entry.path().filename().string().rfind("seed-", 0) == 0) {
      ++seeds;
      auto bytes = as_bytes(input);
      REQUIRE(bytes.size() >= kPrefixBytes);
      auto prefix = read_prefix(bytes.first<kPrefixBytes>(), Limits{});
      REQUIRE(prefix.has_value());
      CHECK(decode(bytes.subspan(kPrefixBytes, prefix->header_bytes), Limits{}).has_value());
    }
  }
  CHECK(files > 20);
  CHECK(seeds == 12);
}
