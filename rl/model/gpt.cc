#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "model/kernels.h"

namespace troupe::rl::model {

template <typename F>
Result<Gpt<F>> Gpt<F>::make(const GptConfig& config) {
  auto layout = ParamLayout::make(config);
  if (!layout) return error(layout.error());
  return Gpt<F>(std::move(*layout));
}

template <typename F>
Gpt<F>::Gpt(ParamLayout layout)
    : layout_(std::move(layout)), params_(layout_.total(), F(0)), grads_(layout_.total(), F(0)) {}

template <typename F>
void Gpt<F>::init_random(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config().layers));
  for (const TensorSpec& t : layout_.tensors()) {
    F* p = params_.data() + t.offset;
    bool is_bias = t.name.ends_with(".bias");
    bool is_norm = t.name.find("ln_") != std::string::npos;
    if (is_norm && !is_bias) {
      std::fill(p, p + t.count, F(1));
    } else if (is_bias) {
      std::fill(p, p + t.count, F(0));
    } else {
      // The projections that add into the residual stream start smaller,
      // so that the stream's variance does not grow with depth (GPT-2).
      bool residual = t.name.ends_with("attn.proj.weight") || t.name.ends_with("mlp.proj.weight");
      std::normal_distribution<double> dist(0.0, residual ? residual_std : 0.02);
      for (size_t i = 0; i < t.count; ++i) p[i] = static_cast<F>(dist(rng));
    }
  }
}

template <typename F>
void Gpt<F>::size_for(size_t B, size_t T) {
  if (B == B_ && T == T_) return;
  B_ = B;
  T_ = T;
  const GptConfig& c = config();
  const size_t BT = B * T, C = c.channels, NH = c.heads, V = c.vocab_size;
  auto size_layer = [&](LayerActs& a) {
    a.ln1.assign(BT * C, 0);
    a.ln1_mean.assign(BT, 0);
    a.ln1_rstd.assign(BT, 0);
    a.qkv.assign(BT * 3 * C, 0);
    a.atty.assign(BT * C, 0);
    a.preatt.assign(B * NH * T * T, 0);
    a.att.assign(B * NH * T * T, 0);
    a.attproj.assign(BT * C, 0);
    a.residual2.assign(BT * C, 0);
    a.ln2.assign(BT * C, 0);
    a.ln2_mean.assign(BT, 0);
    a.ln2_rstd.assign(BT, 0);
    a.fch.assign(BT * 4 * C, 0);
    a.fch_gelu.assign(BT * 4 * C, 0);
    a.fcproj.assign(BT * C, 0);
    a.residual3.assign(BT * C, 0);
  };
  acts_.resize(c.layers);
  dacts_.resize(c.layers);
  for (auto& a : acts_) size_layer(a);
  for (auto& a : dacts_) size_layer(a);
  encoded_.assign(BT * C, 0);
  dencoded_.assign(BT * C, 0);
  lnf_.assign(BT * C, 0);
  dlnf_.assign(BT * C, 0);
  lnf_mean_.assign(BT, 0);
  lnf_rstd_.assign(BT, 0);
  logits_.assign(BT * V, 0);
  dlogits_.assign(BT * V, 0);
  probs_.assign(BT * V, 0);
  losses_.assign(BT, 0);
}

template <typename F>
Status Gpt<F>::forward(const int32_t* tokens, const int32_t* targets, size_t B, size_t T) {
  const GptConfig& c = config();
  if (B == 0 || T == 0 || T > c.context_length) {
    return Status(ErrorCode::invalid_argument, "model forward: batch " + std::to_string(B) + " x " +
                                                   std::to_string(T) + " positions; positions must be 1 to " +
                                                   std::to_string(c.context_length) + " (the context length)");
  }
  const size_t BT = B * T, C = c.channels, NH = c.heads, V = c.vocab_size;
  for (size_t i = 0; i < BT; ++i) {
    if (tokens[i] < 0 || static_cast<size_t>(tokens[i]) >= V || targets[i] < 0 ||
        static_cast<size_t>(targets[i]) >= V) {
      return Status(ErrorCode::invalid_argument, "model forward: position " + std::to_string(i) + " has token " +
                                                     std::to_string(tokens[i]) + " / target " +
                                                     std::to_string(targets[i]) + " outside the vocabulary of " +
                                                     std::to_string(V));
    }
  }
  size_for(B, T);
  tokens_.assign(tokens, tokens + BT);
  targets_.assign(targets, targets + BT);
  const F* p = params_.data();

  encoder_forward(encoded_.data(), tokens, p + layout_.wte(), p + layout_.wpe(), B, T, C);
  for (size_t l = 0; l < c.layers; ++l) {
    const LayerOffsets& o = layout_.layer(l);
    LayerActs& a = acts_[l];
    const F* residual = l == 0 ? encoded_.data() : acts_[l - 1].residual3.data();
    layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), residual, p + o.ln1_w, p + o.ln1_b, BT, C);
    matmul_forward(a.qkv.data(), a.ln1.data(), p + o.qkv_w, p + o.qkv_b, BT, C, 3 * C);
    attention_forward(a.atty.data(), a.preatt.data(), a.att.data(), a.qkv.data(), B, T, C, NH);
    matmul_forward(a.attproj.data(), a.atty.data(), p + o.proj_w, p + o.proj_b, BT, C, C);
    residual_forward(a.residual2.data(), residual, a.attproj.data(), BT * C);
    layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.residual2.data(), p + o.ln2_w,
                      p + o.ln2_b, BT, C);
    matmul_forward(a.fch.data(), a.ln2.data(), p + o.fc_w, p + o.fc_b, BT, C, 4 * C);
    gelu_forward(a.fch_gelu.data(), a.fch.data(), BT * 4 * C);
    matmul_forward(a.fcproj.data(), a.fch_gelu.data(), p + o.fcproj_w, p + o.fcproj_b, BT, 4 * C, C);
    residual_forward(a.residual3.data(), a.residual2.data(), a.fcproj.data(), BT * C);
  }
  layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), acts_.back().residual3.data(), p + layout_.lnf_w(),
                    p + layout_.lnf_b(), BT, C);
  matmul_forward(logits_.data(), lnf_.data(), p + layout_.lm_head(), static_cast<const F*>(nullptr), BT, C, V);
  softmax_forward(probs_.data(), logits_.data(), BT, V);
  crossentropy_forward(losses_.data(), probs_.data(), targets, BT, V);
  return {};
}

