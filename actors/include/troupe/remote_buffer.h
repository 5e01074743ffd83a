// Remote buffers (Monarch's RDMABuffer): register a memory region, send its
// handle inside any message, and read or write it from another process.
//
//   auto reg = rt.register_buffer(weights.data(), weights.size());   // owner
//   worker.tell(Load{reg->handle()});
//   ...
//   Status s = to_status(msg.buffer.read_into(local.data(), local.size()).get());   // elsewhere
//
// Over UCX a read or write is one-sided (RMA get / put with the region's
// packed remote key: RDMA on InfiniBand/RoCE, cross-memory attach or shared
// memory on one host); the owner's threads do nothing. Over TCP the runtime
// emulates it with request/response frames (the owner's network thread
// copies). Inside an actor, use read_buffer / write_buffer, which never block:
//
//   read_buffer(msg.buffer, n).then([this](Result<std::vector<std::byte>> r) {...});
//
// See docs/transports.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/actor.h"
#include "troupe/actor_ref.h"
#include "troupe/codec.h"
#include "troupe/future.h"
#include "troupe/status.h"

namespace troupe {

namespace detail {
class Node;
/// Reads (`write` false) or writes through `buffer`, completing `reply` (a
/// ReplyTo<void>) when done. `ptr` must stay valid until then.
void buffer_op(const RemoteBuffer& buffer, void* ptr, size_t n, uint64_t offset, bool write, ReplyRef reply);
}  // namespace detail

/// A handle to a registered region of another (or this) process. Cheap to
/// copy; valid while the owner keeps the registration.
class RemoteBuffer {
 public:
  RemoteBuffer() = default;

  /// Bytes in the region.
  uint64_t size() const { return size_; }
  /// The owner's network address.
  const std::string& owner() const { return owner_; }
  /// True for a handle that names a region.
  explicit operator bool() const { return region_ != 0; }

  /// Copies `n` bytes at `offset` of the region into `dst`. `dst` must stay
  /// valid until the future completes.
  Future<void> read_into(void* dst, size_t n, uint64_t offset = 0,
                         std::chrono::milliseconds timeout = kDefaultTimeout) const;
  /// Copies `n` bytes from `src` to `offset` of the region. `src` must stay
  /// valid until the future completes.
  Future<void> write_from(const void* src, size_t n, uint64_t offset = 0,
                          std::chrono::milliseconds timeout = kDefaultTimeout) const;

  /// Internal.
  RemoteBuffer(std::string owner, uint64_t region, uint64_t size, uint64_t address, std::string remote_key,
               std::shared_ptr<detail::Node> node)
      : owner_(std::move(owner)),
        region_(region),
        size_(size),
        address_(address),
        remote_key_(std::move(remote_key)),
        node_(std::move(node)) {}
  uint64_t region() const { return region_; }
  /// Internal: where the region starts in the owner, and the transport's key
  /// for one-sided access to it (empty: reads and writes go by frames).
  uint64_t address() const { return address_; }
  const std::string& remote_key() const { return remote_key_; }

 private:
  friend struct codec::Codec<RemoteBuffer>;
  friend class BufferRegistration;
  friend void detail::buffer_op(const RemoteBuffer&, void*, size_t, uint64_t, bool, detail::ReplyRef);
  std::string owner_;
  uint64_t region_ = 0;
  uint64_t size_ = 0;
  uint64_t address_ = 0;
  std::string remote_key_;
  std::shared_ptr<detail::Node> node_;  // the node that serves reads and writes
};

/// Owns a registration: the region is readable and writable through its
/// handles until this is destroyed (then they fail with not_found). For
/// Runtime::allocate_buffer it also owns the memory.
class BufferRegistration {
 public:
  BufferRegistration() = default;
  BufferRegistration(BufferRegistration&& o) noexcept
      : handle_(std::move(o.handle_)), data_(std::exchange(o.data_, nullptr)) {
    o.handle_ = {};
  }
  BufferRegistration& operator=(BufferRegistration&& o) noexcept {
    if (this != &o) {
      reset();
      handle_ = std::move(o.handle_);
      data_ = std::exchange(o.data_, nullptr);
      o.handle_ = {};
    }
    return *this;
  }
  ~BufferRegistration() { reset(); }

  /// The handle to put in messages.
  const RemoteBuffer& handle() const { return handle_; }
  /// The registered bytes in this process (handle().size() of them).
  void* data() const { return data_; }
  /// Ends the registration early (and frees allocate_buffer's memory).
  void reset();

