// The policy model's layers (rl/model/kernels.h) against finite
// differences: every backward, run in double, gives the gradient that
// central differences of the forward give (to 1e-6 relative), and the float
// instantiation the model runs gives what double does (to float's
// precision). Small shapes: B=2, T=5, C=8, NH=2, OC=6, V=11. Then the
// write mode of the backwards, the float exp's accuracy, and the compute
// threads (rl/model/threads.h): every range run once, and the kernels'
// results the same at any thread count.
#include <atomic>
#include <cmath>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "model/kernels.h"
#include "model/threads.h"

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

TEST_CASE("model kernels: layernorm's gradients match finite differences, float agrees with double", "[rl][model]") {
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

TEST_CASE("model kernels: causal attention's gradients match finite differences, the future is not seen",
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

TEST_CASE("model kernels: the entropy is -sum p log p, its gradient matches finite differences, float agrees",
          "[rl][model][entropy]") {
  const size_t N = B * T;
  auto logits = random_vector(N * V, 60, 3.0), dentropy = random_vector(N, 61);
  std::vector<double> probs(N * V), entropy(N), mean_logit(N);
  auto loss = [&] {
    softmax_forward(probs.data(), logits.data(), N, V);
    entropy_forward(entropy.data(), mean_logit.data(), probs.data(), logits.data(), N, V);
    return dot(entropy, dentropy);
  };
  loss();
  for (size_t n = 0; n < N; ++n) {
    double h = 0, m = 0;
    for (size_t v = 0; v < V; ++v) {
      const double p = probs[n * V + v];
      h -= p * std::log(p);
      m += p * logits[n * V + v];
    }
    CHECK(entropy[n] == Approx(h).epsilon(1e-12));
    CHECK(mean_logit[n] == Approx(m).epsilon(1e-12));
  }
  // The gradient adds into what dlogits holds.
  std::vector<double> dlogits(logits.size(), 0.25);
  entropy_softmax_backward(dlogits.data(), dentropy.data(), probs.data(), logits.data(), mean_logit.data(), N, V);
  for (auto& x : dlogits) x -= 0.25;
  CHECK(max_rel_diff(dlogits, numeric_grad(logits, loss)) < 1e-6);
  loss();
  std::vector<double> added(logits.size(), 0.0), written(logits.size(), 5.0);
  entropy_softmax_backward(added.data(), dentropy.data(), probs.data(), logits.data(), mean_logit.data(), N, V);
  entropy_softmax_backward(written.data(), dentropy.data(), probs.data(), logits.data(), mean_logit.data(), N, V,
                           Grad::write);
  CHECK(max_rel_diff(written, added) == 0.0);

  auto flogits = to_float(logits), fdentropy = to_float(dentropy);
  std::vector<float> fprobs(probs.size()), fentropy(N), fmean(N), fdlogits(logits.size());
  softmax_forward(fprobs.data(), flogits.data(), N, V);
  entropy_forward(fentropy.data(), fmean.data(), fprobs.data(), flogits.data(), N, V);
  entropy_softmax_backward(fdlogits.data(), fdentropy.data(), fprobs.data(), flogits.data(), fmean.data(), N, V);
  CHECK(max_rel_diff(fentropy, entropy) < 1e-5);
  CHECK(max_rel_diff(fdlogits, dlogits) < 1e-5);

  // Uniform: log V.
  std::vector<float> flat(V, 7.0f), p(V);
  float h = 0, m = 0;
  softmax_forward(p.data(), flat.data(), 1, V);
  entropy_forward(&h, &m, p.data(), flat.data(), 1, V);
  CHECK(h == Approx(std::log(static_cast<double>(V))).epsilon(1e-6));
  // One logit far above the rest: probabilities that underflow to 0 (where
  // -p log p would be 0 * -inf) give an entropy of 0, not NaN.
  std::vector<double> peaked(V, -1000.0), dp(V);
  peaked[4] = 1000.0;
  double dh = 1, dm = 0;
  softmax_forward(dp.data(), peaked.data(), 1, V);
  entropy_forward(&dh, &dm, dp.data(), peaked.data(), 1, V);
  CHECK(dp[0] == 0.0);
  CHECK(dh == 0.0);
  CHECK(dm == 1000.0);
}

TEST_CASE("model kernels: attention over several blocks of positions matches finite differences and float",
          "[rl][model]") {
  // T = 40 crosses the kernels' blocks of positions (16) and ends inside one.
  const size_t b = 1, t = 40, c = 8, nh = 2;
  auto qkv = random_vector(b * t * 3 * c, 19), w = random_vector(b * t * c, 20);
  std::vector<double> out(b * t * c), preatt(b * nh * t * t), att(b * nh * t * t);
  auto loss = [&] {
    attention_forward(out.data(), preatt.data(), att.data(), qkv.data(), b, t, c, nh);
    return dot(out, w);
  };
  loss();
  // The scratch need not start at zero; dqkv is added to.
  std::vector<double> dqkv(qkv.size(), 0.5), dpreatt(preatt.size(), 7.0), datt(att.size(), -3.0);
  attention_backward(dqkv.data(), dpreatt.data(), datt.data(), w.data(), qkv.data(), att.data(), b, t, c, nh);
  for (auto& x : dqkv) x -= 0.5;
  CHECK(max_rel_diff(dqkv, numeric_grad(qkv, loss)) < 1e-6);
  loss();
  for (size_t h = 0; h < nh; ++h) {
    for (size_t r = 0; r < t; ++r) {
      for (size_t col = r + 1; col < t; ++col) {
        CHECK(att[(h * t + r) * t + col] == 0.0);
        CHECK(preatt[(h * t + r) * t + col] == 0.0);
      }
    }
  }

  auto fqkv = to_float(qkv), fw = to_float(w);
  std::vector<float> fout(out.size()), fpreatt(preatt.size()), fatt(att.size()), fdqkv(qkv.size());
  std::vector<float> fdpreatt(preatt.size()), fdatt(att.size());
  attention_forward(fout.data(), fpreatt.data(), fatt.data(), fqkv.data(), b, t, c, nh);
  attention_backward(fdqkv.data(), fdpreatt.data(), fdatt.data(), fw.data(), fqkv.data(), fatt.data(), b, t, c, nh);
  CHECK(max_rel_diff(fout, out) < 1e-5);
  CHECK(max_rel_diff(fdqkv, dqkv) < 1e-4);
}

TEST_CASE("model kernels: a backward in write mode gives what adding into zeros gives", "[rl][model]") {
  const size_t N = B * T;
  auto same = [](const std::vector<double>& a, const std::vector<double>& b) { return max_rel_diff(a, b) == 0.0; };
  {
    auto inp = random_vector(N * C, 21), weight = random_vector(OC * C, 22), dout = random_vector(N * OC, 23);
    std::vector<double> added(N * C, 0.0), written(N * C, 9.0), dw(OC * C), db(OC);
    matmul_backward(added.data(), dw.data(), db.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
    matmul_backward(written.data(), dw.data(), db.data(), dout.data(), inp.data(), weight.data(), N, C, OC,
                    Grad::write);
    CHECK(same(written, added));
  }
  {
    auto inp = random_vector(N * C, 24, 2.0), weight = random_vector(C, 25), bias = random_vector(C, 26);
    auto dout = random_vector(N * C, 27);
    std::vector<double> out(N * C), mean(N), rstd(N), dw(C), db(C), added(N * C, 0.0), written(N * C, -4.0);
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    layernorm_backward(added.data(), dw.data(), db.data(), dout.data(), inp.data(), weight.data(), mean.data(),
                       rstd.data(), N, C);
    layernorm_backward(written.data(), dw.data(), db.data(), dout.data(), inp.data(), weight.data(), mean.data(),
                       rstd.data(), N, C, Grad::write);
    CHECK(same(written, added));
  }
  {
    auto qkv = random_vector(B * T * 3 * C, 28), dout = random_vector(B * T * C, 29);
    std::vector<double> out(B * T * C), preatt(B * NH * T * T), att(B * NH * T * T), scratch1(att.size());
    std::vector<double> scratch2(att.size()), added(qkv.size(), 0.0), written(qkv.size(), 3.0);
    attention_forward(out.data(), preatt.data(), att.data(), qkv.data(), B, T, C, NH);
    attention_backward(added.data(), scratch1.data(), scratch2.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                       NH);
    attention_backward(written.data(), scratch1.data(), scratch2.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                       NH, Grad::write);
    CHECK(same(written, added));
  }
  {
    const size_t n = 50;
    auto inp = random_vector(n, 30, 3.0), dout = random_vector(n, 31);
    std::vector<double> added(n, 0.0), written(n, 1.0), in_place = dout;
    gelu_backward(added.data(), inp.data(), dout.data(), n);
    gelu_backward(written.data(), inp.data(), dout.data(), n, Grad::write);
    gelu_backward(in_place.data(), inp.data(), in_place.data(), n, Grad::write);
    CHECK(same(written, added));
    CHECK(same(in_place, added));
  }
  {
    auto probs = random_vector(N * V, 32), dlosses = random_vector(N, 33);
    std::vector<int32_t> targets(N);
    for (size_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 5) % V);
    std::vector<double> added(N * V, 0.0), written(N * V, 2.0);
    crossentropy_softmax_backward(added.data(), dlosses.data(), probs.data(), targets.data(), N, V);
    crossentropy_softmax_backward(written.data(), dlosses.data(), probs.data(), targets.data(), N, V, Grad::write);
    CHECK(same(written, added));
  }
}

TEST_CASE("model kernels: float's exp is within 2e-7 of exact, so softmax and gelu are within float precision",
          "[rl][model]") {
  // Softmax rows whose logits span 80 (probabilities down to e^-80), the
  // range the polynomial exp covers: each probability within 4 ulp-ish.
  const size_t rows = 64, cols = 300;
  std::vector<double> logits(rows * cols), probs(rows * cols);
  std::mt19937 rng(34);
  std::uniform_real_distribution<double> u(-80.0, 0.0);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = (i % cols == 0) ? 0.0 : u(rng);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<double>(static_cast<float>(logits[i]));
  auto flogits = to_float(logits);
  std::vector<float> fprobs(probs.size());
  softmax_forward(probs.data(), logits.data(), rows, cols);
  softmax_forward(fprobs.data(), flogits.data(), rows, cols);
  double worst = 0;
  for (size_t i = 0; i < probs.size(); ++i) worst = std::max(worst, std::abs(fprobs[i] - probs[i]) / probs[i]);
  CHECK(worst < 5e-7);

  // GELU over [-10, 10] (where its value is a normal float). Its value
  // rests on exp(-2u), u = sqrt(2/pi) (x + 0.044715 x^3): float's rounding of
  // u alone moves that by |2u| ulp, so the bound is relative to
  // max(1, |2u|); the derivative, which crosses zero, absolute.
  std::vector<double> x, y, dy, ones;
  for (double v = -10.0; v <= 10.0; v += 1.0 / 1024) x.push_back(static_cast<double>(static_cast<float>(v)));
  y.resize(x.size());
  dy.resize(x.size());
  ones.assign(x.size(), 1.0);
  auto fx = to_float(x), fones = to_float(ones);
  std::vector<float> fy(x.size()), fdy(x.size());
  gelu_forward(y.data(), x.data(), x.size());
  gelu_forward(fy.data(), fx.data(), x.size());
  gelu_backward(dy.data(), x.data(), ones.data(), x.size());
  gelu_backward(fdy.data(), fx.data(), fones.data(), x.size());
  double worst_y = 0, worst_dy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double two_u = 2 * std::sqrt(2 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i]);
    const double rel = std::abs(fy[i] - y[i]) / std::max(std::abs(y[i]), 1e-300);
    worst_y = std::max(worst_y, rel / std::max(1.0, std::abs(two_u)));
    worst_dy = std::max(worst_dy, std::abs(fdy[i] - dy[i]));
  }
  CHECK(worst_y < 4e-7);
  CHECK(worst_dy < 1e-5);
  // And the double form is GPT-2's tanh GELU (whose 1 + tanh cancels for
  // negative x: compared to absolute 1e-12).
  double worst_tanh_form = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double tanh_form = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    worst_tanh_form = std::max(worst_tanh_form, std::abs(y[i] - tanh_form));
  }
  CHECK(worst_tanh_form < 1e-12);
}