template <typename F>
F Gpt<F>::mean_loss() const {
  F sum = 0;
  for (F x : losses_) sum += x;
  return losses_.empty() ? F(0) : sum / static_cast<F>(losses_.size());
}

template <typename F>
void Gpt<F>::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), F(0));
}

template <typename F>
void Gpt<F>::backward(const F* dlosses) {
  const GptConfig& c = config();
  const size_t B = B_, T = T_, BT = B * T, C = c.channels, NH = c.heads, V = c.vocab_size;
  const F* p = params_.data();
  F* g = grads_.data();
  // The activations' gradients accumulate: start from zero.
  auto zero = [](std::vector<F>& v) { std::fill(v.begin(), v.end(), F(0)); };
  for (LayerActs& d : dacts_) {
    for (auto* v : {&d.ln1, &d.qkv, &d.atty, &d.preatt, &d.att, &d.attproj, &d.residual2, &d.ln2, &d.fch, &d.fch_gelu,
                    &d.fcproj, &d.residual3}) {
      zero(*v);
    }
  }
  zero(dencoded_);
  zero(dlnf_);
  zero(dlogits_);

  crossentropy_softmax_backward(dlogits_.data(), dlosses, probs_.data(), targets_.data(), BT, V);
  matmul_backward(dlnf_.data(), g + layout_.lm_head(), static_cast<F*>(nullptr), dlogits_.data(), lnf_.data(),
                  p + layout_.lm_head(), BT, C, V);
  layernorm_backward(dacts_.back().residual3.data(), g + layout_.lnf_w(), g + layout_.lnf_b(), dlnf_.data(),
                     acts_.back().residual3.data(), p + layout_.lnf_w(), lnf_mean_.data(), lnf_rstd_.data(), BT, C);
  for (size_t l = c.layers; l-- > 0;) {
    const LayerOffsets& o = layout_.layer(l);
    LayerActs& a = acts_[l];
    LayerActs& d = dacts_[l];
    const F* residual = l == 0 ? encoded_.data() : acts_[l - 1].residual3.data();
    F* dresidual = l == 0 ? dencoded_.data() : dacts_[l - 1].residual3.data();
    residual_backward(d.residual2.data(), d.fcproj.data(), d.residual3.data(), BT * C);
    matmul_backward(d.fch_gelu.data(), g + o.fcproj_w, g + o.fcproj_b, d.fcproj.data(), a.fch_gelu.data(),
                    p + o.fcproj_w, BT, 4 * C, C);
    gelu_backward(d.fch.data(), a.fch.data(), d.fch_gelu.data(), BT * 4 * C);
    matmul_backward(d.ln2.data(), g + o.fc_w, g + o.fc_b, d.fch.data(), a.ln2.data(), p + o.fc_w, BT, C, 4 * C);
    layernorm_backward(d.residual2.data(), g + o.ln2_w, g + o.ln2_b, d.ln2.data(), a.residual2.data(), p + o.ln2_w,
                       a.ln2_mean.data(), a.ln2_rstd.data(), BT, C);
    residual_backward(dresidual, d.attproj.data(), d.residual2.data(), BT * C);
    matmul_backward(d.atty.data(), g + o.proj_w, g + o.proj_b, d.attproj.data(), a.atty.data(), p + o.proj_w, BT, C,
                    C);
    attention_backward(d.qkv.data(), d.preatt.data(), d.att.data(), d.atty.data(), a.qkv.data(), a.att.data(), B, T,
                       C, NH);
    matmul_backward(d.ln1.data(), g + o.qkv_w, g + o.qkv_b, d.qkv.data(), a.ln1.data(), p + o.qkv_w, BT, C, 3 * C);
    layernorm_backward(dresidual, g + o.ln1_w, g + o.ln1_b, d.ln1.data(), residual, p + o.ln1_w, a.ln1_mean.data(),
                       a.ln1_rstd.data(), BT, C);
  }
  encoder_backward(g + layout_.wte(), g + layout_.wpe(), dencoded_.data(), tokens_.data(), B, T, C);
}

template class Gpt<float>;
template class Gpt<double>;

}  // namespace troupe::rl::model
