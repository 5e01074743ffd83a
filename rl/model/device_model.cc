#include "model/device_model.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>

namespace troupe::rl::model {
namespace {

constexpr const char* kCudaLibrary = "libtroupe_rl_cuda.so.0";

using MakeCudaModel = decltype(&troupe_rl_make_cuda_device_model);
using MakeCudaDecoder = decltype(&troupe_rl_make_cuda_decoder);

struct Loaded {
  MakeCudaModel make_model = nullptr;
  MakeCudaDecoder make_decoder = nullptr;
  std::string why;  // when the entry points are null
};

// The CUDA library's entry point, loaded once per process. It is looked
// for beside this library first (a build tree, an install, a bundle keep
// the two together), then where the dynamic loader looks.
const Loaded& cuda_library() {
  static Loaded loaded;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    Dl_info self{};
    if (dladdr(reinterpret_cast<const void*>(&make_device_model), &self) != 0 && self.dli_fname != nullptr) {
      candidates.push_back((std::filesystem::path(self.dli_fname).parent_path() / kCudaLibrary).string());
    }
    candidates.emplace_back(kCudaLibrary);
    std::string errors;
    for (const auto& path : candidates) {
      // RTLD_NODELETE: the model's code must outlive every DeviceModel,
      // whichever static destructor runs last.
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
      if (handle == nullptr) {
        const char* e = dlerror();
        errors += std::string(errors.empty() ? "" : "; ") + (e != nullptr ? e : path);
        continue;
      }
      void* model = dlsym(handle, "troupe_rl_make_cuda_device_model");
      void* decoder = dlsym(handle, "troupe_rl_make_cuda_decoder");
      if (model != nullptr && decoder != nullptr) {
        loaded.make_model = reinterpret_cast<MakeCudaModel>(model);
        loaded.make_decoder = reinterpret_cast<MakeCudaDecoder>(decoder);
        return;
      }
      errors += "; " + path + " lacks troupe_rl_make_cuda_device_model or troupe_rl_make_cuda_decoder (an older build?)";
    }
    loaded.why = errors;
  });
  return loaded;
}

// The loaded library, or why there is none.
Result<const Loaded*> cuda_entry_points(const char* what) {
  const Loaded& lib = cuda_library();
  if (lib.make_model != nullptr) return &lib;
  return error(ErrorCode::unsupported, std::string(what) + ": the CUDA model is not in this build (" + lib.why +
                                           "); build troupe where the CUDA toolkit is (/usr/local/cuda), or run on "
                                           "the CPU");
}

}  // namespace

// host_device_model.cc.
Result<std::unique_ptr<DeviceModel>> make_host_device_model(const GptConfig& config);
Result<std::unique_ptr<Decoder>> make_host_decoder(const GptConfig& config, size_t slots, bool batch_invariant);

Result<std::unique_ptr<DeviceModel>> make_device_model(const GptConfig& config, const DeviceModelOptions& options) {
  if (Status s = config.validate(); !s.ok()) return error(s);
  if (options.kind == DeviceKind::host) return make_host_device_model(config);
  auto lib = cuda_entry_points("device model");
  if (!lib) return error(lib.error());
  std::unique_ptr<DeviceModel> out;
  Status why;
  if ((*lib)->make_model(&config, &options, &out, &why) != 0) return error(why);
  return out;
}

Result<std::unique_ptr<Decoder>> make_device_decoder(const GptConfig& config, size_t slots,
                                                     const DeviceModelOptions& options) {
  if (Status s = config.validate(); !s.ok()) return error(s);
  if (slots == 0) return error(ErrorCode::invalid_argument, "device decoder: zero slots; give it at least one");
  if (options.kind == DeviceKind::host) return make_host_decoder(config, slots, options.batch_invariant);
  auto lib = cuda_entry_points("device decoder");
  if (!lib) return error(lib.error());
  std::unique_ptr<Decoder> out;
  Status why;
  if ((*lib)->make_decoder(&config, slots, &options, &out, &why) != 0) return error(why);
  return out;
}

}  // namespace troupe::rl::model
