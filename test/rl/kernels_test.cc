// The policy model's layers (rl/model/kernels.h) against finite
// differences: every backward, run in double, gives the gradient that
// central differences of the forward give (to 1e-6 relative), and the float
// instantiation the model runs gives what double does (to float's
// precision). Small shapes: B=2, T=5, C=8, NH=2, OC=6, V=11.
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "model/kernels.h"

using namespace troupe::rl::model;

namespace {

constexpr size_t B = 2, T = 5, C = 8, NH = 2, OC = 6, V = 11;

std::vector<double> random_vector(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// The largest |a - b| / max(1, |b|) over the elements.
double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i])));
  return worst;
}
double max_rel_diff(const std::vector<float>& a, const std::vector<double>& b) {
  return max_rel_diff(std::vector<double>(a.begin(), a.end()), b);
}

/// Central differences of `loss` with respect to each element of `x`.
std::vector<double> numeric_grad(std::vector<double>& x, const std::function<double()>& loss) {
  const double eps = 1e-6;
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double keep = x[i];
    x[i] = keep + eps;
    double up = loss();
    x[i] = keep - eps;
    double down = loss();
    x[i] = keep;
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

}  // namespace

TEST_CASE("model kernels: the encoder's gradients match finite differences", "[rl][model]") {
  std::vector<int32_t> tokens = {3, 0, 10, 3, 7, 1, 1, 4, 9, 2};
  auto wte = random_vector(V * C, 1), wpe = random_vector(T * C, 2), w = random_vector(B * T * C, 3);
  std::vector<double> out(B * T * C);
  auto loss = [&] {
    encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, w);
  };
  std::vector<double> dwte(wte.size()), dwpe(wpe.size());
  encoder_backward(dwte.data(), dwpe.data(), w.data(), tokens.data(), B, T, C);
  CHECK(max_rel_diff(dwte, numeric_grad(wte, loss)) < 1e-6);
  CHECK(max_rel_diff(dwpe, numeric_grad(wpe, loss)) < 1e-6);
}

TEST_CASE("model kernels: layernorm's gradients match finite differences; float agrees with double", "[rl][model]") {
  const size_t N = B * T;
  auto inp = random_vector(N * C, 4, 2.0), weight = random_vector(C, 5), bias = random_vector(C, 6);
  auto w = random_vector(N * C, 7);
  std::vector<double> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    return dot(out, w);
  };
  loss();
  std::vector<double> dinp(inp.size()), dweight(C), dbias(C);
  layernorm_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(), mean.data(),
                     rstd.data(), N, C);
  CHECK(max_rel_diff(dinp, numeric_grad(inp, loss)) < 1e-6);
  CHECK(max_rel_diff(dweight, numeric_grad(weight, loss)) < 1e-6);
  CHECK(max_rel_diff(dbias, numeric_grad(bias, loss)) < 1e-6);

  auto finp = to_float(inp), fweight = to_float(weight), fbias = to_float(bias), fw = to_float(w);
  std::vector<float> fout(N * C), fmean(N), frstd(N), fdinp(inp.size()), fdweight(C), fdbias(C);
  layernorm_forward(fout.data(), fmean.data(), frstd.data(), finp.data(), fweight.data(), fbias.data(), N, C);
  layernorm_backward(fdinp.data(), fdweight.data(), fdbias.data(), fw.data(), finp.data(), fweight.data(),
                     fmean.data(), frstd.data(), N, C);
  loss();
  CHECK(max_rel_diff(fout, out) < 1e-5);
  CHECK(max_rel_diff(fdinp, dinp) < 1e-4);
  CHECK(max_rel_diff(fdweight, dweight) < 1e-4);
}

TEST_CASE("model kernels: matmul's gradients match finite differences, with and without bias", "[rl][model]") {
  const size_t N = B * T;
  auto inp = random_vector(N * C, 8), weight = random_vector(OC * C, 9), bias = random_vector(OC, 10);
  auto w = random_vector(N * OC, 11);
  for (bool with_bias : {true, false}) {
    INFO("bias " << with_bias);
    std::vector<double> out(N * OC);
    auto loss = [&] {
      matmul_forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, N, C, OC);
      return dot(out, w);
    };
    std::vector<double> dinp(inp.size(), 0.5), dweight(weight.size(), -0.25), dbias(OC, 1.0);
    // Backward adds: start from non-zero gradients and take them off after.
    matmul_backward(dinp.data(), dweight.data(), with_bias ? dbias.data() : nullptr, w.data(), inp.data(),
                    weight.data(), N, C, OC);
    for (auto& x : dinp) x -= 0.5;
    for (auto& x : dweight) x += 0.25;
    for (auto& x : dbias) x -= 1.0;
    CHECK(max_rel_diff(dinp, numeric_grad(inp, loss)) < 1e-6);
    CHECK(max_rel_diff(dweight, numeric_grad(weight, loss)) < 1e-6);
    if (with_bias) CHECK(max_rel_diff(dbias, numeric_grad(bias, loss)) < 1e-6);
  }
}

