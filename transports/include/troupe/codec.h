// The message codec: how values cross a process boundary. Built-in for
// integers, floats, bools, strings, vectors, maps, optionals, byte buffers and
// structs that list their fields; extend it for other types by specialising
// troupe::codec::Codec<T> with write() and read().
//
// The format is compact and positional: fixed-width little-endian numbers,
// u32-length-prefixed strings and sequences, fields in declaration order. It
// is not self-describing; both sides must agree on the field list. Decoding
// checks every length against the bytes left and fails cleanly.
//
// troupe::Bytes fields are a u32 length, zeros up to the next multiple of 16
// bytes from the start of the encoding, then the bytes. A Writer given a
// splice list records large ones there instead of copying them (the
// transport sends them from where they lie); a Reader given the owner of its
// buffer hands large ones out as slices of it (see bytes.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "troupe/bytes.h"
#include "troupe/status.h"

namespace troupe::codec {

/// Bytes that belong at offset `at` of an encoded body but were not copied
/// there: the encoding is the body with every splice inserted at its offset
/// (offsets ascending).
struct Splice {
  size_t at = 0;
  Bytes bytes;
};

/// Calls fn(data, size) for the pieces of `body` with `splices` inserted, in
/// order: the body's runs between splices, and the splices (empty pieces
/// left out). What a transport's gather list is made of.
template <class Fn>
void for_each_piece(const std::string& body, const std::vector<Splice>& splices, Fn&& fn) {
  size_t from = 0;
  for (const Splice& s : splices) {
    if (s.at > from) fn(body.data() + from, s.at - from);
    if (!s.bytes.empty()) fn(s.bytes.data(), s.bytes.size());
    from = s.at;
  }
  if (body.size() > from) fn(body.data() + from, body.size() - from);
}

/// The encoding a body and its splices stand for, as one string (a copy:
/// for paths where the bytes are small or must be contiguous).
inline std::string flatten(std::string body, const std::vector<Splice>& splices) {
  if (splices.empty()) return body;
  size_t total = body.size();
  for (const Splice& s : splices) total += s.bytes.size();
  std::string out;
  out.reserve(total);
  for_each_piece(body, splices, [&](const char* p, size_t n) { out.append(p, n); });
  return out;
}

/// Appends encoded values to a byte string.
class Writer {
 public:
  /// With `splices`, large Bytes fields are recorded there, not copied.
  explicit Writer(std::string& out, std::vector<Splice>* splices = nullptr) : out_(out), splices_(splices) {}
  void raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  template <class T>
  void number(T v) {
    static_assert(std::is_arithmetic_v<T>);
    raw(&v, sizeof(T));  // little endian on every platform troupe runs on
  }
  void length(size_t n) { number(static_cast<uint32_t>(n)); }
  /// Appends `b`'s bytes: by reference when this writer takes splices and
  /// `b` is at least Bytes::kZeroCopyMinBytes, else copied.
  void bytes(const Bytes& b) {
    if (splices_ != nullptr && b.size() >= Bytes::kZeroCopyMinBytes) {
      splices_->push_back({out_.size(), b});
      spliced_ += b.size();
    } else {
      raw(b.data(), b.size());
    }
  }
  /// Offset in the whole encoding (the body plus what was spliced).
  size_t position() const { return out_.size() + spliced_; }
  std::string& out() { return out_; }

 private:
  std::string& out_;
  std::vector<Splice>* splices_;
  size_t spliced_ = 0;
};

/// Reads encoded values; the first failure sticks and says where.
class Reader {
 public:
  /// With `owner` (what keeps [data, data + size) alive), large Bytes
  /// fields come out as slices of the buffer instead of copies.
  Reader(const char* data, size_t size, std::shared_ptr<const void> owner = {})
      : begin_(data), p_(data), end_(data + size), owner_(std::move(owner)) {}
  bool raw(void* dst, size_t n) {
    if (!need(n)) return false;
    std::memcpy(dst, p_, n);
    p_ += n;
    return true;
  }
  template <class T>
  bool number(T& v) {
    return raw(&v, sizeof(T));
  }
  /// A u32 length, checked against the bytes left assuming `min_each` bytes
  /// per element (so that a hostile length cannot make us allocate).
  bool length(size_t& n, size_t min_each) {
    uint32_t len = 0;
    if (!number(len)) return false;
    if (min_each != 0 && len > static_cast<size_t>(end_ - p_) / min_each) {
      return fail("length " + std::to_string(len) + " exceeds the bytes left");
    }
    n = len;
    return true;
  }
  bool bytes(std::string& s, size_t n) {
    if (!need(n)) return false;
    s.assign(p_, n);
    p_ += n;
    return true;
  }
  /// `n` bytes as a Bytes: a slice of the buffer when the reader has its
  /// owner and n >= Bytes::kZeroCopyMinBytes, else a copy.
  bool bytes(Bytes& b, size_t n) {
    if (!need(n)) return false;
    b = owner_ && n >= Bytes::kZeroCopyMinBytes ? Bytes(owner_, p_, n) : Bytes::copy(p_, n);
    p_ += n;
    return true;
  }
  /// Skips `n` bytes that must be zero (padding).
  bool zeros(size_t n) {
    if (!need(n)) return false;
    for (size_t i = 0; i < n; ++i) {
      if (p_[i] != 0) return fail("padding byte " + std::to_string(i) + " is not zero");
    }
    p_ += n;
    return true;
  }
  /// Offset from the start of the buffer.
  size_t position() const { return static_cast<size_t>(p_ - begin_); }
  bool fail(std::string what) {
    if (ok_) {
      ok_ = false;
      error_ = std::move(what);
    }
    return false;
  }
  bool ok() const { return ok_; }
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  const std::string& error() const { return error_; }

