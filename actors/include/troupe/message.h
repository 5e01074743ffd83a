// Declaring message types that can cross process boundaries.
//
//   struct Add {
//     int n;
//     std::string tag;
//     TROUPE_MESSAGE(Add, n, tag);
//   };
//
// lists the fields (in order) for the codec and registers the type under its
// name, so that a process receiving an `Add` can rebuild it. Names must be
// unique in a cluster: qualify them if needed (TROUPE_MESSAGE_NAMED).
// Messages without the macro work within one process only; sending one to a
// remote actor fails with a message that says to add it.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "troupe/codec.h"
#include "troupe/detail/message.h"

namespace troupe::detail {

/// Rebuilds a message from its encoded fields; with `owner` (what keeps
/// `bytes` alive), large Bytes fields are slices of it rather than copies.
using WireDecodeFn = bool (*)(std::string_view bytes, const std::shared_ptr<const void>& owner, MessageBox* out,
                              std::string* error);

/// Registers a message type for decoding (called by TROUPE_MESSAGE at load
/// time). A second type with the same wire id aborts with both names.
bool register_wire_type(uint64_t wire_id, std::string_view name, TypeKey key, WireDecodeFn decode);

template <class T>
bool register_wire_message() {
  return register_wire_type(codec::type_id(T::troupe_name()), T::troupe_name(), type_key<T>(),
                            [](std::string_view bytes, const std::shared_ptr<const void>& owner, MessageBox* out,
                               std::string* error) {
                              auto v = codec::decode<T>(bytes, owner);
                              if (!v) {
                                *error = v.error().message();
                                return false;
                              }
                              *out = MessageBox::make(std::move(*v));
                              return true;
                            });
}

}  // namespace troupe::detail

/// Makes a message type sendable to other processes under the name `Name`
/// (a string literal), with the listed fields.
#define TROUPE_MESSAGE_NAMED(Type, Name, ...)                                                    \
  TROUPE_FIELDS(__VA_ARGS__)                                                                     \
  static constexpr std::string_view troupe_name() { return Name; }                              \
  static inline const bool troupe_registered_ = ::troupe::detail::register_wire_message<Type>()

/// Makes a message type sendable to other processes, named after the type.
#define TROUPE_MESSAGE(Type, ...) TROUPE_MESSAGE_NAMED(Type, #Type, __VA_ARGS__)
