// The policy model's tokenizer: one token per byte (0-255) and three
// special tokens after them. Any text round-trips, nothing is out of
// vocabulary, and the vocabulary is small enough for a model that trains on
// 2 CPU cores.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::rl::model {

/// Byte-level tokenizer with BOS, EOS and PAD.
class ByteTokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  static constexpr int32_t kPad = 258;
  /// Tokens in the vocabulary: the 256 bytes and the three specials.
  static constexpr int32_t kVocabSize = 259;

  /// One token per byte of `text`.
  static std::vector<int32_t> encode(std::string_view text);
  /// The bytes of `tokens`, the special tokens left out. Out-of-range
  /// tokens are left out too (a model with a larger vocabulary may sample
  /// them).
  static std::string decode(const std::vector<int32_t>& tokens);
  /// True for BOS, EOS and PAD.
  static bool is_special(int32_t token) { return token >= kBos && token < kVocabSize; }
};

}  // namespace troupe::rl::model
