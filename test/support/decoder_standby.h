// One check of a decoder's standby weights (Decoder::standby_weights,
// take_standby), shared by the host kind's test and the CUDA decoder's
// [gpu] test: against the CPU cache on the same weights, filling the
// standby changes nothing the decoder computes until take_standby(), which
// then runs the new weights; the old ones become the standby.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "model/gpt.h"
#include "model/kv_cache.h"

namespace troupe::test {

/// Writes `n` host floats to the standby (a device pointer for a GPU).
using FillStandby = std::function<void(float* standby, const float* host, size_t n)>;

/// The largest |a - b| over the logits, relative to the largest |b| (NaN
/// counts as worst).
inline double relative_max_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= diff)) diff = d;
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return ref == 0 ? diff : diff / ref;
}

/// Runs the same rows through `decoder` and the CPU cache, and checks the
/// logits (relative error at most `tol`) and the slots' lengths.
inline void check_same_step(rl::model::Decoder& decoder, rl::model::KvCache& cpu,
                            const std::vector<rl::model::DecodeRow>& rows, double tol, const char* what) {
  const size_t V = cpu.config().vocab_size;
  std::vector<float> want(rows.size() * V), got(rows.size() * V);
  REQUIRE(cpu.append(rows, want.data()).ok());
  Status s = decoder.append(rows, got.data());
  INFO(what << ": " << s.to_string());
  REQUIRE(s.ok());
  const double err = relative_max_error(got, want);
  INFO(what << ": worst logit error " << err << " (relative to the largest logit)");
  CHECK(err <= tol);
  for (size_t slot = 0; slot < cpu.slots(); ++slot) CHECK(decoder.length(slot) == cpu.length(slot));
}

/// `decoder`, fresh (no weights yet), against the CPU cache (batch-invariant
/// or not, as `batch_invariant`); `tol` bounds the logits' relative error
/// (0: bit for bit).
inline void check_decoder_standby(rl::model::Decoder& decoder, const FillStandby& fill, double tol,
                                  bool batch_invariant) {
  using namespace rl::model;
  const GptConfig config = decoder.config();
  auto a = Gpt<float>::make(config).value();
  a.init_random(3);
  auto b = Gpt<float>::make(config).value();
  b.init_random(4);
  const size_t n = a.layout().total();
  auto cpu = KvCache::make(config, decoder.slots()).value();
  cpu.set_batch_invariant(batch_invariant);
  auto same = [&](const std::vector<DecodeRow>& rows, const char* what) {
    check_same_step(decoder, cpu, rows, tol, what);
  };

  // Nothing to take before a standby was asked for.
  Status early = decoder.take_standby();
  CHECK(early.code() == ErrorCode::invalid_argument);
  CHECK_THAT(early.message(), Catch::Contains("standby_weights"));

  REQUIRE(decoder.set_weights(a).ok());
  REQUIRE(cpu.set_weights(a).ok());
  same({{0, 256}, {0, 1}, {0, 2}, {1, 256}, {1, 9}}, "prefill with A");
  // B written into the standby while the decoder runs A: its steps are A's.
  auto standby = decoder.standby_weights();
  INFO((standby ? std::string("ok") : standby.error().to_string()));
  REQUIRE(standby.has_value());
  fill(*standby, b.params(), n);
  same({{0, 3}, {1, 8}}, "a decode step with B in the standby");
  std::vector<float> back(n);
  REQUIRE(decoder.read_weights(back.data()).ok());
  CHECK(std::memcmp(back.data(), a.params(), n * sizeof(float)) == 0);

  // Taken: B runs (the cached keys and values stay, as with set_weights).
  REQUIRE(decoder.take_standby().ok());
  REQUIRE(cpu.set_weights(b).ok());
  same({{0, 4}, {1, 7}}, "a decode step after taking B");
  cpu.clear_all();
  decoder.clear_all();
  same({{2, 256}, {2, 5}, {2, 5}, {3, 256}}, "prefill with B");
  REQUIRE(decoder.read_weights(back.data()).ok());
  CHECK(std::memcmp(back.data(), b.params(), n * sizeof(float)) == 0);

  // A's buffer is the standby now: filled with A again and taken, A runs.
  standby = decoder.standby_weights();
  REQUIRE(standby.has_value());
  fill(*standby, a.params(), n);
  REQUIRE(decoder.take_standby().ok());
  REQUIRE(cpu.set_weights(a).ok());
  cpu.clear_all();
  decoder.clear_all();
  same({{1, 256}, {1, 3}, {1, 1}}, "prefill with A again");
}

}  // namespace troupe::test
