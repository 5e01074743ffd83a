// Generalised advantage estimation (Schulman et al. 2016) over completions
// as a token-level MDP: each completion token is a step, its reward the
// caller's (typically the sequence's reward on its last token, minus a
// per-token KL penalty), its value the critic's (Gpt::values()), and the
// episode ends after the last token (no bootstrap past it).
//
// Shapes as the losses': B sequences of T positions, row-major, a mask that
// is 1 on the completion's tokens. A row's steps are its masked positions in
// order; positions off the mask are skipped (neither steps nor a break in
// the chain: the next step of a masked position is the next masked one), and
// get advantage and return 0. So sequences of any length share one padded
// batch.
//
//   delta_t = r_t + gamma * V_{t+1} - V_t              (V after the last step: 0)
//   A_t     = delta_t + gamma * lambda * A_{t+1}
//   R_t     = A_t + V_t                                 (the critic's target)
//
// lambda = 1 gives the Monte Carlo return minus the value; lambda = 0 the
// one-step TD error.
#pragma once

#include <cstddef>

#include "troupe/status.h"

namespace troupe::rl::algo {

/// GAE's discount and trace decay.
struct GaeConfig {
  /// The discount per token (1: none, the usual choice for completions of
  /// bounded length).
  double gamma = 1.0;
  /// The bias-variance trade-off: 1 the Monte Carlo return (unbiased, high
  /// variance), 0 the one-step TD error (the critic's bias, low variance).
  double lambda = 0.95;
  /// Whiten the advantages over the batch afterwards (masked_whiten); the
  /// returns keep the unwhitened advantages.
  bool whiten_advantages = false;

  /// ok, or which field is outside [0, 1].
  Status validate() const;
};

/// Writes `advantages` and `returns` (B*T each, zero off the mask) from
/// per-token `rewards` and `values` (B*T; values may be null: all zero,
/// which makes the returns the discounted rewards-to-go). Errors: a bad
/// config, a missing buffer, whitening with fewer than 2 masked tokens.
template <typename F>
Status gae(const F* rewards, const F* values, const F* mask, size_t B, size_t T, const GaeConfig& config, F* advantages,
           F* returns);

/// x = (x - mean) / sqrt(var + 1e-8) on the masked entries of x (n), mean
/// and the unbiased variance taken over them (veRL's masked_whiten); 0 off
/// the mask. Errors: fewer than 2 masked entries (no variance).
template <typename F>
Status masked_whiten(F* x, const F* mask, size_t n);

}  // namespace troupe::rl::algo
