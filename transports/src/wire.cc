#include "wire.h"

#include <cstring>
#include <iterator>
#include <memory>

namespace troupe::wire {

namespace {
void put_u32(std::byte* p, uint32_t v) { std::memcpy(p, &v, 4); }
void put_u64(std::byte* p, uint64_t v) { std::memcpy(p, &v, 8); }
}  // namespace

std::string encode(const Message& m) { return capnp_encode(m); }

Result<Message> decode(std::span<const std::byte> header, const Limits& limits) {
  if (header.empty()) return error(ErrorCode::invalid_argument, "frame: empty header");
  if (header.size() > limits.max_header_bytes) {
    return error(ErrorCode::invalid_argument, "frame: header of " + std::to_string(header.size()) +
                                                  " bytes exceeds the limit of " +
                                                  std::to_string(limits.max_header_bytes));
  }
  if (header.size() % 8 != 0) {
    return error(ErrorCode::invalid_argument,
                 "frame: header of " + std::to_string(header.size()) + " bytes is not a whole number of words");
  }
  // Cap'n Proto reads words in place: copy into aligned storage (on the
  // stack for the usual small header).
  size_t words = header.size() / 8;
  uint64_t small[32];
  std::unique_ptr<uint64_t[]> large;
  uint64_t* aligned = small;
  if (words > std::size(small)) {
    large.reset(new uint64_t[words]);
    aligned = large.get();
  }
  std::memcpy(aligned, header.data(), header.size());
  Message out;
  std::string err;
  if (!capnp_decode(aligned, words, &out, &err)) return error(ErrorCode::invalid_argument, std::move(err));
  return out;
}

void write_prefix(std::byte* out, uint32_t header_bytes, uint64_t payload_bytes) {
  put_u32(out, kFrameMagic);
  put_u32(out + 4, header_bytes);
  put_u64(out + 8, payload_bytes);
}

Result<Prefix> read_prefix(std::span<const std::byte, kPrefixBytes> bytes, const Limits& limits) {
  uint32_t magic = 0;
  Prefix p;
  std::memcpy(&magic, bytes.data(), 4);
  std::memcpy(&p.header_bytes, bytes.data() + 4, 4);
  std::memcpy(&p.payload_bytes, bytes.data() + 8, 8);
  if (magic != kFrameMagic) {
    return error(ErrorCode::invalid_argument, "frame: bad magic (not a troupe peer, or the stream lost sync)");
  }
  if (p.header_bytes == 0 || p.header_bytes % 8 != 0 || p.header_bytes > limits.max_header_bytes) {
    return error(ErrorCode::invalid_argument,
                 "frame: header size " + std::to_string(p.header_bytes) + " is zero, unaligned or over the limit of " +
                     std::to_string(limits.max_header_bytes));
  }
  if (p.payload_bytes > limits.max_payload_bytes) {
    return error(ErrorCode::invalid_argument, "frame: payload of " + std::to_string(p.payload_bytes) +
                                                  " bytes exceeds max_frame_bytes (" +
                                                  std::to_string(limits.max_payload_bytes) + ")");
  }
  return p;
}

}  // namespace troupe::wire