TEST_CASE("compute threads: every index of a parallel_for runs once, nested and from concurrent callers",
          "[rl][model]") {
  for (size_t threads : {1, 2, 3, 5}) {
    set_compute_threads(threads);
    CHECK(compute_threads() == threads);
    const size_t n = 1000;
    std::vector<std::atomic<int>> hits(n);
    parallel_for(n, 7, [&](size_t i0, size_t i1) {
      for (size_t i = i0; i < i1; ++i) hits[i].fetch_add(1);
    });
    // A region inside a region runs on its caller's thread.
    parallel_for(10, 1, [&](size_t o0, size_t o1) {
      for (size_t o = o0; o < o1; ++o) {
        parallel_for(100, 1, [&](size_t i0, size_t i1) {
          for (size_t i = i0; i < i1; ++i) hits[o * 100 + i].fetch_add(1);
        });
      }
    });
    // Two callers at once: one gets the pool, the other runs inline.
    std::vector<std::thread> callers;
    for (int k = 0; k < 2; ++k) {
      callers.emplace_back([&] {
        for (int r = 0; r < 200; ++r) {
          parallel_for(n, 1, [&](size_t i0, size_t i1) {
            for (size_t i = i0; i < i1; ++i) hits[i].fetch_add(1);
          });
        }
      });
    }
    for (auto& c : callers) c.join();
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += hits[i].load() != 2 + 400;
    INFO("threads " << threads);
    CHECK(wrong == 0);
  }
  set_compute_threads(0);
  CHECK(compute_threads() == std::max<size_t>(1, std::thread::hardware_concurrency()));
}

