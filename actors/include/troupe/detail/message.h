// Internal: how a message travels inside one process. A user message is moved
// into a MessageBox (inline when small), wrapped in an Envelope with an
// optional reply slot, and handed to the target cell's mailbox. Nothing here
// names CAF: the cell implementation (actors/src/cell.*) does.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <typeinfo>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/codec.h"
#include "troupe/status.h"

namespace troupe {
class ActorBase;
}

namespace troupe::detail {

/// Identifies a C++ type within this process: the address of a per-type tag.
using TypeKey = const void*;

template <class T>
struct TypeTag {
  static constexpr char id = 0;
};

template <class T>
constexpr TypeKey type_key() {
  return &TypeTag<std::remove_cvref_t<T>>::id;
}

/// Demangled, human-readable name of a type (for error messages).
std::string demangle(const char* mangled);

template <class T>
const std::string& type_name() {
  static const std::string name = demangle(typeid(T).name());
  return name;
}

/// Type-erased operations of one message type.
struct BoxOps {
  TypeKey key;
  const std::string& (*name)();
  void (*destroy)(void* obj, bool inline_stored) noexcept;
  void (*move_inline)(void* dst, void* src) noexcept;  // only for inline types
  /// Inline and trivially copyable: moved by memcpy, destroyed by nothing.
  /// Most messages are small plain structs, and this keeps indirect calls
  /// off the per-message path.
  bool trivial;
  /// Wire id (codec::type_id of its TROUPE_MESSAGE name); 0 when the type
  /// cannot leave the process.
  uint64_t wire_id;
  /// Writes the encoded message; null when the type has no codec.
  void (*encode)(const void* obj, codec::Writer& w);
};

/// Message types declared with TROUPE_MESSAGE carry a name for the wire.
template <class T>
concept WireMessage = requires {
  { T::troupe_name() } -> std::convertible_to<std::string_view>;
} && codec::Codable<T>;

inline constexpr size_t kInlineMessageBytes = 48;

template <class T>
constexpr bool kStoredInline = sizeof(T) <= kInlineMessageBytes &&
                               alignof(T) <= alignof(std::max_align_t) &&
                               std::is_nothrow_move_constructible_v<T>;

template <class T>
const BoxOps* box_ops() {
  static constexpr BoxOps ops{
      type_key<T>(),
      &type_name<T>,
      [](void* obj, bool inline_stored) noexcept {
        if (inline_stored) {
          static_cast<T*>(obj)->~T();
        } else {
          delete static_cast<T*>(obj);
        }
      },
      [](void* dst, void* src) noexcept {
        if constexpr (kStoredInline<T>) {
          new (dst) T(std::move(*static_cast<T*>(src)));
          static_cast<T*>(src)->~T();
        }
      },
      kStoredInline<T> && std::is_trivially_copyable_v<T>,
      [] {
        if constexpr (WireMessage<T>) {
          return codec::type_id(T::troupe_name());
        } else {
          return uint64_t{0};
        }
      }(),
      [] {
        if constexpr (WireMessage<T>) {
          return +[](const void* obj, codec::Writer& w) { codec::write(w, *static_cast<const T*>(obj)); };
        } else {
          return static_cast<void (*)(const void*, codec::Writer&)>(nullptr);
        }
      }(),
  };
  return &ops;
}

/// Owns one message of any type; small nothrow-movable messages live inline so
/// that a send costs one allocation (the mailbox element), like raw CAF.
class MessageBox {
 public:
  MessageBox() = default;

  template <class T>
  static MessageBox make(T&& value) {
    using V = std::remove_cvref_t<T>;
    MessageBox b;
    b.ops_ = box_ops<V>();
    if constexpr (kStoredInline<V>) {
      new (b.buf_) V(std::forward<T>(value));
      b.heap_ = nullptr;
    } else {
      b.heap_ = new V(std::forward<T>(value));
    }
    return b;
  }

  MessageBox(MessageBox&& other) noexcept { take(other); }
  MessageBox& operator=(MessageBox&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }
  MessageBox(const MessageBox&) = delete;
  MessageBox& operator=(const MessageBox&) = delete;
  ~MessageBox() { reset(); }

  bool empty() const { return ops_ == nullptr; }
  TypeKey key() const { return ops_ ? ops_->key : nullptr; }
  const BoxOps* ops() const { return ops_; }
  /// Encodes the message for the wire; false when its type has no codec.
  /// With `splices`, large Bytes fields are recorded there, not copied
  /// into `out` (see codec::Writer).
  bool encode(std::string& out, std::vector<codec::Splice>* splices = nullptr) const {
    if (!ops_ || !ops_->encode) return false;
    codec::Writer w(out, splices);
    ops_->encode(heap_ ? heap_ : static_cast<const void*>(buf_), w);
    return true;
  }
  const std::string& type_name() const;

  /// REQUIRES: key() == type_key<T>().
  template <class T>
  T& get() {
    return *static_cast<T*>(heap_ ? heap_ : static_cast<void*>(buf_));
  }

