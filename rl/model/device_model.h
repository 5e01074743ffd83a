// The policy model's forward and backward on an accelerator, for a trainer.
// Two ways to train with one:
//
// - Offloaded (as ZeRO-Offload keeps AdamW on the CPU): the host holds the
//   parameters, the gradients and the optimizer; each step uploads the
//   parameters, runs the forward there, brings the losses back for the
//   policy loss (model/losses.h, on the host), runs the backward there, and
//   brings the gradients back for the host's collectives and AdamW. ZeRO-1's
//   sharded optimizer trains this way.
//
//     auto dev = make_device_model(config, {.kind = DeviceKind::cuda}).value();
//     dev->upload_params(gpt.params());
//     dev->forward(tokens, targets, B, T, losses);   // B*T -log p(target)
//     dev->backward(dlosses, gpt.grads());           // d sum(dlosses*losses) / d params
//
// - Resident: the parameters, the gradients and AdamW's moments stay on the
//   device between steps. Only the losses and their gradients (B*T floats)
//   cross each step; the data-parallel allreduce runs on the device's
//   gradients in place (the mesh's collective engine takes NCCL for CUDA
//   memory), and the parameters come back only when the host asks for them
//   (a weight sync, a checkpoint).
//
//     dev->upload_params(gpt.params());
//     dev->restore_adamw_state(m, v, steps);         // or nothing: zero moments
//     dev->forward(tokens, targets, B, T, losses);
//     dev->zero_grad();
//     dev->accumulate_grads(dlosses);
//     float* g = dev->device_grads().value();         // allreduce it in place
//     double norm = dev->adamw_step(optim).value();
//     dev->download_params(host);                     // when wanted
//
// make_device_decoder gives the inference path on a device: a Decoder
// (decoder.h) whose KV cache, weights and steps live there, for the
// rollout engines. A weight sync between devices goes from a trainer's
// device_params() into a decoder's standby_weights() (a collective: NCCL
// between GPUs), never through the host.
//
// The CUDA model lives in its own library (libtroupe_rl_cuda, built where
// the CUDA toolkit is): make_device_model loads it when first asked for, so
// a CPU-only process never needs the CUDA libraries, and a machine without
// them gets an error that says so instead of a loader failure at start.
// DeviceKind::host is the same interface on the CPU model, in memory of its
// own: the device paths' reference, which gives the CPU's steps bit for bit
// and runs the trainer's device code where there is no GPU (its tests).
//
// Not thread-safe: one caller at a time per DeviceModel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "model/adamw.h"
#include "model/config.h"
#include "model/decoder.h"
#include "troupe/status.h"

namespace troupe::rl::model {

/// What computes: a CUDA GPU, or the host's CPU model behind the same
/// interface (the device paths' reference: see above).
enum class DeviceKind : uint8_t { cuda, host };

/// How a CUDA device multiplies matrices (GptCudaOptions).
enum class MatmulPrecision : uint8_t { fp32, tf32, bf16 };

/// Where and how a DeviceModel computes.
struct DeviceModelOptions {
  DeviceKind kind = DeviceKind::cuda;
  /// The device's index; -1: `rank` modulo the devices this process sees
  /// (one data-parallel rank per device, round robin).
  int device = -1;
  size_t rank = 0;
  MatmulPrecision precision = MatmulPrecision::fp32;
  /// A host decoder's KvCache::set_batch_invariant (a CUDA decoder's rows
  /// are never batch-invariant: cuBLAS picks its reduction order by shape).
  bool batch_invariant = true;
};

/// A model of one GptConfig whose forward and backward run on a device;
/// the host holds the parameters and gradients (layout order, ParamLayout).
class DeviceModel {
 public:
  virtual ~DeviceModel() = default;

  /// What it runs on, for logs: "cuda:0 NVIDIA H100 80GB HBM3, fp32 products".
  virtual std::string describe() const = 0;
  /// The device's index.
  virtual int device() const = 0;
  /// The devices of its kind this process sees (a rank's is rank modulo it).
  virtual int devices_seen() const = 0;
  /// Copies the ParamLayout's total() parameters in from host memory.
  virtual Status upload_params(const float* host) = 0;
  /// Runs the model on `tokens` (B,T) and writes the per-position losses
  /// of predicting `targets` (B,T), -log p(target), to `losses` (B*T host
  /// floats). Keeps what backward needs. Errors, with nothing run: B or T
  /// zero, T past the context length, a token outside the vocabulary,
  /// activations too large for the device.
  virtual Status forward(const int32_t* tokens, const int32_t* targets, size_t B, size_t T, float* losses) = 0;
  /// Writes the gradient of sum_i dlosses[i] * losses[i] of the last
  /// forward to `grads` (total() host floats, overwritten). Errors: no
  /// forward before it.
  virtual Status backward(const float* dlosses, float* grads) = 0;

