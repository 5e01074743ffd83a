// The DeviceModel (device_model.h) of libtroupe_rl_cuda: a GptCuda, with
// the host copies each step needs.
#include <cuda_runtime_api.h>

#include <string>

#include "model/cuda/gpt_cuda.h"
#include "model/device_model.h"

namespace troupe::rl::model {
namespace {

const char* precision_name(MatmulPrecision p) {
  switch (p) {
    case MatmulPrecision::fp32: return "fp32";
    case MatmulPrecision::tf32: return "tf32";
    case MatmulPrecision::bf16: return "bf16";
  }
  return "?";
}

class CudaDeviceModel final : public DeviceModel {
 public:
  CudaDeviceModel(GptCuda gpt, std::string name, int devices)
      : gpt_(std::move(gpt)), name_(std::move(name)), devices_(devices) {}

  std::string describe() const override {
    return "cuda:" + std::to_string(gpt_.options().device) + " " + name_ + ", " +
           precision_name(gpt_.options().bf16_matmuls ? MatmulPrecision::bf16
                          : gpt_.options().tf32       ? MatmulPrecision::tf32
                                                      : MatmulPrecision::fp32) +
           " products";
  }
  int device() const override { return gpt_.options().device; }
  int devices_seen() const override { return devices_; }
  Status upload_params(const float* host) override { return gpt_.upload_params(host); }
  Status forward(const int32_t* tokens, const int32_t* targets, size_t B, size_t T, float* losses) override {
    if (Status s = gpt_.forward(tokens, targets, B, T); !s.ok()) return s;
    return gpt_.losses(losses);
  }
  Status backward(const float* dlosses, float* grads) override {
    if (Status s = gpt_.zero_grad(); !s.ok()) return s;
    if (Status s = gpt_.backward(dlosses); !s.ok()) return s;
    return gpt_.download_grads(grads);
  }

 private:
  GptCuda gpt_;
  std::string name_;
  int devices_;
};

Result<std::unique_ptr<DeviceModel>> make(const GptConfig& config, const DeviceModelOptions& options) {
  auto count = GptCuda::device_count();
  if (!count) {
    return error(ErrorCode::unsupported, "device model: " + count.error().message() +
                                             ": train on the CPU (trainer.device = \"cpu\"), or run where a GPU is");
  }
  const int device = options.device >= 0 ? options.device : static_cast<int>(options.rank % static_cast<size_t>(*count));
  auto gpt = GptCuda::make(config, {.device = device,
                                    .bf16_matmuls = options.precision == MatmulPrecision::bf16,
                                    .tf32 = options.precision == MatmulPrecision::tf32});
  if (!gpt) return error(gpt.error());
  cudaDeviceProp prop{};
  std::string name = cudaGetDeviceProperties(&prop, device) == cudaSuccess ? prop.name : "(unnamed device)";
  return std::unique_ptr<DeviceModel>(new CudaDeviceModel(std::move(*gpt), std::move(name), *count));
}

}  // namespace

extern "C" int troupe_rl_make_cuda_device_model(const GptConfig* config, const DeviceModelOptions* options,
                                                std::unique_ptr<DeviceModel>* out, Status* why) {
  auto made = make(*config, *options);
  if (!made) {
    *why = made.error();
    return 1;
  }
  *out = std::move(*made);
  return 0;
}

}  // namespace troupe::rl::model