  void reset() noexcept {
    if (ops_) {
      if (!ops_->trivial) ops_->destroy(heap_ ? heap_ : static_cast<void*>(buf_), heap_ == nullptr);
      ops_ = nullptr;
      heap_ = nullptr;
    }
  }

 private:
  void take(MessageBox& other) noexcept {
    ops_ = other.ops_;
    heap_ = other.heap_;
    if (ops_ && !heap_) {
      if (ops_->trivial) {
        std::memcpy(buf_, other.buf_, kInlineMessageBytes);
      } else {
        ops_->move_inline(buf_, other.buf_);
      }
    }
    other.ops_ = nullptr;
    other.heap_ = nullptr;
  }

  const BoxOps* ops_ = nullptr;
  void* heap_ = nullptr;
  alignas(std::max_align_t) unsigned char buf_[kInlineMessageBytes];
};

/// Where the answer to an ask goes. Refcounted because the asker (a Future, or
/// the asking actor's deadline list) and the envelope both hold it. Completed
/// exactly once: the envelope gives up its reference when it completes it.
class ReplyBase {
 public:
  explicit ReplyBase(TypeKey value_type) : value_type_(value_type) {}
  virtual ~ReplyBase() = default;
  ReplyBase(const ReplyBase&) = delete;
  ReplyBase& operator=(const ReplyBase&) = delete;

  /// The C++ type the asker expects back.
  TypeKey value_type() const { return value_type_; }
  /// Completes the ask with an error.
  virtual void fail(Status status) = 0;
  /// Completes the ask with an encoded reply (from another process). With
  /// `owner` (what keeps `bytes` alive), large Bytes fields of the reply are
  /// slices of it rather than copies. Taken by value and dropped before the
  /// asker is woken, so that the asker's slices are then the frame's only
  /// holders: dropping them gives its buffer back (receive_pool.h).
  virtual void complete_bytes(std::string_view bytes, std::shared_ptr<const void> owner) = 0;
  /// Completes the ask with a reply encoded in this process, its large
  /// Bytes fields as splices: a reply bound for another process sends them
  /// from where they lie. By default they are copied into place.
  virtual void complete_encoded(std::string body, std::vector<codec::Splice> splices) {
    complete_bytes(codec::flatten(std::move(body), splices), nullptr);
  }
  /// For replies bound for another process: the network node whose context
  /// encodes refs inside the reply (see codec_scope()).
  virtual void* codec_context() const { return nullptr; }

  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