  /// Internal.
  BufferRegistration(RemoteBuffer handle, void* data) : handle_(std::move(handle)), data_(data) {}

 private:
  RemoteBuffer handle_;
  void* data_ = nullptr;
};

/// A remote-buffer read (R = std::vector<std::byte>) or write (R = void)
/// started inside an actor; nothing moves until then() is called. The
/// operation owns its bytes.
template <class R>
class [[nodiscard]] BufferThen {
 public:
  /// Starts the operation. `fn(Result<R>)` runs later on this actor, like a
  /// handler, with the bytes (reads), or the error (timeout, peer_lost,
  /// invalid_argument, ...). It never runs if this incarnation has ended.
  template <class F>
  void then(F&& fn) && {
    auto wrap = [bytes = bytes_, keep = keep_, fn = std::forward<F>(fn)](Result<void> r) mutable {
      if constexpr (std::is_void_v<R>) {
        fn(std::move(r));
      } else if (r) {
        fn(Result<R>(std::move(*bytes)));
      } else {
        fn(Result<R>(Unexpected{r.error()}));
      }
    };
    using Node = detail::ActorReply<void, decltype(wrap)>;
    auto* node = new Node(detail::CellPtr(detail::control_of(cell_)), std::move(wrap));
    detail::ReplyRef reply(node);
    detail::track_ask(cell_, node, timeout_);
    detail::buffer_op(buffer_, ptr_, n_, offset_, std::is_void_v<R> && !into_, std::move(reply));
  }

  /// Internal.
  BufferThen(detail::Cell* cell, RemoteBuffer buffer, std::shared_ptr<std::vector<std::byte>> bytes,
             uint64_t offset, std::chrono::milliseconds timeout)
      : cell_(cell),
        buffer_(std::move(buffer)),
        bytes_(std::move(bytes)),
        ptr_(bytes_->data()),
        n_(bytes_->size()),
        offset_(offset),
        timeout_(timeout) {}
  /// Internal: a read into caller memory at `ptr`, owned by `keep`.
  BufferThen(detail::Cell* cell, RemoteBuffer buffer, std::shared_ptr<void> keep, void* ptr, size_t n,
             uint64_t offset, std::chrono::milliseconds timeout)
      : cell_(cell),
        buffer_(std::move(buffer)),
        keep_(std::move(keep)),
        ptr_(ptr),
        n_(n),
        offset_(offset),
        timeout_(timeout),
        into_(true) {}

 private:
  detail::Cell* cell_;
  RemoteBuffer buffer_;
  std::shared_ptr<std::vector<std::byte>> bytes_;
  std::shared_ptr<void> keep_;
  void* ptr_;
  size_t n_;
  uint64_t offset_;
  std::chrono::milliseconds timeout_;
  bool into_ = false;
};

inline BufferThen<std::vector<std::byte>> ActorBase::read_buffer(const RemoteBuffer& from, size_t n,
                                                                 uint64_t offset, std::chrono::milliseconds timeout) {
  return {cell_, from, std::make_shared<std::vector<std::byte>>(n), offset, resolve(timeout)};
}

inline BufferThen<void> ActorBase::write_buffer(const RemoteBuffer& to, std::vector<std::byte> bytes, uint64_t offset,
                                                std::chrono::milliseconds timeout) {
  return {cell_, to, std::make_shared<std::vector<std::byte>>(std::move(bytes)), offset, resolve(timeout)};
}

inline BufferThen<void> ActorBase::read_buffer_into(const RemoteBuffer& from, std::shared_ptr<void> keep, void* dst,
                                                   size_t n, uint64_t offset, std::chrono::milliseconds timeout) {
  return {cell_, from, std::move(keep), dst, n, offset, resolve(timeout)};
}

namespace detail {
/// Binds a decoded handle to the node decoding it (see CodecScope).
std::shared_ptr<Node> codec_node();
}  // namespace detail

namespace codec {
template <>
struct Codec<RemoteBuffer> {
  static void write(Writer& w, const RemoteBuffer& b) {
    codec::write(w, b.owner_);
    codec::write(w, b.region_);
    codec::write(w, b.size_);
    codec::write(w, b.address_);
    codec::write(w, b.remote_key_);
  }
  static bool read(Reader& r, RemoteBuffer& b) {
    if (!codec::read(r, b.owner_) || !codec::read(r, b.region_) || !codec::read(r, b.size_) ||
        !codec::read(r, b.address_) || !codec::read(r, b.remote_key_)) {
      return false;
    }
    b.node_ = detail::codec_node();
    return true;
  }
};
}  // namespace codec

}  // namespace troupe
