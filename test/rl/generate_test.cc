// Inference: the KV cache gives the logits a full forward gives (one token
// per step, a prompt at once, slots filled at different times); greedy
// generation with the cache picks the tokens full recomputation picks;
// sampling follows the distribution, honours top-k / top-p, and is
// reproducible from the seed whatever the batching; generation's
// log-probabilities are score()'s; bad input is refused.
#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include <catch2/catch.hpp>

#include "model/generate.h"
#include "model/tokenizer.h"

using namespace troupe::rl::model;

namespace {

GptConfig small_config(size_t context = 24) {
  return GptConfig{.vocab_size = 37, .context_length = context, .layers = 2, .heads = 4, .channels = 32};
}

// A random model with larger weights than GPT-2's init, so that its
// distributions are far from uniform and attention carries signal.
Gpt<float> random_model(uint64_t seed, size_t context = 24) {
  auto m = Gpt<float>::make(small_config(context)).value();
  m.init_random(seed);
  for (size_t i = 0; i < m.layout().total(); ++i) m.params()[i] *= 8;
  return m;
}

// The next-token log-probabilities at every position of `seq` by a full
// forward: (T, V).
std::vector<double> full_logprobs(Gpt<float>& m, const std::vector<int32_t>& seq) {
  std::vector<int32_t> targets(seq.size(), 0);
  REQUIRE(m.forward(seq.data(), targets.data(), 1, seq.size()).ok());
  const size_t V = m.config().vocab_size;
  std::vector<double> out(seq.size() * V);
  for (size_t i = 0; i < out.size(); ++i) out[i] = std::log(static_cast<double>(m.probs()[i]));
  return out;
}

double worst_logprob_diff(const std::vector<float>& logits, const std::vector<double>& reference, size_t rows,
                          size_t V) {
  double worst = 0;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t v = 0; v < V; ++v) {
      double lp = token_logprob(logits.data() + r * V, V, static_cast<int32_t>(v));
      worst = std::max(worst, std::abs(lp - reference[r * V + v]));
    }
  }
  return worst;
}

// Log-probabilities by two float computations of different shapes (BLAS
// blocks a 1-row product differently from a 12-row one) agree to float
// rounding of logits of magnitude ~10-50 here: 1e-4.
constexpr double kFloatTolerance = 1e-4;

std::vector<int32_t> seq_of(std::initializer_list<int32_t> l) { return std::vector<int32_t>(l); }

}  // namespace

TEST_CASE("kv cache: token by token, and a whole prompt at once, give the full forward's distributions",
          "[rl][generate]") {
  auto m = random_model(5);
  const size_t V = m.config().vocab_size;
  std::vector<int32_t> seq = {1, 7, 3, 30, 2, 2, 19, 36, 0, 11, 5, 8};
  auto reference = full_logprobs(m, seq);
  auto cache = KvCache::make(m.config(), 3).value();

  std::vector<float> logits(seq.size() * V);
  for (size_t t = 0; t < seq.size(); ++t) {
    DecodeRow row{2, seq[t]};  // slot 2: not the first, to check slot addressing
    REQUIRE(cache.append(m, std::span(&row, 1), logits.data() + t * V).ok());
  }
  CHECK(cache.length(2) == seq.size());
  CHECK(cache.length(0) == 0);
  CHECK(worst_logprob_diff(logits, reference, seq.size(), V) < kFloatTolerance);

  cache.clear(2);
  std::vector<DecodeRow> rows;
  for (int32_t t : seq) rows.push_back({2, t});
  std::fill(logits.begin(), logits.end(), 0.0f);
  REQUIRE(cache.append(m, rows, logits.data()).ok());
  CHECK(worst_logprob_diff(logits, reference, seq.size(), V) < kFloatTolerance);
}