  // Resident training (see above): the state stays in the device's memory.
  /// Copies the parameters out (layout order) to `host`.
  virtual Status download_params(float* host) = 0;
  /// Sets the device's gradients to zero.
  virtual Status zero_grad() = 0;
  /// The device's gradients += the gradient of sum_i dlosses[i] * losses[i]
  /// of the last forward (dlosses: B*T host floats, read before this
  /// returns). Errors: no forward before it.
  virtual Status accumulate_grads(const float* dlosses) = 0;
  /// The device's parameters (total() floats in its memory, layout order:
  /// a CUDA pointer on a GPU), for a collective to read (a weight
  /// broadcast); all the work enqueued before has finished when this
  /// returns, and no more is enqueued until the next call on this model.
  /// Errors: a fault in that work.
  virtual Result<float*> device_params() = 0;
  /// Where the parameters are for a decoder on the same device (see
  /// SharedParams); the enqueued work has finished when this returns.
  /// Errors: a fault in that work, the IPC handle refused.
  virtual Result<SharedParams> share_params() = 0;
  /// The device's gradients (total() floats in its memory: a CUDA pointer
  /// on a GPU), for a collective to reduce in place; all the work enqueued
  /// before has finished when this returns, and no more is enqueued until
  /// the next call on this model. Errors: a fault in that work.
  virtual Result<float*> device_grads() = 0;
  /// One AdamW step of the device's parameters with its gradients, as
  /// AdamW::step (adamw.h): returns the gradients' global norm before
  /// clipping; NaN or infinite: nothing changed, no step counted. The
  /// moments start at zero unless restore_adamw_state set them.
  virtual Result<double> adamw_step(const AdamWConfig& config) = 0;
  /// The device optimizer's steps taken.
  virtual size_t adamw_steps() const = 0;
  /// Copies the moments out (total() floats each; zeros before a step).
  virtual Status download_adamw_state(float* m, float* v) = 0;
  /// Replaces the optimizer's state: moments (total() floats each, layout
  /// order) and the steps taken.
  virtual Status restore_adamw_state(const float* m, const float* v, size_t steps) = 0;
};

/// A model of `config` on the device `options` name. Errors: the config's
/// (invalid_argument); unsupported when this build or machine cannot run
/// it (no CUDA library in the build, no device, a value head), saying
/// what to use instead; start_failed when the device fails to start or
/// to allocate. DeviceKind::host makes one on the CPU model in this
/// process (only `kind` counts then).
Result<std::unique_ptr<DeviceModel>> make_device_model(const GptConfig& config, const DeviceModelOptions& options);

/// A Decoder of `slots` sequences for models of `config`, on the device
/// `options` name (its `rank` picks the device as for a DeviceModel). Its
/// memory, 2 * layers * slots * context_length * channels floats of cache
/// plus the weights, is allocated here (and a second copy of the weights
/// on the first Decoder::standby_weights). DeviceKind::host: the CPU's
/// KvCache behind the same interface, with weights of its own and a
/// standby, the device decoder's reference (the CPU cache's logits bit for
/// bit). Errors as make_device_model's, and invalid_argument for zero
/// slots.
Result<std::unique_ptr<Decoder>> make_device_decoder(const GptConfig& config, size_t slots,
                                                     const DeviceModelOptions& options);

/// The entry points libtroupe_rl_cuda exports for make_device_model and
/// make_device_decoder (C names, so that dlsym finds them). Each returns 0
/// and sets `out`, or returns nonzero and sets `why`.
extern "C" int troupe_rl_make_cuda_device_model(const GptConfig* config, const DeviceModelOptions* options,
                                                std::unique_ptr<DeviceModel>* out, Status* why);
extern "C" int troupe_rl_make_cuda_decoder(const GptConfig* config, size_t slots, const DeviceModelOptions* options,
                                           std::unique_ptr<Decoder>* out, Status* why);

}  // namespace troupe::rl::model