 private:
  bool need(size_t n) {
    if (!ok_) return false;
    if (static_cast<size_t>(end_ - p_) < n) return fail("truncated: needed " + std::to_string(n) + " bytes");
    return true;
  }
  const char* begin_;
  const char* p_;
  const char* end_;
  std::shared_ptr<const void> owner_;
  bool ok_ = true;
  std::string error_;
};

/// Specialise for types the built-ins do not cover:
///   template <> struct Codec<MyType> {
///     static void write(Writer&, const MyType&);
///     static bool read(Reader&, MyType&);
///   };
template <class T, class = void>
struct Codec;

/// True for types with a field list (TROUPE_MESSAGE or TROUPE_FIELDS).
template <class T>
concept HasFields = requires(T& t) { t.troupe_fields([](auto&...) {}); };

/// True when values of T can be encoded.
template <class T>
concept Codable = requires(Writer& w, Reader& r, const T& c, T& m) {
  Codec<T>::write(w, c);
  { Codec<T>::read(r, m) } -> std::convertible_to<bool>;
};

template <class T>
void write(Writer& w, const T& v) {
  Codec<T>::write(w, v);
}
template <class T>
bool read(Reader& r, T& v) {
  return Codec<T>::read(r, v);
}

template <class T>
struct Codec<T, std::enable_if_t<std::is_arithmetic_v<T>>> {
  static void write(Writer& w, T v) {
    if constexpr (std::is_same_v<T, bool>) {
      w.number<uint8_t>(v ? 1 : 0);
    } else {
      w.number(v);
    }
  }
  static bool read(Reader& r, T& v) {
    if constexpr (std::is_same_v<T, bool>) {
      uint8_t b = 0;
      if (!r.number(b)) return false;
      if (b > 1) return r.fail("bool byte " + std::to_string(b));
      v = b == 1;
      return true;
    } else {
      return r.number(v);
    }
  }
};

template <class T>
struct Codec<T, std::enable_if_t<std::is_enum_v<T>>> {
  using U = std::underlying_type_t<T>;
  static void write(Writer& w, T v) { w.number(static_cast<U>(v)); }
  static bool read(Reader& r, T& v) {
    U u{};
    if (!r.number(u)) return false;
    v = static_cast<T>(u);
    return true;
  }
};

template <>
struct Codec<std::string> {
  static void write(Writer& w, const std::string& s) {
    w.length(s.size());
    w.raw(s.data(), s.size());
  }
  static bool read(Reader& r, std::string& s) {
    size_t n = 0;
    return r.length(n, 1) && r.bytes(s, n);
  }
};

/// Bytes: u32 length, zeros to a multiple of Bytes::kAlignment from the
/// start of the encoding, the bytes (spliced or sliced when large).
template <>
struct Codec<Bytes> {
  static size_t padding(size_t position) { return (Bytes::kAlignment - position % Bytes::kAlignment) % Bytes::kAlignment; }
  static void write(Writer& w, const Bytes& b) {
    w.length(b.size());
    static constexpr char kZeros[Bytes::kAlignment] = {};
    w.raw(kZeros, padding(w.position()));
    w.bytes(b);
  }
  static bool read(Reader& r, Bytes& b) {
    size_t n = 0;
    return r.length(n, 1) && r.zeros(padding(r.position())) && r.bytes(b, n);
  }
};

template <class T>
  requires Codable<T>
struct Codec<std::vector<T>> {
  static void write(Writer& w, const std::vector<T>& v) {
    w.length(v.size());
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      w.raw(v.data(), v.size() * sizeof(T));  // one copy for numeric arrays
    } else {
      for (const auto& x : v) codec::write(w, x);
    }
  }
  static bool read(Reader& r, std::vector<T>& v) {
    size_t n = 0;
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      if (!r.length(n, sizeof(T))) return false;
      v.resize(n);
      return r.raw(v.data(), n * sizeof(T));
    } else {
      if (!r.length(n, 1)) return false;
      v.clear();
      v.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        T x{};
        if (!codec::read(r, x)) return false;
        v.push_back(std::move(x));
      }
      return true;
    }
  }
};