TEST_CASE("model kernels: causal attention's gradients match finite differences; the future is not seen",
          "[rl][model]") {
  auto qkv = random_vector(B * T * 3 * C, 12), w = random_vector(B * T * C, 13);
  std::vector<double> out(B * T * C), preatt(B * NH * T * T), att(B * NH * T * T);
  auto loss = [&] {
    attention_forward(out.data(), preatt.data(), att.data(), qkv.data(), B, T, C, NH);
    return dot(out, w);
  };
  loss();
  std::vector<double> dqkv(qkv.size()), dpreatt(preatt.size()), datt(att.size());
  attention_backward(dqkv.data(), dpreatt.data(), datt.data(), w.data(), qkv.data(), att.data(), B, T, C, NH);
  CHECK(max_rel_diff(dqkv, numeric_grad(qkv, loss)) < 1e-6);

  // Changing the last position changes no earlier output.
  auto before = out;
  for (size_t i = 0; i < 3 * C; ++i) qkv[((B - 1) * T + (T - 1)) * 3 * C + i] += 1.0;
  loss();
  for (size_t t = 0; t + 1 < T; ++t) {
    for (size_t i = 0; i < C; ++i) CHECK(out[((B - 1) * T + t) * C + i] == before[((B - 1) * T + t) * C + i]);
  }
  // Each row of att is a distribution over positions 0..t.
  for (size_t t = 0; t < T; ++t) {
    double sum = 0;
    for (size_t t2 = 0; t2 < T; ++t2) sum += att[t * T + t2];
    CHECK(sum == Approx(1.0));
    if (t + 1 < T) CHECK(att[t * T + T - 1] == 0.0);
  }
}

TEST_CASE("model kernels: gelu and residual gradients match finite differences", "[rl][model]") {
  const size_t n = 40;
  auto inp = random_vector(n, 14, 2.0), w = random_vector(n, 15), other = random_vector(n, 16);
  std::vector<double> out(n);
  auto gelu_loss = [&] {
    gelu_forward(out.data(), inp.data(), n);
    return dot(out, w);
  };
  std::vector<double> dinp(n);
  gelu_backward(dinp.data(), inp.data(), w.data(), n);
  CHECK(max_rel_diff(dinp, numeric_grad(inp, gelu_loss)) < 1e-6);
  gelu_forward(out.data(), inp.data(), n);
  CHECK(out[0] == Approx(0.5 * inp[0] * (1 + std::tanh(std::sqrt(2 / M_PI) * (inp[0] + 0.044715 * std::pow(inp[0], 3))))));

  auto res_loss = [&] {
    residual_forward(out.data(), inp.data(), other.data(), n);
    return dot(out, w);
  };
  std::vector<double> da(n), db(n);
  residual_backward(da.data(), db.data(), w.data(), n);
  CHECK(max_rel_diff(da, numeric_grad(inp, res_loss)) < 1e-6);
  CHECK(max_rel_diff(db, numeric_grad(other, res_loss)) < 1e-6);
}

TEST_CASE("model kernels: softmax cross-entropy's gradient matches finite differences and the loss is -log p",
          "[rl][model]") {
  const size_t N = B * T;
  auto logits = random_vector(N * V, 17, 3.0), dlosses = random_vector(N, 18);
  std::vector<int32_t> targets(N);
  for (size_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 7) % V);
  std::vector<double> probs(N * V), losses(N);
  auto loss = [&] {
    softmax_forward(probs.data(), logits.data(), N, V);
    crossentropy_forward(losses.data(), probs.data(), targets.data(), N, V);
    return dot(losses, dlosses);
  };
  loss();
  std::vector<double> dlogits(logits.size());
  crossentropy_softmax_backward(dlogits.data(), dlosses.data(), probs.data(), targets.data(), N, V);
  CHECK(max_rel_diff(dlogits, numeric_grad(logits, loss)) < 1e-6);
  // Against a direct -log softmax, and stable for large logits.
  double z = 0;
  for (size_t v = 0; v < V; ++v) z += std::exp(logits[v]);
  CHECK(losses[0] == Approx(-(logits[static_cast<size_t>(targets[0])] - std::log(z))));
  std::vector<float> big(V, 1000.0f), p(V), l(1);
  big[3] = 1001.0f;
  int32_t target = 3;
  softmax_forward(p.data(), big.data(), 1, V);
  crossentropy_forward(l.data(), p.data(), &target, 1, V);
  CHECK(std::isfinite(l[0]));
  CHECK(l[0] == Approx(-(1.0 - std::log(std::exp(1.0) + (V - 1)))).epsilon(1e-5));
}
