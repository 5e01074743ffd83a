// The transport interface: frames between this process and its peers. A
// transport knows connections and bytes, not actors; the handshake, auth,
// heartbeats and sequence numbers live one level up (network.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/codec.h"
#include "troupe/status.h"
#include "wire.h"

namespace troupe::transport {

/// A connection, process-unique, never reused.
using PeerId = uint64_t;

/// A frame on its way out: an encoded header (wire::encode) and its payload,
/// which is `payload` with every splice's bytes inserted at its offset. The
/// transport sends the splices from where they lie (a gather list), so large
/// Bytes fields are never copied into the frame.
struct OutFrame {
  std::string header;
  std::string payload;
  std::vector<codec::Splice> splices{};

  /// The payload's size on the wire.
  size_t payload_bytes() const {
    size_t n = payload.size();
    for (const codec::Splice& s : splices) n += s.bytes.size();
    return n;
  }
  /// Calls fn(data, size) for the payload's pieces in order (see
  /// codec::for_each_piece).
  template <class Fn>
  void for_each_piece(Fn&& fn) const {
    codec::for_each_piece(payload, splices, std::forward<Fn>(fn));
  }
  /// Copies the splices into `payload` (for frames small enough that one
  /// copy costs less than a gather).
  void flatten() {
    if (splices.empty()) return;
    payload = codec::flatten(std::move(payload), splices);
    splices.clear();
  }
};

/// A frame that arrived, with its header already decoded and validated.
struct InFrame {
  wire::Message message;
  std::string payload;
};

/// "host:port" split, from "tcp://host:port", "ucx://host:port" or "host:port".
struct Endpoint {
  std::string scheme;  // "tcp", "ucx" or "" when none was given
  std::string host;
  uint16_t port = 0;
  std::string to_uri() const;
};
/// Parses an address; the error says what is wrong with it.
Result<Endpoint> parse_endpoint(const std::string& uri);

/// What a transport reports. Called one at a time, on the transport's own
/// thread or on a thread inside poll(); keep them short (hand work to actors).
struct Events {
  /// A frame arrived on `peer`. Frames of one peer arrive in order.
  std::function<void(PeerId peer, InFrame frame)> on_frame;
  /// An outbound connection is established, or an inbound one accepted.
  std::function<void(PeerId peer, bool inbound)> on_connected;
  /// The connection is gone (closed, reset, refused, malformed input). Called
  /// once per peer; nothing is delivered for it afterwards.
  std::function<void(PeerId peer, Status why)> on_lost;
  /// Part of a frame arrived (a large frame is still coming): the peer is
  /// alive even though no whole frame has landed for a while. At most
  /// about every kActivityInterval per connection. Optional.
  std::function<void(PeerId peer)> on_activity;
};

/// How often on_activity is reported, at most, per connection.
inline constexpr std::chrono::milliseconds kActivityInterval{100};

/// A memory region registered for one-sided access by peers.
struct MemoryRegion {
  uint64_t id = 0;           // for deregister_memory
  uint64_t address = 0;      // where it starts, in the owner's address space
  std::string remote_key;    // what a peer needs to reach it (UCX: a packed rkey)
  void* data = nullptr;      // the memory (allocate_memory: where it was put)
};

/// Called once when a one-sided operation completes or fails.
using RmaDone = std::function<void(Status)>;

/// Bounds that protect a process from its peers.
struct TransportLimits {
  wire::Limits frame;
  /// Bytes a connection may have queued for sending before send() refuses.
  size_t max_send_queue_bytes = size_t{2} << 30;
  /// The slowest rate a frame that arrives without visible progress (UCX
  /// rendezvous) is given before its peer may count as hung; 0: none.
  uint64_t slowest_frame_bytes_per_s = uint64_t{64} << 20;
};

class Transport {
 public:
  virtual ~Transport() = default;

  /// Starts accepting connections; port 0 picks a free one. Returns the
  /// address peers should dial ("tcp://127.0.0.1:41234").
  virtual Result<std::string> listen(const Endpoint& at) = 0;
  /// Starts connecting; on_connected or on_lost follows. Frames sent before
  /// the connection is up are queued.
  virtual Result<PeerId> connect(const Endpoint& to) = 0;
  /// Queues a frame; thread-safe; frames to one peer leave in call order.
  /// Fails with peer_lost for a closed peer and mailbox_full when its send
  /// queue is at its bound.
  virtual Status send(PeerId peer, OutFrame frame) = 0;
  /// Closes a connection (on_lost follows with `why`).
  virtual void close(PeerId peer, std::string why) = 0;
  /// Stops the transport thread and closes everything. Idempotent.
  virtual void stop() = 0;
  /// "tcp" or "ucx".
  virtual const char* scheme() const = 0;
  /// Until when (steady clock, microseconds since its epoch) `peer` may be
  /// silent because a frame is still arriving from it that the transport
  /// sees no progress of: its bytes at TransportLimits::
  /// slowest_frame_bytes_per_s. 0 when there is none (TCP reports progress
  /// through on_activity instead).
  virtual int64_t arriving_until_us(PeerId) { return 0; }

  /// Registers [data, data + size) for one-sided reads and writes by peers.
  /// Fails with unsupported where the transport has no one-sided access
  /// (TCP: the layer above emulates it with frames).
  virtual Result<MemoryRegion> register_memory(void* data, size_t size) = 0;
  /// Allocates `size` bytes registered for one-sided access, where the
  /// transport can serve them best (UCX: shared memory that a peer on the
  /// same host maps, so that its reads are plain copies); `data` says where.
  /// deregister_memory frees them. Fails with unsupported like
  /// register_memory.
  virtual Result<MemoryRegion> allocate_memory(size_t size) = 0;
  /// Ends a registration, freeing allocate_memory's memory (a no-op for
  /// unknown ids).
  virtual void deregister_memory(uint64_t id) = 0;
  /// Reads (`write` false) `n` bytes at `remote_address` of the peer's
  /// region into `local`, or writes them from `local`. `done` runs once, on
  /// a thread that progresses the transport, or on the caller's when the
  /// operation completes at once (a same-host region mapped directly: the
  /// caller's thread does the copy); for writes it means the bytes are in
  /// the peer's memory, not only that `local` may be reused. `local` must
  /// stay valid until then. Errors come back through `done` too.
  virtual void rma(PeerId peer, bool write, void* local, size_t n, uint64_t remote_address,
                   const std::string& remote_key, RmaDone done) = 0;

  /// Progress on the calling thread, without blocking: receives what has
  /// arrived and hands it up (Events) from this thread. Does nothing when
  /// another thread is progressing. True when something happened. For idle
  /// scheduler threads; see progress_gate.h.
  virtual bool poll() = 0;
  /// A thread starts (true) or stops (false) calling poll() in a loop; while
  /// one does, the transport's own thread sleeps. `idle` on stopping: the
  /// thread found nothing to do (the transport thread takes over at once).
  virtual void spin(bool on, bool idle) = 0;
};

/// TCP: epoll, non-blocking sockets, length-prefixed frames.
std::unique_ptr<Transport> make_tcp_transport(Events events, TransportLimits limits);

/// UCX: active messages (eager or rendezvous by size), client-server
/// endpoints with peer error handling, a progress thread that sleeps on the
/// worker's wakeup fd. Fails when UCX cannot initialise.
Result<std::unique_ptr<Transport>> make_ucx_transport(Events events, TransportLimits limits);

}  // namespace troupe::transport
