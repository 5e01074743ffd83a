// The whole policy model: its backward, in double, gives the gradient that
// finite differences of its loss give, for every parameter (tied and untied
// embeddings); float agrees with double; bad inputs are refused; a few
// steps of gradient descent fit a sequence (the loss falls); parameters
// and gradients lie in CollectiveBuffers, copies included.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "collectives/buffer_registry.h"
#include "model/gpt.h"

using namespace troupe::rl::model;

namespace {

GptConfig tiny(bool tied) {
  return GptConfig{.vocab_size = 13, .context_length = 6, .layers = 2, .heads = 2, .channels = 8,
                   .tied_embeddings = tied};
}

}  // namespace

TEST_CASE("gpt: the backward matches finite differences of the loss for every parameter", "[rl][model]") {
  for (bool tied : {true, false}) {
    INFO("tied embeddings " << tied);
    auto m = Gpt<double>::make(tiny(tied)).value();
    m.init_random(7);
    // Larger weights than GPT-2's init, so that every path carries signal.
    for (size_t i = 0; i < m.layout().total(); ++i) m.params()[i] *= 10;
    const size_t B = 2, T = 5;
    std::vector<int32_t> tokens = {1, 5, 2, 12, 0, 7, 7, 3, 9, 4};
    std::vector<int32_t> targets = {5, 2, 12, 0, 3, 7, 3, 9, 4, 11};
    std::vector<double> dlosses = {0.1, -0.2, 0.3, 0.05, 1.0, 0.0, 0.4, -0.7, 0.2, 0.9};  // any weights
    auto loss = [&] {
      REQUIRE(m.forward(tokens.data(), targets.data(), B, T).ok());
      double s = 0;
      for (size_t i = 0; i < B * T; ++i) s += dlosses[i] * m.losses()[i];
      return s;
    };
    loss();
    m.zero_grad();
    m.backward(dlosses.data());
    std::vector<double> analytic(m.grads(), m.grads() + m.layout().total());
    const double eps = 1e-6;
    double worst = 0;
    std::string worst_at;
    for (const TensorSpec& t : m.layout().tensors()) {
      for (size_t i = 0; i < t.count; ++i) {
        double& x = m.params()[t.offset + i];
        double keep = x;
        x = keep + eps;
        double up = loss();
        x = keep - eps;
        double down = loss();
        x = keep;
        double numeric = (up - down) / (2 * eps);
        double diff = std::abs(numeric - analytic[t.offset + i]) / std::max(1.0, std::abs(numeric));
        if (diff > worst) {
          worst = diff;
          worst_at = t.name + "[" + std::to_string(i) + "]";
        }
      }
    }
    INFO("worst at " << worst_at);
    CHECK(worst < 1e-6);
  }
}

TEST_CASE("gpt: float agrees with double on the same parameters", "[rl][model]") {
  auto md = Gpt<double>::make(tiny(true)).value();
  auto mf = Gpt<float>::make(tiny(true)).value();
  md.init_random(3);
  for (size_t i = 0; i < md.layout().total(); ++i) mf.params()[i] = static_cast<float>(md.params()[i]);
  std::vector<int32_t> tokens = {1, 5, 2, 12, 0, 7};
  std::vector<int32_t> targets = {5, 2, 12, 0, 7, 3};
  REQUIRE(md.forward(tokens.data(), targets.data(), 1, 6).ok());
  REQUIRE(mf.forward(tokens.data(), targets.data(), 1, 6).ok());
  std::vector<double> dd(6, 1.0 / 6);
  std::vector<float> df(6, 1.0f / 6);
  md.zero_grad();
  mf.zero_grad();
  md.backward(dd.data());
  mf.backward(df.data());
  CHECK(mf.mean_loss() == Approx(md.mean_loss()).epsilon(1e-5));
  double worst = 0;
  for (size_t i = 0; i < md.layout().total(); ++i) {
    worst = std::max(worst, std::abs(mf.grads()[i] - md.grads()[i]) / std::max(1e-2, std::abs(md.grads()[i])));
  }
  CHECK(worst < 1e-3);
  // An untrained model predicts about uniformly: loss near log(V).
  CHECK(md.mean_loss() == Approx(std::log(13.0)).epsilon(0.05));
}

TEST_CASE("gpt: inputs outside the vocabulary or the context are refused", "[rl][model]") {
  auto m = Gpt<float>::make(tiny(true)).value();
  std::vector<int32_t> ok = {1, 2, 3}, bad = {1, 13, 3};
  CHECK(m.forward(ok.data(), ok.data(), 1, 3).ok());
  auto s = m.forward(bad.data(), ok.data(), 1, 3);
  CHECK(s.code() == troupe::ErrorCode::invalid_argument);
  CHECK_THAT(s.message(), Catch::Contains("outside the vocabulary"));
  std::vector<int32_t> long_seq(7, 1);
  CHECK_THAT(m.forward(long_seq.data(), long_seq.data(), 1, 7).message(), Catch::Contains("context length"));
}

TEST_CASE("gpt: gradient descent fits a short sequence (the loss falls by far)", "[rl][model]") {
  GptConfig cfg{.vocab_size = 13, .context_length = 8, .layers = 2, .heads = 2, .channels = 16};
  auto m = Gpt<float>::make(cfg).value();
  m.init_random(11);
  std::vector<int32_t> seq = {3, 1, 4, 1, 5, 9, 2, 6, 5};
  std::vector<int32_t> tokens(seq.begin(), seq.end() - 1), targets(seq.begin() + 1, seq.end());
  std::vector<float> dlosses(8, 1.0f / 8);
  REQUIRE(m.forward(tokens.data(), targets.data(), 1, 8).ok());
  float first = m.mean_loss();
  for (int step = 0; step < 200; ++step) {
    REQUIRE(m.forward(tokens.data(), targets.data(), 1, 8).ok());
    m.zero_grad();
    m.backward(dlosses.data());
    for (size_t i = 0; i < m.layout().total(); ++i) m.params()[i] -= 0.1f * m.grads()[i];
  }
  REQUIRE(m.forward(tokens.data(), targets.data(), 1, 8).ok());
  INFO("loss " << first << " -> " << m.mean_loss());
  CHECK(m.mean_loss() < 0.1f * first);
}

TEST_CASE("gpt: parameters and gradients lie in CollectiveBuffers (a trainer's collectives run in place) and a "
          "copy has buffers of its own",
          "[rl][model]") {
  auto m = Gpt<float>::make(tiny(false)).value();
  m.init_random(3);
  const size_t bytes = m.layout().total() * sizeof(float);
  auto params = troupe::collectives::find_registered(m.params(), bytes);
  auto grads = troupe::collectives::find_registered(m.grads(), bytes);
  REQUIRE(params.has_value());
  REQUIRE(grads.has_value());
  CHECK(params->offer.cookie != grads->offer.cookie);
  Gpt<float> copy = m;
  auto copied = troupe::collectives::find_registered(copy.params(), bytes);
  REQUIRE(copied.has_value());
  CHECK(copied->offer.cookie != params->offer.cookie);
  CHECK(std::equal(m.params(), m.params() + m.layout().total(), copy.params()));
  copy.params()[0] += 1.0f;  // its own memory
  CHECK(copy.params()[0] != m.params()[0]);
  // Moved, the buffers go along: the same memory, still registered.
  const float* before = m.params();
  Gpt<float> moved = std::move(m);
  CHECK(moved.params() == before);
  CHECK(troupe::collectives::find_registered(moved.params(), bytes).has_value());
}