TEST_CASE("kv cache: sequences joining between steps (continuous batching) see only their own tokens",
          "[rl][generate]") {
  auto m = random_model(6);
  const size_t V = m.config().vocab_size;
  std::vector<int32_t> a = {4, 9, 9, 1, 20, 3}, b = {8, 2, 33, 14};
  auto ref_a = full_logprobs(m, a);
  auto ref_b = full_logprobs(m, b);
  auto cache = KvCache::make(m.config(), 2).value();
  std::vector<float> la(a.size() * V), lb(b.size() * V), step(3 * V);
  // Step 1: a's first three tokens alone. Step 2: a's fourth beside all but
  // the last of b's (a prefill joining a decode). Then both decode together.
  std::vector<DecodeRow> s1 = {{0, a[0]}, {0, a[1]}, {0, a[2]}};
  REQUIRE(cache.append(m, s1, step.data()).ok());
  std::copy(step.begin(), step.begin() + 3 * V, la.begin());
  std::vector<DecodeRow> s2 = {{1, b[0]}, {0, a[3]}, {1, b[1]}, {1, b[2]}};
  std::vector<float> step2(4 * V);
  REQUIRE(cache.append(m, s2, step2.data()).ok());
  std::copy(step2.begin() + V, step2.begin() + 2 * V, la.begin() + 3 * V);
  std::copy(step2.begin(), step2.begin() + V, lb.begin());
  std::copy(step2.begin() + 2 * V, step2.begin() + 4 * V, lb.begin() + V);
  std::vector<DecodeRow> s3 = {{0, a[4]}, {1, b[3]}};
  REQUIRE(cache.append(m, s3, step.data()).ok());
  std::copy(step.begin(), step.begin() + V, la.begin() + 4 * V);
  std::copy(step.begin() + V, step.begin() + 2 * V, lb.begin() + 3 * V);
  std::vector<DecodeRow> s4 = {{0, a[5]}};
  REQUIRE(cache.append(m, s4, step.data()).ok());
  std::copy(step.begin(), step.begin() + V, la.begin() + 5 * V);
  CHECK(worst_logprob_diff(la, ref_a, a.size(), V) < kFloatTolerance);
  CHECK(worst_logprob_diff(lb, ref_b, b.size(), V) < kFloatTolerance);
}

TEST_CASE("kv cache: a sequence's logits have the same bits alone and among 15 others (batch-invariant)",
          "[rl][generate]") {
  auto m = random_model(8);
  const size_t V = m.config().vocab_size;
  const std::vector<int32_t> seq = {5, 11, 2, 30, 7, 19};
  // Alone: the whole sequence, one token per step.
  auto alone = KvCache::make(m.config(), 16).value();
  std::vector<float> want(seq.size() * V);
  for (size_t t = 0; t < seq.size(); ++t) {
    std::vector<DecodeRow> row = {{0, seq[t]}};
    REQUIRE(alone.append(m, row, want.data() + t * V).ok());
  }
  // In slot 9 of 16 sequences decoding together (the others random).
  auto shared = KvCache::make(m.config(), 16).value();
  std::vector<float> got(seq.size() * V), step(16 * V);
  for (size_t t = 0; t < seq.size(); ++t) {
    std::vector<DecodeRow> rows;
    for (uint32_t s = 0; s < 16; ++s) rows.push_back({s, s == 9 ? seq[t] : static_cast<int32_t>((s * 7 + t) % V)});
    REQUIRE(shared.append(m, rows, step.data()).ok());
    std::copy(step.begin() + 9 * V, step.begin() + 10 * V, got.begin() + t * V);
  }
  CHECK(got == want);
  // Off, BLAS multiplies the 16 rows at once: close, not equal.
  CHECK(shared.batch_invariant());
  shared.clear_all();
  shared.set_batch_invariant(false);
  for (size_t t = 0; t < seq.size(); ++t) {
    std::vector<DecodeRow> rows;
    for (uint32_t s = 0; s < 16; ++s) rows.push_back({s, s == 9 ? seq[t] : static_cast<int32_t>((s * 7 + t) % V)});
    REQUIRE(shared.append(m, rows, step.data()).ok());
    std::copy(step.begin() + 9 * V, step.begin() + 10 * V, got.begin() + t * V);
  }
  std::vector<double> reference(want.size());
  for (size_t t = 0; t < seq.size(); ++t) {
    for (size_t v = 0; v < V; ++v) reference[t * V + v] = token_logprob(want.data() + t * V, V, static_cast<int32_t>(v));
  }
  // Rounding of this model's logits (tens, from its 8x weights) through 6
  // steps of its cache: measured 6e-4.
  CHECK(worst_logprob_diff(got, reference, seq.size(), V) < 1e-2);
}

TEST_CASE("kv cache: a bad row is refused and leaves the cache as it was", "[rl][generate]") {
  auto m = random_model(7, 4);
  const size_t V = m.config().vocab_size;
  auto cache = KvCache::make(m.config(), 2).value();
  std::vector<float> logits(8 * V);
  std::vector<DecodeRow> ok = {{0, 1}, {0, 2}};
  REQUIRE(cache.append(m, ok, logits.data()).ok());

  std::vector<DecodeRow> bad_slot = {{0, 3}, {2, 1}};
  auto s = cache.append(m, bad_slot, logits.data());
  CHECK(s.code() == troupe::ErrorCode::invalid_argument);
  CHECK_THAT(s.message(), Catch::Contains("slot 2 of 2"));
  std::vector<DecodeRow> bad_token = {{1, 37}};
  CHECK_THAT(cache.append(m, bad_token, logits.data()).message(), Catch::Contains("outside the vocabulary"));
  std::vector<DecodeRow> overflow = {{0, 1}, {0, 1}, {0, 1}};  // 2 cached + 3 > context 4
  CHECK_THAT(cache.append(m, overflow, logits.data()).message(), Catch::Contains("context length"));
  CHECK(cache.length(0) == 2);
  CHECK(cache.length(1) == 0);

  auto other = random_model(7, 8);
  CHECK_THAT(cache.append(other, ok, logits.data()).message(), Catch::Contains("shape differs"));
  CHECK(KvCache::make(m.config(), 0).error().code() == troupe::ErrorCode::invalid_argument);
}