TEST_CASE("compute threads: the kernels give the same results at 1, 2 and 4 threads", "[rl][model]") {
  // Shapes past every kernel's grain, so that each splits.
  const size_t b = 4, t = 64, c = 64, nh = 4, n = b * t, oc = 3 * c, v = 300;
  auto fv = [](size_t count, uint32_t seed, double scale = 1.0) { return to_float(random_vector(count, seed, scale)); };
  const auto inp = fv(n * c, 40, 2.0), weight = fv(oc * c, 41), bias = fv(oc, 42), dmm = fv(n * oc, 43);
  const auto lnw = fv(c, 44), lnb = fv(c, 45), dln = fv(n * c, 46), qkv = fv(n * 3 * c, 47), datty = fv(n * c, 48);
  const auto logits = fv(n * v, 49, 3.0), big = fv(n * 4 * c, 50, 2.0), dlosses = fv(n, 51);
  std::vector<int32_t> targets(n);
  for (size_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 13) % v);

  // Everything each kernel writes, in one vector per thread count.
  auto run = [&](size_t threads) {
    set_compute_threads(threads);
    std::vector<float> mm(n * oc), dinp(n * c), dw(oc * c), db(oc);
    matmul_forward(mm.data(), inp.data(), weight.data(), bias.data(), n, c, oc);
    matmul_backward(dinp.data(), dw.data(), db.data(), dmm.data(), inp.data(), weight.data(), n, c, oc);
    std::vector<float> ln(n * c), mean(n), rstd(n), dlninp(n * c), dlnw(c), dlnb(c);
    layernorm_forward(ln.data(), mean.data(), rstd.data(), inp.data(), lnw.data(), lnb.data(), n, c);
    layernorm_backward(dlninp.data(), dlnw.data(), dlnb.data(), dln.data(), inp.data(), lnw.data(), mean.data(),
                       rstd.data(), n, c);
    std::vector<float> atty(n * c), preatt(b * nh * t * t), att(preatt.size()), dqkv(n * 3 * c), s1(att.size());
    std::vector<float> s2(att.size());
    attention_forward(atty.data(), preatt.data(), att.data(), qkv.data(), b, t, c, nh);
    attention_backward(dqkv.data(), s1.data(), s2.data(), datty.data(), qkv.data(), att.data(), b, t, c, nh);
    std::vector<float> g(big.size()), dg(big.size()), probs(n * v), dlogits(n * v), res(n * c);
    gelu_forward(g.data(), big.data(), big.size());
    gelu_backward(dg.data(), big.data(), g.data(), big.size());
    softmax_forward(probs.data(), logits.data(), n, v);
    crossentropy_softmax_backward(dlogits.data(), dlosses.data(), probs.data(), targets.data(), n, v);
    residual_forward(res.data(), inp.data(), dln.data(), n * c);
    // Products first (BLAS may block a split product differently), then the
    // rest, which must agree bit for bit.
    std::vector<std::vector<float>> products = {mm, dinp, dw, db, atty, dqkv};
    std::vector<std::vector<float>> rest = {ln, mean, rstd, dlninp, dlnw, dlnb, att, g, dg, probs, dlogits, res};
    return std::make_pair(products, rest);
  };
  auto one = run(1);
  for (size_t threads : {2, 4}) {
    INFO("threads " << threads);
    auto other = run(threads);
    for (size_t i = 0; i < one.first.size(); ++i) {
      INFO("product output " << i);
      double worst = 0;
      for (size_t j = 0; j < one.first[i].size(); ++j) {
        worst = std::max(worst, std::abs(static_cast<double>(other.first[i][j]) - one.first[i][j]) /
                                    std::max(1.0, std::abs(static_cast<double>(one.first[i][j]))));
      }
      CHECK(worst < 1e-5);
    }
    for (size_t i = 0; i < one.second.size(); ++i) {
      INFO("output " << i);
      CHECK(other.second[i] == one.second[i]);
    }
  }
  set_compute_threads(0);
}

