// The DeviceModel and the Decoder (device_model.h) of libtroupe_rl_cuda:
// a GptCuda, with the host copies each step needs.
#include <cuda_runtime_api.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

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

MatmulPrecision precision_of(const GptCudaOptions& o) {
  return o.bf16_matmuls ? MatmulPrecision::bf16 : o.tf32 ? MatmulPrecision::tf32 : MatmulPrecision::fp32;
}

class CudaDeviceModel final : public DeviceModel {
 public:
  CudaDeviceModel(GptCuda gpt, std::string name, std::string id, int devices)
      : gpt_(std::move(gpt)), name_(std::move(name)), id_(std::move(id)), devices_(devices) {}

  std::string describe() const override {
    return "cuda:" + std::to_string(gpt_.options().device) + " " + name_ + ", " +
           precision_name(precision_of(gpt_.options())) + " products";
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
  Status download_params(float* host) override { return gpt_.download_params(host); }
  Status zero_grad() override { return gpt_.zero_grad(); }
  Status accumulate_grads(const float* dlosses) override { return gpt_.backward(dlosses); }
  Result<float*> device_params() override {
    // A collective reads them on a stream of its own (NCCL's).
    if (Status s = gpt_.synchronize(); !s.ok()) return error(s);
    return gpt_.device_params();
  }
  Result<SharedParams> share_params() override {
    auto p = device_params();
    if (!p) return error(p.error());
    SharedParams out;
    out.device = id_;
    out.process = process_nonce();
    out.pid = static_cast<int64_t>(::getpid());
    out.address = reinterpret_cast<uint64_t>(*p);
    out.floats = gpt_.layout().total();
    // The parameters are an allocation of their own: the handle's offset
    // is 0. Without one (a platform without IPC) only this process reaches
    // them.
    cudaIpcMemHandle_t handle;
    if (cudaIpcGetMemHandle(&handle, *p) == cudaSuccess) {
      out.ipc_handle.assign(reinterpret_cast<const char*>(&handle), sizeof handle);
    } else {
      (void)cudaGetLastError();
    }
    return out;
  }
  Result<float*> device_grads() override {
    // The collective runs on a stream of its own (NCCL's): the backward
    // enqueued on the model's must be done first.
    if (Status s = gpt_.synchronize(); !s.ok()) return error(s);
    return gpt_.device_grads();
  }
  Result<double> adamw_step(const AdamWConfig& config) override { return gpt_.adamw_step(config); }
  size_t adamw_steps() const override { return gpt_.adamw_steps(); }
  Status download_adamw_state(float* m, float* v) override { return gpt_.download_adamw_state(m, v); }
  Status restore_adamw_state(const float* m, const float* v, size_t steps) override {
    return gpt_.restore_adamw_state(m, v, steps);
  }

 private:
  GptCuda gpt_;
  std::string name_, id_;
  int devices_;
};

// The KV cache on the device: the host keeps each slot's length
// (assign_positions), the device the keys, values and weights.
class CudaDecoder final : public Decoder {
 public:
  CudaDecoder(GptCuda gpt, std::string name, std::string id, size_t slots)
      : gpt_(std::move(gpt)), name_(std::move(name)), id_(std::move(id)), lengths_(slots, 0) {}
  ~CudaDecoder() override { close_peer(); }
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  std::string describe() const override {
    return "cuda:" + std::to_string(gpt_.options().device) + " " + name_ + ", " +
           precision_name(precision_of(gpt_.options())) + " products";
  }
  const GptConfig& config() const override { return gpt_.config(); }
  size_t slots() const override { return lengths_.size(); }
  size_t length(size_t slot) const override { return lengths_[slot]; }
  void clear(size_t slot) override { lengths_[slot] = 0; }
  void clear_all() override { std::fill(lengths_.begin(), lengths_.end(), size_t{0}); }
  Status set_weights(const Gpt<float>& model) override {
    if (Status s = check_decoder_shape(config(), model); !s.ok()) return s;
    // The policy's parameters come first in a value-head model's layout
    // (ParamLayout::policy_count): the device takes those.
    if (Status s = gpt_.upload_params(model.params()); !s.ok()) return s;
    have_weights_ = true;
    return {};
  }
  Result<float*> standby_weights() override {
    auto p = gpt_.standby_params();
    if (p) standby_asked_ = true;
    return p;
  }
  Status take_standby() override {
    if (!standby_asked_) {
      return Status(ErrorCode::invalid_argument,
                    "cuda decoder: take_standby with no standby; fill standby_weights() "
                    "first");
    }
    if (Status s = gpt_.swap_standby(); !s.ok()) return s;
    have_weights_ = true;
    standby_asked_ = false;  // it holds the old weights now: filled again before the next take
    return {};
  }
  Status copy_into_standby(const SharedParams& from) override {
    const size_t total = gpt_.layout().total();
    if (id_.empty() || from.device != id_) {
      return Status(ErrorCode::unsupported,
                    "cuda decoder: parameters on " + (from.device.empty() ? std::string("no device") : from.device) +
                        ", this decoder is on " + (id_.empty() ? "an unnamed GPU" : id_) + "; read them another way");
    }
    if (from.floats != total) {
      return Status(ErrorCode::invalid_argument, "cuda decoder: " + std::to_string(from.floats) +
                                                     " parameters shared, this model has " + std::to_string(total));
    }
    const void* src = reinterpret_cast<const void*>(from.address);
    if (from.process == process_nonce()) {
      close_peer();  // a mapping kept for another process's parameters is not wanted now
    } else {
      if (from.ipc_handle.size() != sizeof(cudaIpcMemHandle_t)) {
        return Status(ErrorCode::unsupported,
                      "cuda decoder: the parameters of process " + std::to_string(from.pid) +
                          " came without a CUDA IPC handle (its platform gave none); read them another way");
      }
      if (from.ipc_handle != peer_handle_) {
        close_peer();
        cudaIpcMemHandle_t handle;
        std::memcpy(&handle, from.ipc_handle.data(), sizeof handle);
        void* mapped = nullptr;
        if (cudaError_t e = cudaIpcOpenMemHandle(&mapped, handle, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
          (void)cudaGetLastError();
          return Status(ErrorCode::handler_failed,
                        "cuda decoder: opening the CUDA IPC handle of process " + std::to_string(from.pid) +
                            "'s parameters failed: " + cudaGetErrorString(e) + "; read them another way");
        }
        peer_handle_ = from.ipc_handle;
        peer_ = mapped;
      }
      src = peer_;
    }
    // Done (and the source free to change) when it returns.
    if (Status s = gpt_.fill_standby(static_cast<const float*>(src)); !s.ok()) {
      close_peer();  // a handle of a process gone, perhaps: open it anew next time
      return Status(s.code(), "cuda decoder: " + s.message() + "; read them another way");
    }
    standby_asked_ = true;
    return {};
  }
  Status read_weights(float* host) override {
    if (!have_weights_) return Status(ErrorCode::invalid_argument, "cuda decoder: no weights; call set_weights first");
    return gpt_.download_params(host);
  }
  Status append(std::span<const DecodeRow> rows, float* logits) override {
    if (!have_weights_) {
      return Status(ErrorCode::invalid_argument, "cuda decoder: no weights; call set_weights(model) first");
    }
    if (rows.empty()) return {};
    std::vector<size_t> lengths = lengths_;
    if (Status s = assign_positions(config(), rows, lengths, positions_); !s.ok()) return s;
    const size_t n = rows.size();
    slot_ids_.resize(n);
    position_ids_.resize(n);
    tokens_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      slot_ids_[i] = rows[i].slot;
      position_ids_[i] = static_cast<uint32_t>(positions_[i]);
      tokens_[i] = rows[i].token;
    }
    // A failed step leaves the lengths as they were (what it cached is
    // overwritten by the next step at the same positions).
    if (Status s = gpt_.decode(slot_ids_.data(), position_ids_.data(), tokens_.data(), n, logits); !s.ok()) return s;
    lengths_ = std::move(lengths);
    return {};
  }

