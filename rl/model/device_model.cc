#include "model/device_model.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>

namespace troupe::rl::model {
namespace {

constexpr const char* kCudaLibrary = "libtroupe_rl_cuda.so.0";

using MakeCuda = decltype(&troupe_rl_make_cuda_device_model);

struct Loaded {
  MakeCuda make = nullptr;
  std::string why;  // when make is null
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
      if (void* sym = dlsym(handle, "troupe_rl_make_cuda_device_model"); sym != nullptr) {
        loaded.make = reinterpret_cast<MakeCuda>(sym);
        return;
      }
      errors += "; " + path + " has no troupe_rl_make_cuda_device_model";
    }
    loaded.why = errors;
  });
  return loaded;
}

}  // namespace

Result<std::unique_ptr<DeviceModel>> make_device_model(const GptConfig& config, const DeviceModelOptions& options) {
  if (Status s = config.validate(); !s.ok()) return error(s);
  const Loaded& lib = cuda_library();
  if (lib.make == nullptr) {
    return error(ErrorCode::unsupported,
                 std::string("device model: the CUDA model is not in this build (") + lib.why +
                     "); build troupe where the CUDA toolkit is (/usr/local/cuda), or train on the CPU");
  }
  std::unique_ptr<DeviceModel> out;
  Status why;
  if (lib.make(&config, &options, &out, &why) != 0) return error(why);
  return out;
}

}  // namespace troupe::rl::model
