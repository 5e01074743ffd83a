// The wire protocol's messages as plain C++ values. C++17-compatible on
// purpose: wire_capnp.cc, the only file that sees Cap'n Proto, includes it,
// and Cap'n Proto 0.9's headers do not build as C++20 under clang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>

namespace troupe::wire {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr uint32_t kFrameMagic = 0x31505254;  // "TRP1"
inline constexpr size_t kPrefixBytes = 16;

/// Bounds on what a peer may send. Anything larger closes the connection.
struct Limits {
  /// Largest Cap'n Proto header.
  size_t max_header_bytes = 1 << 20;
  /// Largest payload (a frame's raw bytes).
  uint64_t max_payload_bytes = uint64_t{1} << 30;
};

struct Hello {
  uint32_t protocol_version = kProtocolVersion;
  uint64_t node_id = 0;
  std::string token;
  std::string listen_address;
};

struct HelloReply {
  bool accepted = false;
  uint64_t node_id = 0;
  std::string listen_address;
  std::string error;
};

enum class EnvelopeKind : uint8_t { tell = 0, ask = 1, reply = 2, error = 3 };

/// The header of a user message or reply; its encoded fields are the payload.
struct EnvelopeHeader {
  EnvelopeKind kind = EnvelopeKind::tell;
  uint64_t source = 0;
  uint64_t destination = 0;
  uint64_t sequence = 0;
  uint64_t type_id = 0;
  uint64_t correlation = 0;
  uint8_t error_code = 0;
  std::string error_message;
};

struct Resolve {
  uint64_t correlation = 0;
  std::string name;
};

struct Resolved {
  uint64_t correlation = 0;
  uint64_t id = 0;
  std::string error;
};

struct MonitorRequest {
  uint64_t actor = 0;
};

struct DownNotice {
  uint64_t actor = 0;
  uint8_t reason_kind = 0;
  std::string reason;
};

struct RegionRequest {
  uint64_t correlation = 0;
  uint64_t region = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool write = false;
};

struct RegionResponse {
  uint64_t correlation = 0;
  std::string error;
};

struct Heartbeat {
  uint64_t time_us = 0;
};

struct Goodbye {
  std::string reason;
};

/// One decoded frame header.
using Message = std::variant<Hello, HelloReply, EnvelopeHeader, Resolve, Resolved, MonitorRequest, DownNotice,
                             RegionRequest, RegionResponse, Heartbeat, Goodbye>;

/// A short name of the message's kind, for logs ("envelope", "hello", ...).
const char* message_name(const Message& m);

/// Cap'n Proto encoding of a header (a whole number of 8-byte words).
std::string capnp_encode(const Message& m);

/// Decodes and validates `words` (8-byte aligned). False with `*error` set on
/// malformed or unknown input; never throws.
bool capnp_decode(const void* words, size_t word_count, Message* out, std::string* error);

}  // namespace troupe::wire
