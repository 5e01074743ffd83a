#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace troupe::rl::model {

Status SamplingParams::validate() const {
  auto bad = [](const std::string& what) { return Status(ErrorCode::invalid_argument, "sampling: " + what); };
  if (!(temperature >= 0.0) || !std::isfinite(temperature)) {
    return bad("temperature " + std::to_string(temperature) + " must be 0 (greedy) or positive");
  }
  if (!(top_p > 0.0 && top_p <= 1.0)) return bad("top_p " + std::to_string(top_p) + " must be in (0, 1]");
  return {};
}

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

SampleRng::SampleRng(uint64_t seed, uint64_t index) {
  // Two splitmix rounds apart per index: streams of neighbouring sequences
  // share nothing.
  uint64_t x = seed ^ splitmix64(index);
  for (uint64_t& s : s_) s = splitmix64(x);
}

uint64_t SampleRng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double SampleRng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

int32_t sample_token(const float* logits, size_t V, const SamplingParams& params, SampleRng& rng, float* scratch,
                     int32_t* order) {
  if (params.temperature == 0.0) {
    return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);  // first of equal maxima
  }
  const float maxval = *std::max_element(logits, logits + V);
  const double inv_t = 1.0 / params.temperature;
  float* w = scratch;  // unnormalised probabilities
  for (size_t v = 0; v < V; ++v) w[v] = static_cast<float>(std::exp((logits[v] - maxval) * inv_t));

  const bool truncate = (params.top_k > 0 && params.top_k < V) || params.top_p < 1.0;
  if (!truncate) {
    double total = 0;
    for (size_t v = 0; v < V; ++v) total += w[v];
    double u = rng.uniform() * total, cum = 0;
    for (size_t v = 0; v < V; ++v) {
      cum += w[v];
      if (u < cum) return static_cast<int32_t>(v);
    }
    return static_cast<int32_t>(V - 1);  // u rounded onto the total
  }
  // Most likely first; equal weights by index, so the order is deterministic.
  std::iota(order, order + V, 0);
  auto more_likely = [w](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
  size_t kept = params.top_k > 0 && params.top_k < V ? params.top_k : V;
  std::partial_sort(order, order + kept, order + V, more_likely);
  double total = 0;
  for (size_t i = 0; i < kept; ++i) total += w[order[i]];
  if (params.top_p < 1.0) {
    // The smallest prefix whose share of the kept mass reaches top_p.
    double cum = 0;
    size_t i = 0;
    while (i < kept) {
      cum += w[order[i++]];
      if (cum >= params.top_p * total) break;
    }
    kept = i;
    total = cum;
  }
  double u = rng.uniform() * total, cum = 0;
  for (size_t i = 0; i < kept; ++i) {
    cum += w[order[i]];
    if (u < cum) return order[i];
  }
  return order[kept - 1];
}

double token_logprob(const float* logits, size_t V, int32_t token) {
  const double maxval = *std::max_element(logits, logits + V);
  double sum = 0;
  for (size_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(logits[v]) - maxval);
  return static_cast<double>(logits[token]) - maxval - std::log(sum);
}

}  // namespace troupe::rl::model
