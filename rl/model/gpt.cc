#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "model/kernels.h"
#include "model/threads.h"

namespace troupe::rl::model {
namespace {

// A caller broke a REQUIRES of gpt.h: a bug, not an input to refuse.
[[noreturn]] void broken_contract(const char* what) {
  std::fprintf(stderr, "troupe: gpt: %s\n", what);
  std::abort();
}

}  // namespace

template <typename F>
Result<Gpt<F>> Gpt<F>::make(const GptConfig& config) {
  auto layout = ParamLayout::make(config);
  if (!layout) return error(layout.error());
  auto params = CollectiveArray<F>::make(layout->total());
  if (!params) return error(params.error());
  auto grads = CollectiveArray<F>::make(layout->total());
  if (!grads) return error(grads.error());
  return Gpt<F>(std::move(*layout), std::move(*params), std::move(*grads));
}

template <typename F>
Gpt<F>::Gpt(ParamLayout layout, CollectiveArray<F> params, CollectiveArray<F> grads)
    : layout_(std::move(layout)), params_(std::move(params)), grads_(std::move(grads)) {}

template <typename F>
void Gpt<F>::init_random(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config().layers));
  for (const TensorSpec& t : layout_.tensors()) {
    F* p = params_.data() + t.offset;
    bool is_bias = t.name.ends_with(".bias");
    bool is_norm = t.name.find("ln_") != std::string::npos;
    if (t.name.starts_with("value_head.")) {
      // Values start at 0 whatever the trunk computes: the critic's first
      // targets (the returns) are not yet known, and a random head would add
      // noise to the first advantages.
      std::fill(p, p + t.count, F(0));
    } else if (is_norm && !is_bias) {
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
  acts_.resize(c.layers);
  for (LayerActs& a : acts_) {
    a.ln1.resize(BT * C);
    a.ln1_mean.resize(BT);
    a.ln1_rstd.resize(BT);
    a.qkv.resize(BT * 3 * C);
    a.atty.resize(BT * C);
    a.att.resize(B * NH * T * T);
    a.attproj.resize(BT * C);
    a.residual2.resize(BT * C);
    a.ln2.resize(BT * C);
    a.ln2_mean.resize(BT);
    a.ln2_rstd.resize(BT);
    a.fch.resize(BT * 4 * C);
    a.fch_gelu.resize(BT * 4 * C);
    a.fcproj.resize(BT * C);
    a.residual3.resize(BT * C);
  }
  encoded_.resize(BT * C);
  lnf_.resize(BT * C);
  lnf_mean_.resize(BT);
  lnf_rstd_.resize(BT);
  logits_.resize(BT * V);
  probs_.resize(BT * V);
  losses_.resize(BT);
  if (c.value_head) values_.resize(BT);
  entropy_.resize(BT);
  mean_logit_.resize(BT);
  preatt_.resize(B * NH * T * T);
  dresidual_.resize(BT * C);
  dc_.resize(BT * C);
  d4c_.resize(BT * 4 * C);
  dqkv_.resize(BT * 3 * C);
  datt_.resize(B * NH * T * T);
  dlogits_.resize(BT * V);
}

template <typename F>
Status Gpt<F>::forward(const int32_t* tokens, const int32_t* targets, size_t B, size_t T, ForwardOptions options) {
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
  have_entropy_ = false;
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
    attention_forward(a.atty.data(), preatt_.data(), a.att.data(), a.qkv.data(), B, T, C, NH);
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
  if (c.value_head) {
    matmul_forward(values_.data(), lnf_.data(), p + layout_.value_head_w(), p + layout_.value_head_b(), BT, C,
                   size_t{1});
  }
  if (options.entropy) {
    entropy_forward(entropy_.data(), mean_logit_.data(), probs_.data(), logits_.data(), BT, V);
    have_entropy_ = true;
  }
  return {};
}

template <typename F>
const F* Gpt<F>::values() const {
  if (!config().value_head) broken_contract("values() of a model without a value head (GptConfig::value_head)");
  return values_.data();
}

template <typename F>
const F* Gpt<F>::entropies() const {
  if (!have_entropy_) broken_contract("entropies() after a forward that did not ask for them (ForwardOptions)");
  return entropy_.data();
}

template <typename F>
F Gpt<F>::mean_loss() const {
  F sum = 0;
  for (F x : losses_) sum += x;
  return losses_.empty() ? F(0) : sum / static_cast<F>(losses_.size());
}

template <typename F>
void Gpt<F>::zero_grad() {
  parallel_for(grads_.size(), size_t{1} << 16,
               [&](size_t i0, size_t i1) { std::fill(grads_.begin() + i0, grads_.begin() + i1, F(0)); });
}

template <typename F>
void Gpt<F>::backward(const F* dlosses, const F* dvalues, const F* dentropy) {
  const GptConfig& c = config();
  if (dvalues != nullptr && !c.value_head) broken_contract("backward with dvalues on a model without a value head");
  if (dentropy != nullptr && !have_entropy_) {
    broken_contract("backward with dentropy after a forward that did not compute the entropies (ForwardOptions)");
  }
  const bool through_logits = dlosses != nullptr || dentropy != nullptr;
  if (!through_logits && dvalues == nullptr) return;  // every term left out: the gradient adds nothing
  const size_t B = B_, T = T_, BT = B * T, C = c.channels, NH = c.heads, V = c.vocab_size;
  const F* p = params_.data();
  F* g = grads_.data();
  // dres: the residual stream's gradient, from the output back to the
  // embeddings. A residual connection passes it on unchanged, so one buffer
  // serves every layer: each LayerNorm's backward adds its branch into it.
  // Every other gradient has one writer (Grad::write): nothing to zero.
  F* dres = dresidual_.data();
  // The final LayerNorm's output feeds the logits and the value head: dc_
  // gets the logits' gradient first (written), the head's added to it.
  if (dlosses != nullptr) {
    crossentropy_softmax_backward(dlogits_.data(), dlosses, probs_.data(), targets_.data(), BT, V, Grad::write);
  }
  if (dentropy != nullptr) {
    entropy_softmax_backward(dlogits_.data(), dentropy, probs_.data(), logits_.data(), mean_logit_.data(), BT, V,
                             dlosses != nullptr ? Grad::add : Grad::write);
  }
  if (through_logits) {
    matmul_backward(dc_.data(), g + layout_.lm_head(), static_cast<F*>(nullptr), dlogits_.data(), lnf_.data(),
                    p + layout_.lm_head(), BT, C, V, Grad::write);
  }
  if (dvalues != nullptr) {
    matmul_backward(dc_.data(), g + layout_.value_head_w(), g + layout_.value_head_b(), dvalues, lnf_.data(),
                    p + layout_.value_head_w(), BT, C, size_t{1}, through_logits ? Grad::add : Grad::write);
  }
  layernorm_backward(dres, g + layout_.lnf_w(), g + layout_.lnf_b(), dc_.data(), acts_.back().residual3.data(),
                     p + layout_.lnf_w(), lnf_mean_.data(), lnf_rstd_.data(), BT, C, Grad::write);
  for (size_t l = c.layers; l-- > 0;) {
    const LayerOffsets& o = layout_.layer(l);
    const LayerActs& a = acts_[l];
    const F* residual = l == 0 ? encoded_.data() : acts_[l - 1].residual3.data();
    // The MLP: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))).
    matmul_backward(d4c_.data(), g + o.fcproj_w, g + o.fcproj_b, dres, a.fch_gelu.data(), p + o.fcproj_w, BT, 4 * C, C,
                    Grad::write);
    gelu_backward(d4c_.data(), a.fch.data(), d4c_.data(), BT * 4 * C, Grad::write);
    matmul_backward(dc_.data(), g + o.fc_w, g + o.fc_b, d4c_.data(), a.ln2.data(), p + o.fc_w, BT, C, 4 * C,
                    Grad::write);
    layernorm_backward(dres, g + o.ln2_w, g + o.ln2_b, dc_.data(), a.residual2.data(), p + o.ln2_w, a.ln2_mean.data(),
                       a.ln2_rstd.data(), BT, C);
    // Attention: residual2 = residual + proj(attention(qkv(ln1(residual)))).
    matmul_backward(dc_.data(), g + o.proj_w, g + o.proj_b, dres, a.atty.data(), p + o.proj_w, BT, C, C, Grad::write);
    attention_backward(dqkv_.data(), preatt_.data(), datt_.data(), dc_.data(), a.qkv.data(), a.att.data(), B, T, C,
                       NH, Grad::write);
    matmul_backward(dc_.data(), g + o.qkv_w, g + o.qkv_b, dqkv_.data(), a.ln1.data(), p + o.qkv_w, BT, C, 3 * C,
                    Grad::write);
    layernorm_backward(dres, g + o.ln1_w, g + o.ln1_b, dc_.data(), residual, p + o.ln1_w, a.ln1_mean.data(),
                       a.ln1_rstd.data(), BT, C);
  }
  encoder_backward(g + layout_.wte(), g + layout_.wpe(), dres, tokens_.data(), B, T, C);
}

template class Gpt<float>;
template class Gpt<double>;

}  // namespace troupe::rl::model
