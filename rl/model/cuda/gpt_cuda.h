// The policy model on one CUDA GPU: the CPU model's (gpt.h) forward,
// backward and AdamW step (adamw.h), on device buffers of the same
// parameter layout (config.h), so a checkpoint, a weight sync or the
// optimizer's state moves between the two as one buffer each.
//
//   GptCuda m = GptCuda::make(config, {.device = 0, .bf16_matmuls = true}).value();
//   m.init_from(cpu_model);                 // or upload_params(host)
//   m.forward(tokens, targets, B, T);       // host inputs; m.losses(host) copies the losses back
//   m.zero_grad();
//   m.backward(dlosses);                    // grads += d(sum dlosses * losses) / d params
//   double norm = m.adamw_step(adamw_config).value();
//
// And the inference path, kv_cache.h's on the device: make_cache(slots),
// then decode() steps of (slot, position, token) rows that return their
// next-token logits (the Decoder of make_device_decoder wraps it).
//
// Matrix products go to cuBLAS: float32 (cublasGemmEx, 32F compute), TF32
// tensor cores (`tf32`), or bfloat16 (`bf16_matmuls`: float32 master
// weights, weights and activations rounded to bf16 for the products, float32
// accumulation and outputs; the attention is then one fused kernel each
// way, flash_attention.cuh, with its products on bf16 too and no (T,T)
// scores in memory, where the head size allows: a multiple of 16 up to 128).
// Everything else (LayerNorm, GELU, residuals, the causal softmax of the
// unfused attention, softmax + cross-entropy, bias and LayerNorm gradients,
// AdamW) is this library's own kernels, in float32 (model/cuda/kernels.cuh).
// The unfused attention (float32 and TF32, and bf16 with other head sizes)
// is cuBLAS's batched products on the (B,NH,T,T) scores, TF32 in bf16.
//
// All work of one model runs in order on one CUDA stream of its own; the
// host waits only where it reads a result (losses, downloads, the gradient
// norm of adamw_step). Errors are values: a CUDA or cuBLAS failure comes
// back as a Status naming the call; a fault inside a kernel shows at the
// next call that waits (and leaves the device's context unusable, as CUDA
// does).
//
// This header has no CUDA types: plain C++ code may include it.
// Not thread-safe: one caller at a time. A moved-from GptCuda may only be
// destroyed or assigned to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "model/adamw.h"
#include "model/config.h"
#include "model/gpt.h"
#include "troupe/status.h"

namespace troupe::rl::model {

/// Where and how a GptCuda computes.
struct GptCudaOptions {
  /// The CUDA device (cudaSetDevice's index).
  int device = 0;
  /// Matrix products on bf16 copies of weights and activations (float32
  /// accumulation); parameters, gradients and optimizer state stay float32.
  bool bf16_matmuls = false;
  /// float32 matrix products on TF32 tensor cores (ignored with
  /// bf16_matmuls).
  bool tf32 = false;
  /// With bf16_matmuls: the attention fused (flash_attention.cuh) where the
  /// head size allows; false keeps cuBLAS's products on the whole (T,T)
  /// scores (TF32), the baseline the fused kernels are measured against.
  bool fused_attention = true;
  /// false: an inference-only model (a rollout engine's decoder). No
  /// gradient buffer is allocated (as many floats as the parameters), and
  /// what needs one (zero_grad, backward, adamw_step, restore_adamw_state,
  /// the gradients' copies) is refused with that reason.
  bool gradients = true;
};

/// A GPT (config.h) whose parameters, gradients, AdamW moments and
/// activations live on one CUDA device.
class GptCuda {
 public:
  /// A model of `config` with zero parameters and gradients on
  /// `options.device`. Errors: the config's (invalid_argument), a value
  /// head (unsupported: the CUDA path has no kernels for it), no such
  /// device (unsupported), CUDA or cuBLAS failing to start or to allocate
  /// the parameters (start_failed).
  static Result<GptCuda> make(const GptConfig& config, GptCudaOptions options = {});
  /// The CUDA devices this process sees; unsupported ("no CUDA device
  /// here (the driver's reason)") when there are none or the driver
  /// cannot be used.
  static Result<int> device_count();

  GptCuda(GptCuda&&) noexcept;
  GptCuda& operator=(GptCuda&&) noexcept;
  ~GptCuda();

  const ParamLayout& layout() const;
  const GptConfig& config() const;
  const GptCudaOptions& options() const;
  /// Whether the attention runs fused (flash_attention.cuh): bf16_matmuls
  /// and fused_attention set, and a head size the kernels take.
  bool attention_fused() const;