template <class M>
struct MapCodec {
  static void write(Writer& w, const M& m) {
    w.length(m.size());
    for (const auto& [k, v] : m) {
      codec::write(w, k);
      codec::write(w, v);
    }
  }
  static bool read(Reader& r, M& m) {
    size_t n = 0;
    if (!r.length(n, 2)) return false;
    m.clear();
    for (size_t i = 0; i < n; ++i) {
      typename M::key_type k{};
      typename M::mapped_type v{};
      if (!codec::read(r, k) || !codec::read(r, v)) return false;
      m.emplace(std::move(k), std::move(v));
    }
    return true;
  }
};
template <class K, class V>
  requires(Codable<K> && Codable<V>)
struct Codec<std::map<K, V>> : MapCodec<std::map<K, V>> {};
template <class K, class V>
  requires(Codable<K> && Codable<V>)
struct Codec<std::unordered_map<K, V>> : MapCodec<std::unordered_map<K, V>> {};

template <class T>
  requires Codable<T>
struct Codec<std::optional<T>> {
  static void write(Writer& w, const std::optional<T>& o) {
    w.number<uint8_t>(o ? 1 : 0);
    if (o) codec::write(w, *o);
  }
  static bool read(Reader& r, std::optional<T>& o) {
    uint8_t has = 0;
    if (!r.number(has)) return false;
    if (has > 1) return r.fail("optional flag " + std::to_string(has));
    if (has == 0) {
      o.reset();
      return true;
    }
    T x{};
    if (!codec::read(r, x)) return false;
    o = std::move(x);
    return true;
  }
};

template <class A, class B>
  requires(Codable<A> && Codable<B>)
struct Codec<std::pair<A, B>> {
  static void write(Writer& w, const std::pair<A, B>& p) {
    codec::write(w, p.first);
    codec::write(w, p.second);
  }
  static bool read(Reader& r, std::pair<A, B>& p) { return codec::read(r, p.first) && codec::read(r, p.second); }
};

/// Tuples: elements in order (constructor arguments of actors spawned on a
/// cluster travel as one).
template <class... Ts>
  requires(Codable<Ts> && ...)
struct Codec<std::tuple<Ts...>> {
  static void write(Writer& w, const std::tuple<Ts...>& t) {
    std::apply([&](const auto&... e) { (codec::write(w, e), ...); }, t);
  }
  static bool read(Reader& r, std::tuple<Ts...>& t) {
    return std::apply([&](auto&... e) { return (codec::read(r, e) && ...); }, t);
  }
};

/// Structs with a field list: fields in order.
template <class T>
struct Codec<T, std::enable_if_t<HasFields<T>>> {
  static void write(Writer& w, const T& v) {
    const_cast<T&>(v).troupe_fields([&](const auto&... f) { (codec::write(w, f), ...); });
  }
  static bool read(Reader& r, T& v) {
    bool ok = true;
    v.troupe_fields([&](auto&... f) { ok = (codec::read(r, f) && ...); });
    return ok;
  }
};

/// Encodes `v` into a fresh string.
template <class T>
std::string encode(const T& v) {
  std::string out;
  Writer w(out);
  codec::write(w, v);
  return out;
}

/// Decodes a whole buffer into a T; trailing bytes are an error. With
/// `owner` (what keeps `bytes` alive), large Bytes fields are slices of it.
template <class T>
Result<T> decode(std::string_view bytes, std::shared_ptr<const void> owner = {}) {
  Reader r(bytes.data(), bytes.size(), std::move(owner));
  T v{};
  if (!codec::read(r, v)) return error(ErrorCode::malformed, "codec: " + r.error());
  if (r.left() != 0) return error(ErrorCode::malformed, "codec: " + std::to_string(r.left()) + " trailing bytes");
  return v;
}

/// The stable wire id of a message type name (64-bit FNV-1a).
constexpr uint64_t type_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace troupe::codec

/// Lists a struct's fields for the codec (for structs that are sent as part
/// of messages or replies but are not messages themselves).
#define TROUPE_FIELDS(...)                      \
  template <class TroupeF>                      \
  void troupe_fields(TroupeF&& troupe_f) {      \
    troupe_f(__VA_ARGS__);                      \
  }