 private:
  std::atomic<int32_t> refs_{1};
  TypeKey value_type_;
};

/// The value_type of a reply that goes to another process: it takes any
/// reply type that has a codec and sends it encoded.
struct AnyRemoteReply {};

template <class R>
class ReplyTo : public ReplyBase {
 public:
  ReplyTo() : ReplyBase(type_key<R>()) {}
  virtual void complete(Result<R>&& r) = 0;
  void fail(Status status) final { complete(Result<R>(Unexpected{std::move(status)})); }
  void complete_bytes(std::string_view bytes, std::shared_ptr<const void> owner) final {
    if constexpr (std::is_void_v<R>) {
      if (!bytes.empty()) {
        fail(Status(ErrorCode::type_mismatch, "ask: expected no reply value but the remote handler sent one"));
        return;
      }
      complete(Result<void>());
    } else if constexpr (codec::Codable<R>) {
      auto v = codec::decode<R>(bytes, owner);
      owner.reset();  // `bytes` is not read past here
      if (!v) {
        fail(Status(v.error().code(), "ask: the remote reply could not be decoded as " + type_name<R>() + ": " +
                                          v.error().message()));
        return;
      }
      complete(Result<R>(std::move(*v)));
    } else {
      fail(Status(ErrorCode::type_mismatch, "ask: the reply type " + type_name<R>() +
                                                " has no codec, so it cannot come from another process"));
    }
  }
};

/// Owning handle to a ReplyBase.
class ReplyRef {
 public:
  ReplyRef() = default;
  /// Adopts one reference.
  explicit ReplyRef(ReplyBase* p) : p_(p) {}
  ReplyRef(const ReplyRef& o) : p_(o.p_) {
    if (p_) p_->add_ref();
  }
  ReplyRef(ReplyRef&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  ReplyRef& operator=(ReplyRef o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~ReplyRef() {
    if (p_) p_->release();
  }
  ReplyBase* get() const { return p_; }
  ReplyBase* operator->() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  void reset() { ReplyRef().swap(*this); }
  void swap(ReplyRef& o) noexcept { std::swap(p_, o.p_); }

 private:
  ReplyBase* p_ = nullptr;
};

/// Makes `node` the context for encoding and decoding actor refs on this
/// thread for the scope (refs are written as the node address plus an id).
class CodecScope {
 public:
  explicit CodecScope(void* node);
  ~CodecScope();
  CodecScope(const CodecScope&) = delete;
  CodecScope& operator=(const CodecScope&) = delete;

 private:
  void* prev_;
};

/// Completes a reply bound for another process with an encoded value.
template <class R, class V>
void complete_remote_reply(ReplyRef& r, V&& value) {
  if constexpr (codec::Codable<std::remove_cvref_t<R>>) {
    std::string bytes;
    std::vector<codec::Splice> splices;
    CodecScope scope(r->codec_context());
    codec::Writer w(bytes, &splices);
    codec::write(w, value);
    r->complete_encoded(std::move(bytes), std::move(splices));
  } else {
    (void)value;
    r->fail(Status(ErrorCode::type_mismatch, "ask: the handler's reply type " + type_name<R>() +
                                                 " has no codec, so it cannot go to another process"));
  }
}

/// Completes `reply` (if any) with a value, checking the asker's type.
template <class R, class V>
void complete_reply(ReplyRef& reply, V&& value) {
  if (!reply) return;
  ReplyRef r = std::move(reply);
  if (r->value_type() == type_key<AnyRemoteReply>()) {
    complete_remote_reply<R>(r, std::forward<V>(value));
    return;
  }
  if (r->value_type() != type_key<R>()) {
    r->fail(Status(ErrorCode::type_mismatch,
                   "ask: the handler replied with " + type_name<R>() +
                       " but the asker expected another type; ask with the handler's reply type"));
    return;
  }
  static_cast<ReplyTo<R>*>(r.get())->complete(Result<R>(std::forward<V>(value)));
}

template <class R>
void complete_reply_void(ReplyRef& reply) {
  if (!reply) return;
  ReplyRef r = std::move(reply);
  if (r->value_type() == type_key<AnyRemoteReply>()) {
    r->complete_bytes({}, nullptr);
    return;
  }
  if (r->value_type() != type_key<void>()) {
    r->fail(Status(ErrorCode::type_mismatch,
                   "ask: the handler returns nothing but the asker expected a value"));
    return;
  }
  static_cast<ReplyTo<void>*>(r.get())->complete(Result<void>());
}

struct Envelope;
/// Calls the handler for one message type on an actor instance.
using InvokeFn = void (*)(ActorBase& actor, Envelope& env);

/// A user message on its way to an actor. Destroying an envelope whose ask was
/// never answered fails the ask with actor_dead: that is how a message that is
/// dropped by a dead actor's mailbox gets its error promptly.
struct Envelope {
  MessageBox box;
  /// The handler, when the sender knew the target's type (typed refs); else
  /// the receiver looks it up by the box's type key.
  InvokeFn invoke = nullptr;
  ReplyRef reply;

  Envelope() = default;
  Envelope(MessageBox b, InvokeFn fn, ReplyRef r)
      : box(std::move(b)), invoke(fn), reply(std::move(r)) {}
  Envelope(Envelope&&) noexcept = default;
  Envelope& operator=(Envelope&&) noexcept = default;
  // CAF's tuple storage wants a copy constructor to exist; troupe never copies
  // an envelope (it owns a reply that must complete once), so a copy aborts.
  Envelope(const Envelope&);
  Envelope& operator=(const Envelope&) = delete;
  ~Envelope();
};

/// Opaque handle to a cell (the runtime object behind an ActorRef).
struct CellControl;
void retain(CellControl* c) noexcept;
void release(CellControl* c) noexcept;

/// Refcounted pointer to a cell.
class CellPtr {
 public:
  CellPtr() = default;
  /// Adds a reference.
  explicit CellPtr(CellControl* c) : c_(c) {
    if (c_) retain(c_);
  }
  CellPtr(const CellPtr& o) : CellPtr(o.c_) {}
  CellPtr(CellPtr&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  CellPtr& operator=(CellPtr o) noexcept {
    std::swap(c_, o.c_);
    return *this;
  }
  ~CellPtr() {
    if (c_) release(c_);
  }
  CellControl* get() const { return c_; }
  explicit operator bool() const { return c_ != nullptr; }
  friend bool operator==(const CellPtr& a, const CellPtr& b) { return a.c_ == b.c_; }

 private:
  CellControl* c_ = nullptr;
};

/// Queues `env` on `to`. On failure (dead actor, full mailbox) the envelope's
/// reply is failed with the reason and the same Status is returned.
Status send(CellControl* to, Envelope&& env);
/// Like send(), except that a message that reached nothing is left in `env`
/// (message and reply), with `kept` set, and the reason returned: actor_dead
/// for an actor that has stopped, peer_lost where the connection to a remote
/// actor's process was gone before the message left. A ref that follows the
/// actor sends it to the next incarnation (at most once holds: it never
/// ran). Where `kept` is false, `env` was consumed as by send().
Status send_unless_lost(CellControl* to, Envelope& env, bool& kept);

/// The cell's process-unique id (never reused) and its path.
uint64_t cell_id(CellControl* c);
/// True once the cell has terminated (for a proxy: its remote actor or the
/// connection to it is gone).
bool cell_dead(CellControl* c);
std::string cell_path(CellControl* c);
/// The actor class the cell hosts (type_key of the user class).
TypeKey cell_actor_type(CellControl* c);

/// The default ask timeout of the runtime `to` belongs to.
std::chrono::milliseconds default_ask_timeout(CellControl* to);

/// True while the calling thread runs an actor handler: blocking there would
/// stall a scheduler thread.
bool in_actor_context();

}  // namespace troupe::detail
