#include "model/decoder.h"

#include <unistd.h>

#include <random>

namespace troupe::rl::model {

Status assign_positions(const GptConfig& config, std::span<const DecodeRow> rows, std::vector<size_t>& lengths,
                        std::vector<size_t>& positions) {
  const size_t V = config.vocab_size;
  std::vector<size_t> next(lengths);
  positions.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const DecodeRow& r = rows[i];
    if (r.slot >= next.size()) {
      return Status(ErrorCode::invalid_argument, "decoder: row " + std::to_string(i) + " names slot " +
                                                     std::to_string(r.slot) + " of " + std::to_string(next.size()));
    }
    if (r.token < 0 || static_cast<size_t>(r.token) >= V) {
      return Status(ErrorCode::invalid_argument, "decoder: row " + std::to_string(i) + " has token " +
                                                     std::to_string(r.token) + " outside the vocabulary of " +
                                                     std::to_string(V));
    }
    if (next[r.slot] >= config.context_length) {
      return Status(ErrorCode::invalid_argument, "decoder: slot " + std::to_string(r.slot) + " is full (" +
                                                     std::to_string(config.context_length) +
                                                     " positions, the context length); clear it or stop the sequence");
    }
    positions[i] = next[r.slot]++;
  }
  lengths = std::move(next);
  return {};
}

uint64_t process_nonce() {
  static const uint64_t nonce = [] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  }();
  return nonce;
}

Result<float*> Decoder::standby_weights() {
  return error(ErrorCode::unsupported, "decoder: " + describe() +
                                           " has no standby weights (it runs a host model); give it new weights with "
                                           "set_weights");
}

Status Decoder::take_standby() {
  return Status(ErrorCode::unsupported, "decoder: " + describe() + " has no standby weights; use set_weights");
}

Status Decoder::copy_into_standby(const SharedParams& from) {
  return Status(ErrorCode::unsupported, "decoder: " + describe() + " cannot copy parameters from " +
                                            (from.device.empty() ? "nowhere" : from.device) +
                                            " into a standby; read them another way");
}

Status check_decoder_shape(const GptConfig& config, const Gpt<float>& model) {
  // The value head reads nothing from the cache: a policy's decoder serves
  // the same policy with a head.
  GptConfig shape = model.config();
  shape.value_head = config.value_head;
  if (shape == config) return {};
  return Status(ErrorCode::invalid_argument,
                "decoder: the model's shape differs from the one this decoder was made for; make it from the "
                "model's config");
}

}  // namespace troupe::rl::model
