// libFuzzer target for the frame decoder: the stream prefix and the Cap'n
// Proto header. Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address).
// With TROUPE_WRITE_SEEDS=DIR set, it first writes one valid frame of every
// kind into DIR, as seeds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "wire.h"
#include "wire_samples.h"


extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("TROUPE_WRITE_SEEDS")) {
    int i = 0;
    for (const auto& m : troupe::wire::samples()) {
      std::string header = troupe::wire::encode(m);
      std::string frame(troupe::wire::kPrefixBytes, '\0');
      troupe::wire::write_prefix(reinterpret_cast<std::byte*>(frame.data()), static_cast<uint32_t>(header.size()), 0);
      frame += header;
      std::ofstream(std::string(dir) + "/seed-" + std::to_string(i++) + "-" + troupe::wire::message_name(m),
                    std::ios::binary)
          << frame;
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size);
  troupe::wire::Limits limits;
  limits.max_header_bytes = 1 << 16;
  if (bytes.size() >= troupe::wire::kPrefixBytes) {
    auto prefix = troupe::wire::read_prefix(bytes.first<troupe::wire::kPrefixBytes>(), limits);
    if (prefix) {
      auto rest = bytes.subspan(troupe::wire::kPrefixBytes);
      if (rest.size() >= prefix->header_bytes) (void)troupe::wire::decode(rest.first(prefix->header_bytes), limits);
    }
  }
  // The header decoder on its own, whatever the prefix said.
  (void)troupe::wire::decode(bytes, limits);
  return 0;
}