TEST_CASE("model kernels: the batch-invariant product gives each row the same bits at any batch size, thread "
          "count and ISA, and the product's value",
          "[rl][model]") {
  // Inner sizes with and without a partial 16-lane piece; outputs not a
  // multiple of the 4-output blocks.
  for (auto [C, OC] : {std::pair<size_t, size_t>{64, 193}, {37, 30}, {256, 1024}}) {
    INFO("C " << C << " OC " << OC);
    std::mt19937 rng(static_cast<uint32_t>(C * 1000 + OC));
    std::normal_distribution<float> d;
    const size_t N = 13;
    std::vector<float> in(N * C), w(OC * C), bias(OC);
    for (auto& x : in) x = d(rng);
    for (auto& x : w) x = d(rng);
    for (auto& x : bias) x = d(rng);
    // Each row alone.
    std::vector<float> alone(N * OC);
    for (size_t n = 0; n < N; ++n) {
      matmul_forward_invariant(alone.data() + n * OC, in.data() + n * C, w.data(), bias.data(), 1, C, OC);
    }
    // Threads split a product by row blocks, or, for fewer blocks than
    // threads, by panels of outputs (an odd count leaves uneven panels).
    for (size_t threads : {size_t{1}, size_t{2}, size_t{3}}) {
      set_compute_threads(threads);
      for (size_t rows : {size_t{1}, size_t{2}, size_t{5}, N}) {
        // Rows [N - rows, N) together.
        std::vector<float> together(rows * OC);
        matmul_forward_invariant(together.data(), in.data() + (N - rows) * C, w.data(), bias.data(), rows, C, OC);
        CHECK(std::equal(together.begin(), together.end(), alone.begin() + (N - rows) * OC));
      }
    }
    // Every ISA's path (those this machine has) gives the same bits, split
    // by rows (13 rows on 1 thread) and by outputs (1 row on 3 threads).
    size_t paths = 0;
    for (size_t threads : {size_t{1}, size_t{3}}) {
      set_compute_threads(threads);
      const size_t rows = threads == 1 ? N : 1;
      for (int isa = 0; isa < 3; ++isa) {
        std::vector<float> by(rows * OC);
        if (!matmul_forward_invariant_on(isa, by.data(), in.data(), w.data(), bias.data(), rows, C, OC)) continue;
        ++paths;
        INFO("isa path " << isa << ", " << threads << " threads");
        CHECK(std::equal(by.begin(), by.end(), alone.begin()));
      }
    }
    set_compute_threads(1);
    CHECK(paths >= 2);  // SSE2 is every x86-64's
    // And it is the product: BLAS's to float rounding.
    std::vector<float> blas(N * OC);
    matmul_forward(blas.data(), in.data(), w.data(), bias.data(), N, C, OC);
    double worst = 0;
    for (size_t i = 0; i < blas.size(); ++i) worst = std::max(worst, std::abs(double(blas[i]) - alone[i]));
    CHECK(worst < 1e-3);
  }
}
