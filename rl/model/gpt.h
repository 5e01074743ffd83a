// The policy model: a decoder-only transformer (config.h) over one
// parameter buffer and one gradient buffer of the same layout, with the
// activations of the last forward kept for the backward. llm.c's gpt2 in
// C++: the forward is the kernels of kernels.h in order, the backward the
// same in reverse.
//
//   Gpt<float> m = Gpt<float>::make(config).value();
//   m.init_random(seed);
//   m.forward(tokens, targets, B, T);      // per-token losses: m.losses()
//   m.zero_grad();
//   m.backward(dlosses);                   // grads() += d(sum dlosses * losses)/d params
//
// The per-token loss is -log p(target), the negative log-probability of
// the next token; weighting it per token (dlosses) gives the supervised loss
// with a mask (1/count on answer tokens, 0 on the prompt) and, with the
// policy-gradient loss's derivative, the RL update.
//
// PPO's extras, each computed only when asked for:
//
//   m.forward(tokens, targets, B, T, {.entropy = true});   // m.entropies(): H per position
//   m.values();                            // with GptConfig::value_head: V(s) per position
//   m.backward(dlosses, dvalues, dentropy);   // any of the three may be null
//
// The value head shares the trunk (OpenRLHF's and veRL's critic with a
// shared body): its gradient and the token losses' meet at the final
// LayerNorm and flow through the trunk together.
//
// Not thread-safe: one caller at a time. The kernels run on the compute
// threads (threads.h: set_compute_threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/collective_array.h"
#include "model/config.h"
#include "troupe/status.h"

namespace troupe::rl::model {

/// What a forward computes beyond the per-position losses (and the values,
/// which a model with a value head always computes: a C-wide product per
/// position).
struct ForwardOptions {
  /// The entropy of each position's next-token distribution
  /// (Gpt::entropies()), for PPO's entropy bonus: one more pass over the
  /// (B*T, V) probabilities.
  bool entropy = false;
};

/// A GPT over scalars F (float for the model, double for the tests'
/// reference).
template <typename F>
class Gpt {
 public:
  /// A model of `config` with zero parameters; fails as ParamLayout::make,
  /// or with storage when the memory for them cannot be had.
  static Result<Gpt> make(const GptConfig& config);

  /// GPT-2's initialisation, reproducible from `seed`: weights normal with
  /// std 0.02 (the residual projections 0.02 / sqrt(2 layers)), LayerNorm
  /// weights 1, biases 0; the value head 0 (every value starts at 0, and
  /// the policy's tensors get the numbers they get without a head).
  void init_random(uint64_t seed);

  const ParamLayout& layout() const { return layout_; }
  const GptConfig& config() const { return layout_.config(); }
  /// The parameters and their gradients, layout().total() each, in
  /// CollectiveArrays: a trainer's collectives on them (the gradient
  /// allreduce, ZeRO's allgather of parameters) run in place among the
  /// ranks of a host instead of through the arena's slots.
  F* params() { return params_.data(); }
  const F* params() const { return params_.data(); }
  F* grads() { return grads_.data(); }
  const F* grads() const { return grads_.data(); }

  /// Runs the model on `tokens` (B,T) and, per position, the loss of
  /// predicting `targets` (B,T) next: -log p(target); with a value head the
  /// values, and what `options` asks for. Keeps what the backward needs.
  /// Errors: B or T zero, T past the context length, a token or target
  /// outside the vocabulary.
  Status forward(const int32_t* tokens, const int32_t* targets, size_t B, size_t T, ForwardOptions options = {});
  /// The last forward's per-position losses (B*T) and next-token
  /// distributions (B*T, V).
  const F* losses() const { return losses_.data(); }
  const F* probs() const { return probs_.data(); }
  /// The last forward's value per position (B*T): the value head on the
  /// final LayerNorm's output. REQUIRES: config().value_head.
  const F* values() const;
  /// The last forward's entropy of each position's next-token distribution
  /// (B*T), -sum_v p log p. REQUIRES: that forward had options.entropy.
  const F* entropies() const;
  /// The mean of losses() over positions.
  F mean_loss() const;

  /// Sets grads() to zero.
  void zero_grad();
  /// grads() += the gradient with respect to the parameters of
  ///   sum_i dlosses[i] * losses()[i] + dvalues[i] * values()[i]
  ///                                  + dentropy[i] * entropies()[i]
  /// (each B*T of the last forward; a null one is a term left out).
  /// REQUIRES: a forward before it, on the same inputs (the activations);
  /// dvalues only with a value head, dentropy only after a forward with
  /// options.entropy (else it aborts: a caller's bug, not an input error).
  void backward(const F* dlosses, const F* dvalues = nullptr, const F* dentropy = nullptr);

 private:
  Gpt(ParamLayout layout, CollectiveArray<F> params, CollectiveArray<F> grads);
  // Sizes the activations and the backward's scratch for (B, T).
  void size_for(size_t B, size_t T);

  /// What one layer's forward keeps for the backward.
  struct LayerActs {
    std::vector<F> ln1, ln1_mean, ln1_rstd, qkv, atty, att, attproj, residual2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu,
        fcproj, residual3;
  };

  ParamLayout layout_;
  CollectiveArray<F> params_, grads_;
  size_t B_ = 0, T_ = 0;
  std::vector<int32_t> tokens_, targets_;
  std::vector<F> encoded_, lnf_, lnf_mean_, lnf_rstd_, logits_, probs_, losses_;
  // values_ (B*T) with a value head; entropy_ and mean_logit_ (B*T, sum_v
  // p z: the entropy's backward) when the last forward asked for them.
  std::vector<F> values_, entropy_, mean_logit_;
  bool have_entropy_ = false;
  std::vector<LayerActs> acts_;
  // Scratch, reused layer after layer: preatt_ (B,NH,T,T) the attention
  // scores (the backward needs only their softmax, then its gradient), and
  // the backward's gradients: dresidual_ (B*T,C) the residual stream's,
  // dc_ (B*T,C) a LayerNorm's output's or the attention's, d4c_ (B*T,4C) the
  // MLP's hidden, dqkv_ (B*T,3C), datt_ (B,NH,T,T), dlogits_ (B*T,V).
  std::vector<F> preatt_, dresidual_, dc_, d4c_, dqkv_, datt_, dlogits_;
};

extern template class Gpt<float>;
extern template class Gpt<double>;

}  // namespace troupe::rl::model