  /// Copies layout().total() parameters in, from host memory in the
  /// layout's order.
  Status upload_params(const float* host);
  /// Copies the parameters out (layout().total() floats, layout order).
  Status download_params(float* host);
  /// Copies the gradients in / out, as the parameters.
  Status upload_grads(const float* host);
  Status download_grads(float* host);
  /// Takes `cpu`'s parameters (its config must be this model's).
  Status init_from(const Gpt<float>& cpu);

  /// Runs the model on `tokens` (B,T) and the per-position losses of
  /// predicting `targets` (B,T): -log p(target) (host arrays, read before
  /// this returns). Keeps what backward needs. Errors, with nothing run:
  /// B or T zero, T past the context length, a token or target outside the
  /// vocabulary, activations too large for the device.
  Status forward(const int32_t* tokens, const int32_t* targets, size_t B, size_t T);
  /// Copies the last forward's B*T losses to `host`.
  Status losses(float* host);

  /// Sets the gradients to zero.
  Status zero_grad();
  /// grads += the gradient of sum_i dlosses[i] * losses[i] (dlosses: B*T
  /// host floats for the last forward, read before this returns).
  /// Errors: no forward before it.
  Status backward(const float* dlosses);

  /// One AdamW step of the parameters with the gradients, as AdamW::step
  /// (adamw.h): decay on matrices only, the gradients scaled in place to
  /// the clip norm when above it, the schedule at adamw_steps(). Returns the
  /// gradients' global norm before clipping; when that is NaN or infinite
  /// nothing changes (no update, no step counted). The moments are
  /// allocated on the first step.
  Result<double> adamw_step(const AdamWConfig& config);
  /// AdamW steps taken so far.
  size_t adamw_steps() const;
  /// Copies the moments out (layout().total() floats each; zeros before
  /// the first step).
  Status download_adamw_state(float* m, float* v);
  /// Replaces the optimizer's state (AdamW::restore's meaning): moments in
  /// the layout's order and the steps taken.
  Status restore_adamw_state(const float* m, const float* v, size_t steps);

  /// The inference path: keys and values of every layer for `slots`
  /// sequences up to the context length, on the device (2 * layers * slots
  /// * context_length * channels floats), replacing any earlier cache.
  /// Errors: zero slots, a context longer than the attention kernel takes,
  /// the cache too large for the device.
  Status make_cache(size_t slots);
  /// Runs the model on `n` rows: row i's `tokens[i]` at position
  /// `positions[i]` of slot `slots[i]`, its key and value cached there
  /// first, attending to positions 0..positions[i] of its slot; writes the
  /// rows' next-token logits (n x vocab_size) to the host array `logits`.
  /// The caller keeps each slot's positions consistent (kv_cache.h's
  /// rule: assign_positions). Errors, with nothing run: no cache, a slot,
  /// position or token out of range.
  Status decode(const uint32_t* slots, const uint32_t* positions, const int32_t* tokens, size_t n, float* logits);

  /// Device pointers to the parameters and gradients (layout().total()
  /// floats each), for collectives and weight sync. The model's work is on
  /// its own stream: synchronize() before using them from another one.
  /// Writing the parameters through the pointer: call device_params()
  /// again after each write, so that bf16 products round them anew.
  float* device_params();
  /// nullptr for an inference-only model (GptCudaOptions::gradients).
  float* device_grads();
  /// A second parameter buffer (layout().total() floats), allocated on the
  /// first call, for the next weights: another stream (NCCL's broadcast)
  /// or a device copy writes it while this model keeps running with its
  /// own; swap_standby() then runs it. The model's enqueued work has
  /// finished when this returns. Errors: allocating it, a fault in that
  /// work.
  Result<float*> standby_params();
  /// Copies layout().total() floats from `device_src` (device memory this
  /// device can read: its own, or another process's mapped by CUDA IPC)
  /// into the standby, on the model's stream, and waits for the copy: the
  /// standby is filled, and the source free to change, when this returns.
  /// Errors: allocating the standby, the copy's.
  Status fill_standby(const float* device_src);
  /// Runs the standby's parameters from now on (bf16 products round them
  /// anew); the old ones become the standby. The standby's writer must be
  /// done. Errors: no standby_params() before it.
  Status swap_standby();
  /// Waits for all enqueued work; reports a fault that happened in it.
  Status synchronize();

 private:
  struct Impl;
  explicit GptCuda(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::rl::model
