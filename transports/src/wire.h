// The wire protocol as plain C++ values, and their encoding. Cap'n Proto
// (transports/wire/troupe.capnp) is used only inside wire.cc: decoding
// validates a whole frame at once and turns it into these structs, so that
// no code above this file can meet a half-valid Cap'n Proto reader or one of
// its exceptions.
//
// Framing on byte streams (TCP): a 16-byte prefix
//   u32 magic "TRP1" | u32 header bytes | u64 payload bytes   (little endian)
// then the header (one Cap'n Proto message, unpacked, a whole number of
// 8-byte words), then the payload (raw bytes, may be empty). Message-based
// transports (UCX active messages) carry the header and payload as the AM
// header and data, without the prefix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "troupe/status.h"
#include "wire_types.h"

namespace troupe::wire {

/// Encodes a header (a whole number of 8-byte words).
std::string encode(const Message& m);

/// Decodes and fully validates a header. Malformed, truncated, oversized or
/// unknown input gives an error saying which; it never throws or crashes.
Result<Message> decode(std::span<const std::byte> header, const Limits& limits);

struct Prefix {
  uint32_t header_bytes = 0;
  uint64_t payload_bytes = 0;
};

/// Writes the 16-byte stream prefix.
void write_prefix(std::byte* out, uint32_t header_bytes, uint64_t payload_bytes);
/// Reads and checks a stream prefix (magic, bounds, word alignment).
Result<Prefix> read_prefix(std::span<const std::byte, kPrefixBytes> bytes, const Limits& limits);

}  // namespace troupe::wire
