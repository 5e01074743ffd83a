// The policy model's forward and backward on an accelerator, for a trainer
// that keeps the parameters, the optimizer and the gradient collectives on
// the host (as ZeRO-Offload keeps AdamW on the CPU): each step uploads the
// parameters, runs the forward there, brings the losses back for the
// policy loss (model/losses.h, on the host), runs the backward there, and
// brings the gradients back for the host's allreduce and AdamW.
//
//   auto dev = make_device_model(config, {.kind = DeviceKind::cuda}).value();
//   dev->upload_params(gpt.params());
//   dev->forward(tokens, targets, B, T, losses);   // B*T -log p(target)
//   dev->backward(dlosses, gpt.grads());           // d sum(dlosses*losses) / d params
//
// make_device_decoder gives the inference path on a device: a Decoder
// (decoder.h) whose KV cache, weights and steps live there, for the
// rollout engines.
//
// The CUDA model lives in its own library (libtroupe_rl_cuda, built where
// the CUDA toolkit is): make_device_model loads it when first asked for, so
// a CPU-only process never needs the CUDA libraries, and a machine without
// them gets an error that says so instead of a loader failure at start.
//
// Not thread-safe: one caller at a time per DeviceModel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "model/config.h"
#include "model/decoder.h"
#include "troupe/status.h"

namespace troupe::rl::model {

/// What computes.
enum class DeviceKind : uint8_t { cuda };

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
};

/// A model of `config` on the device `options` name. Errors: the config's
/// (invalid_argument); unsupported when this build or machine cannot run
/// it (no CUDA library in the build, no device, a value head), saying
/// what to use instead; start_failed when the device fails to start or
/// to allocate.
Result<std::unique_ptr<DeviceModel>> make_device_model(const GptConfig& config, const DeviceModelOptions& options);

/// A Decoder of `slots` sequences for models of `config`, on the device
/// `options` name (its `rank` picks the device as for a DeviceModel). Its
/// memory, 2 * layers * slots * context_length * channels floats of cache
/// plus the weights, is allocated here. Errors as make_device_model's, and
/// invalid_argument for zero slots.
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
