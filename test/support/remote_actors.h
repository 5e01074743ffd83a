// Message types and actors shared by the remote tests and the peer process.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "troupe/troupe.h"

namespace troupe::test {

struct Echo {
  std::string text;
  TROUPE_MESSAGE(Echo, text);
};
/// Asks `to` (a Service) to echo `text` and answers with its reply: traffic
/// between two other processes.
struct Relay {
  AnyRef to;
  std::string text;
  TROUPE_MESSAGE(Relay, to, text);
};
struct Sum {
  std::vector<uint8_t> bytes;
  TROUPE_MESSAGE(Sum, bytes);
};
struct Record {
  int sender;
  int n;
  std::string pad{};  // makes some records large (rendezvous over UCX)
  TROUPE_MESSAGE(Record, sender, n, pad);
};
struct Check {
  TROUPE_MESSAGE(Check);
};
struct Nap {
  int ms;
  TROUPE_MESSAGE(Nap, ms);
};
struct Boom {
  TROUPE_MESSAGE(Boom);
};
struct Quit {
  TROUPE_MESSAGE(Quit);
};
/// Handled by nobody (but registered).
struct Stray {
  TROUPE_MESSAGE(Stray);
};
/// Not declared for the wire at all.
struct Local {
  int x;
};

/// Large payloads as troupe::Bytes between two ordinary fields.
struct Blobs {
  Bytes big;
  std::string tag;
  Bytes small;
  Bytes big2;
  TROUPE_MESSAGE(Blobs, big, tag, small, big2);
};
/// Answers with the Bytes it was given (a reply with a large Bytes field).
struct Mirror {
  Bytes data;
  TROUPE_MESSAGE(Mirror, data);
};
/// What a Service saw of a Blobs.
struct BlobReport {
  uint64_t big_sum = 0, small_sum = 0, big2_sum = 0;
  uint64_t big_size = 0, small_size = 0, big2_size = 0;
  std::string tag;
  bool big_aligned = false, big2_aligned = false;
  /// The two large fields are slices of one received frame (no copies).
  bool bigs_share_storage = false;
  TROUPE_FIELDS(big_sum, small_sum, big2_sum, big_size, small_size, big2_size, tag, big_aligned, big2_aligned,
                bigs_share_storage);
};
/// A position-weighted checksum (catches reordered or shifted bytes).
inline uint64_t weighted_sum(const Bytes& b) {
  uint64_t total = 0;
  for (size_t i = 0; i < b.size(); ++i) total += (i % 251 + 1) * static_cast<uint8_t>(b.data()[i]);
  return total;
}
inline bool aligned16(const Bytes& b) { return reinterpret_cast<uintptr_t>(b.data()) % 16 == 0; }

/// Order violations and count of Records seen, per sender FIFO.
struct Tally {
  int violations = 0;
  int received = 0;
  TROUPE_FIELDS(violations, received);
  friend bool operator==(const Tally&, const Tally&) = default;
};

class Service : public Actor<Service, Echo, Sum, Record, Check, Nap, Boom, Quit, Local, Relay, Blobs, Mirror> {
 public:
  std::string handle(const Echo& e) { return "echo: " + e.text; }
  BlobReport handle(const Blobs& b) {
    return BlobReport{weighted_sum(b.big),  weighted_sum(b.small),  weighted_sum(b.big2),
                      b.big.size(),         b.small.size(),         b.big2.size(),
                      b.tag,                aligned16(b.big),       aligned16(b.big2),
                      b.big.shares_storage_with(b.big2)};
  }
  Bytes handle(const Mirror& m) { return m.data; }
  Deferred<std::string> handle(const Relay& r) {
    auto reply = defer<std::string>();
    ask<std::string>(r.to, Echo{r.text}).then([reply](Result<std::string> s) mutable {
      if (s) {
        reply.complete(std::move(*s));
      } else {
        reply.fail(s.error());
      }
    });
    return reply;
  }
  uint64_t handle(const Sum& s) {
    uint64_t total = 0;
    for (uint8_t b : s.bytes) total += b;
    return total;
  }
  void handle(const Record& r) {
    if (last_.size() <= static_cast<size_t>(r.sender)) last_.resize(r.sender + 1, -1);
    if (r.n != last_[r.sender] + 1) ++tally_.violations;
    last_[r.sender] = r.n;
    ++tally_.received;
  }
  Tally handle(const Check&) { return tally_; }
  // Blocks on purpose: keeps an ask in flight while the test kills the peer.
  int handle(const Nap& n) {
    std::this_thread::sleep_for(std::chrono::milliseconds(n.ms));
    return n.ms;
  }
  int handle(const Boom&) { throw std::runtime_error("remote boom"); }
  void handle(const Quit&) { stop(); }
  int handle(const Local& l) { return l.x; }

 private:
  std::vector<int> last_;
  Tally tally_;
};

}  // namespace troupe::test

namespace troupe::test {

struct Notify {
  std::string what;
  TROUPE_MESSAGE(Notify, what);
};

/// Remembers who subscribed and tells them; answers with the ref it was given.
struct Subscribe {
  AnyRef who;
  TROUPE_MESSAGE(Subscribe, who);
};
struct Publish {
  std::string what;
  TROUPE_MESSAGE(Publish, what);
};
class Hub : public Actor<Hub, Subscribe, Publish> {
 public:
  AnyRef handle(const Subscribe& s) {
    subscribers_.push_back(s.who);
    return s.who;
  }
  int handle(const Publish& p) {
    for (auto& s : subscribers_) (void)s.tell(Notify{p.what});
    return static_cast<int>(subscribers_.size());
  }

 private:
  std::vector<AnyRef> subscribers_;
};

}  // namespace troupe::test

namespace troupe::test {

/// Hands out the handle of a buffer registered by its process.
struct GetBuffer {
  TROUPE_MESSAGE(GetBuffer);
};
class BufferKeeper : public Actor<BufferKeeper, GetBuffer> {
 public:
  explicit BufferKeeper(RemoteBuffer handle) : handle_(std::move(handle)) {}
  RemoteBuffer handle(const GetBuffer&) { return handle_; }

 private:
  RemoteBuffer handle_;
};

/// A runtime for the remote tests: on `transport`, listening on a free
/// loopback port (or, `listen` false, only dialing out), with `token`.
inline RuntimeConfig test_config(const std::string& transport = "tcp", bool listen = true,
                                 const std::string& token = "test-token") {
  RuntimeConfig cfg;
  if (listen) cfg.listen = transport + "://127.0.0.1:0";
  cfg.transport = transport;
  cfg.cluster_token = token;
  cfg.log_level = "warn";
  return cfg;
}

/// The byte at position i of the test buffers.
inline uint8_t pattern(size_t i) { return static_cast<uint8_t>((i * 131) ^ (i >> 7)); }

}  // namespace troupe::test