 private:
  GptCuda gpt_;
  std::string name_, id_;
  std::vector<size_t> lengths_, positions_;
  std::vector<uint32_t> slot_ids_, position_ids_;
  std::vector<int32_t> tokens_;
  bool have_weights_ = false;
  bool standby_asked_ = false;
  // Another process's parameters, mapped by CUDA IPC (kept open while they
  // come from the same allocation).
  std::string peer_handle_;
  void* peer_ = nullptr;

  void close_peer() {
    if (peer_ != nullptr) {
      (void)cudaSetDevice(gpt_.options().device);
      if (cudaIpcCloseMemHandle(peer_) != cudaSuccess) (void)cudaGetLastError();
    }
    peer_ = nullptr;
    peer_handle_.clear();
  }
};

// A GptCuda on the device `options` name, the device's name, and its
// identity ("cuda:" and its UUID; empty where the driver does not say).
struct Made {
  GptCuda gpt;
  std::string name, id;
};

std::string uuid_hex(const cudaUUID_t& uuid) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (char c : uuid.bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

Result<Made> make_gpt(const GptConfig& config, const DeviceModelOptions& options, bool gradients, const char* what,
                      const char* cpu_instead, int* devices) {
  auto count = GptCuda::device_count();
  if (!count) {
    return error(ErrorCode::unsupported,
                 std::string(what) + ": " + count.error().message() + ": " + cpu_instead + ", or run where a GPU is");
  }
  *devices = *count;
  const int device = options.device >= 0 ? options.device : static_cast<int>(options.rank % static_cast<size_t>(*count));
  auto gpt = GptCuda::make(config, {.device = device,
                                    .bf16_matmuls = options.precision == MatmulPrecision::bf16,
                                    .tf32 = options.precision == MatmulPrecision::tf32,
                                    .gradients = gradients});
  if (!gpt) return error(gpt.error());
  cudaDeviceProp prop{};
  Made made{std::move(*gpt), "(unnamed device)", ""};
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    made.name = prop.name;
    made.id = "cuda:" + uuid_hex(prop.uuid);
  } else {
    (void)cudaGetLastError();  // only the name was lost: not an error for the next launch to report as its own
  }
  return made;
}

Result<std::unique_ptr<DeviceModel>> make(const GptConfig& config, const DeviceModelOptions& options) {
  int devices = 0;
  auto made = make_gpt(config, options, /*gradients=*/true, "device model",
                       "train on the CPU (trainer.device = \"cpu\")", &devices);
  if (!made) return error(made.error());
  return std::unique_ptr<DeviceModel>(
      new CudaDeviceModel(std::move(made->gpt), std::move(made->name), std::move(made->id), devices));
}

Result<std::unique_ptr<Decoder>> make_decoder(const GptConfig& config, size_t slots,
                                              const DeviceModelOptions& options) {
  GptConfig policy = config;
  policy.value_head = false;  // a decoder runs the policy alone
  int devices = 0;
  auto made = make_gpt(policy, options, /*gradients=*/false, "device decoder",
                       "generate on the CPU (rollout.device = \"cpu\")", &devices);
  if (!made) return error(made.error());
  if (Status s = made->gpt.make_cache(slots); !s.ok()) return error(s);
  return std::unique_ptr<Decoder>(
      new CudaDecoder(std::move(made->gpt), std::move(made->name), std::move(made->id), slots));
}

}  // namespace

extern "C" int troupe_rl_make_cuda_decoder(const GptConfig* config, size_t slots, const DeviceModelOptions* options,
                                           std::unique_ptr<Decoder>* out, Status* why) {
  auto made = make_decoder(*config, slots, *options);
  if (!made) {
    *why = made.error();
    return 1;
  }
  *out = std::move(*made);
  return 0;
}

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
