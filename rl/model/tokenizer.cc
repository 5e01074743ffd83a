#include "model/tokenizer.h"

namespace troupe::rl::model {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<int32_t> tokens;
  tokens.reserve(text.size());
  for (char c : text) tokens.push_back(static_cast<unsigned char>(c));
  return tokens;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (int32_t t : tokens) {
    if (t >= 0 && t < 256) text.push_back(static_cast<char>(static_cast<unsigned char>(t)));
  }
  return text;
}

}  // namespace troupe::rl::model