TEST_CASE("generate: greedy decoding with the cache picks what full recomputation picks", "[rl][generate]") {
  auto m = random_model(8);
  const size_t V = m.config().vocab_size;
  std::vector<std::vector<int32_t>> prompts = {seq_of({1, 2, 3}), seq_of({30}), seq_of({5, 6, 7, 8, 9, 10, 11})};
  auto cache = KvCache::make(m.config(), 4).value();
  SamplingParams greedy{.temperature = 0, .max_new_tokens = 10};
  auto out = generate(m, cache, prompts, greedy).value();
  REQUIRE(out.size() == prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i);
    std::vector<int32_t> seq = prompts[i];
    REQUIRE(out[i].tokens.size() == 10);
    CHECK(out[i].stop == StopReason::max_tokens);
    for (size_t k = 0; k < 10; ++k) {
      auto lp = full_logprobs(m, seq);
      const double* last = lp.data() + (seq.size() - 1) * V;
      int32_t argmax = static_cast<int32_t>(std::max_element(last, last + V) - last);
      CHECK(out[i].tokens[k] == argmax);
      CHECK(out[i].logprobs[k] == Approx(last[out[i].tokens[k]]).margin(kFloatTolerance));
      seq.push_back(out[i].tokens[k]);
    }
  }
}

TEST_CASE("generate: sampling is reproducible from the seed, whatever the batching", "[rl][generate]") {
  auto m = random_model(9);
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 6; ++i) prompts.push_back(seq_of({i, i + 1, 2 * i}));
  SamplingParams params{.temperature = 1.0, .top_k = 20, .top_p = 0.95, .max_new_tokens = 12, .seed = 42};
  auto big = KvCache::make(m.config(), 8).value();
  auto one = KvCache::make(m.config(), 1).value();  // six waves of one
  auto a = generate(m, big, prompts, params).value();
  auto b = generate(m, big, prompts, params).value();
  auto c = generate(m, one, prompts, params).value();
  params.seed = 43;
  auto d = generate(m, big, prompts, params).value();
  size_t differ = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    CHECK(a[i].tokens == b[i].tokens);
    CHECK(a[i].logprobs == b[i].logprobs);  // the same call: bit for bit
    CHECK(a[i].tokens == c[i].tokens);
    REQUIRE(c[i].logprobs.size() == a[i].logprobs.size());
    for (size_t k = 0; k < a[i].logprobs.size(); ++k) {
      CHECK(c[i].logprobs[k] == Approx(a[i].logprobs[k]).margin(kFloatTolerance));  // other batching: rounding
    }
    if (a[i].tokens != d[i].tokens) ++differ;
  }
  CHECK(differ >= 5);  // another seed, other samples (a random model is far from deterministic)
}

TEST_CASE("generate: the log-probabilities are score()'s on the same tokens", "[rl][generate]") {
  auto m = random_model(10);
  std::vector<std::vector<int32_t>> prompts = {seq_of({3, 4}), seq_of({1, 2, 3, 4, 5})};
  auto cache = KvCache::make(m.config(), 2).value();
  SamplingParams params{.temperature = 0.7, .max_new_tokens = 9, .seed = 1};
  auto out = generate(m, cache, prompts, params).value();
  std::vector<std::vector<int32_t>> full;
  for (size_t i = 0; i < prompts.size(); ++i) {
    full.push_back(prompts[i]);
    full.back().insert(full.back().end(), out[i].tokens.begin(), out[i].tokens.end());
  }
  auto scored = score(m, cache, full).value();
  for (size_t i = 0; i < prompts.size(); ++i) {
    REQUIRE(scored[i].size() == full[i].size() - 1);
    for (size_t k = 0; k < out[i].tokens.size(); ++k) {
      CHECK(scored[i][prompts[i].size() - 1 + k] == Approx(out[i].logprobs[k]).margin(kFloatTolerance));
    }
  }
}

TEST_CASE("generate: a sequence stops at the stop token, at max_new_tokens, or at the context length",
          "[rl][generate]") {
  auto m = random_model(11, 8);
  auto cache = KvCache::make(m.config(), 2).value();
  std::vector<std::vector<int32_t>> prompts = {seq_of({1, 2})};
  auto greedy = generate(m, cache, prompts, SamplingParams{.temperature = 0, .max_new_tokens = 3}).value();
  REQUIRE(greedy[0].tokens.size() == 3);
  // Stopping on the token greedy decoding emits second: two tokens, the stop kept.
  auto stopped =
      generate(m, cache, prompts,
               SamplingParams{.temperature = 0, .max_new_tokens = 3, .stop_token = greedy[0].tokens[1]})
          .value();
  if (greedy[0].tokens[0] != greedy[0].tokens[1]) {
    CHECK(stopped[0].tokens == std::vector<int32_t>(greedy[0].tokens.begin(), greedy[0].tokens.begin() + 2));
  }
  CHECK(stopped[0].stop == StopReason::stop_token);
  // Context 8, prompt 2: six positions left, so at most 7 tokens (the last
  // sampled from the final position) whatever max_new_tokens says.
  auto full = generate(m, cache, prompts, SamplingParams{.temperature = 0, .max_new_tokens = 50}).value();
  CHECK(full[0].tokens.size() == 7);
  CHECK(full[0].stop == StopReason::context);
  auto none = generate(m, cache, prompts, SamplingParams{.max_new_tokens = 0}).value();
  CHECK(none[0].tokens.empty());
}

TEST_CASE("generate: bad prompts and settings are refused with the reason", "[rl][generate]") {
  auto m = random_model(12, 8);
  auto cache = KvCache::make(m.config(), 2).value();
  std::vector<std::vector<int32_t>> empty = {{}};
  CHECK_THAT(generate(m, cache, empty, {}).error().message(), Catch::Contains("prompt 0 has 0 tokens"));
  std::vector<std::vector<int32_t>> too_long = {std::vector<int32_t>(8, 1)};
  CHECK_THAT(generate(m, cache, too_long, {}).error().message(), Catch::Contains("1 to 7"));
  std::vector<std::vector<int32_t>> bad_token = {seq_of({1, -1})};
  CHECK_THAT(generate(m, cache, bad_token, {}).error().message(), Catch::Contains("outside the vocabulary"));
  std::vector<std::vector<int32_t>> ok = {seq_of({1})};
  CHECK_THAT(generate(m, cache, ok, SamplingParams{.temperature = -1}).error().message(),
             Catch::Contains("temperature"));
  CHECK_THAT(generate(m, cache, ok, SamplingParams{.top_p = 0}).error().message(), Catch::Contains("top_p"));
  CHECK_THAT(generate(m, cache, ok, SamplingParams{.temperature = std::nan("")}).error().message(),
             Catch::Contains("temperature"));
  std::vector<std::vector<int32_t>> too_long_score = {std::vector<int32_t>(9, 1)};
  CHECK_THAT(score(m, cache, too_long_score).error().message(), Catch::Contains("1 to 8"));
}

TEST_CASE("sampler: draws follow the softmax, top-k and top-p keep only the most likely tokens",
          "[rl][generate]") {
  // probabilities 0.4, 0.3, 0.2, 0.1 (logits = their logs).
  std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  std::vector<float> scratch(4);
  std::vector<int32_t> order(4);
  auto histogram = [&](SamplingParams p) {
    SampleRng rng(p.seed, 0);
    std::map<int32_t, double> h;
    const int draws = 40000;
    for (int i = 0; i < draws; ++i) h[sample_token(logits.data(), 4, p, rng, scratch.data(), order.data())] += 1;
    for (auto& [k, v] : h) v /= draws;
    return h;
  };
  auto plain = histogram(SamplingParams{});
  CHECK(plain[0] == Approx(0.4).margin(0.012));
  CHECK(plain[1] == Approx(0.3).margin(0.012));
  CHECK(plain[2] == Approx(0.2).margin(0.012));
  CHECK(plain[3] == Approx(0.1).margin(0.012));
  auto top2 = histogram(SamplingParams{.top_k = 2});
  CHECK(top2.size() == 2);
  CHECK(top2[0] == Approx(0.4 / 0.7).margin(0.012));
  auto nucleus = histogram(SamplingParams{.top_p = 0.5});  // 0.4 < 0.5, 0.4 + 0.3 >= 0.5: tokens 0 and 1
  CHECK(nucleus.size() == 2);
  CHECK(nucleus[1] == Approx(0.3 / 0.7).margin(0.012));
  auto cold = histogram(SamplingParams{.temperature = 0.25});  // p^4: 0.256, 0.081, 0.016, 0.001 (normalised)
  CHECK(cold[0] == Approx(0.256 / 0.354).margin(0.012));
  auto greedy = histogram(SamplingParams{.temperature = 0});
  CHECK(greedy.size() == 1);
  CHECK(greedy[0] == 1.0);
  CHECK(token_logprob(logits.data(), 4, 2) == Approx(std::log(0.2)).margin(1e-6));
}
