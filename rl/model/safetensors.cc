#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/atomic_write.h"

namespace troupe::rl::model {

static_assert(std::endian::native == std::endian::little,
              "safetensors: the format is little-endian, and the tensors are copied as they are in memory");

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The reference implementation's bound: a header longer than this is
// refused before it is read.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kReservedPrefix = "troupe.";
constexpr std::string_view kStepKey = "troupe.optimizer.step";

struct DtypeInfo {
  Dtype dtype;
  std::string_view name;
  size_t size_bytes;
};
// Indexed by the enum's value.
constexpr std::array<DtypeInfo, 15> kDtypes = {{
    {Dtype::boolean, "BOOL", 1},
    {Dtype::u8, "U8", 1},
    {Dtype::i8, "I8", 1},
    {Dtype::f8_e5m2, "F8_E5M2", 1},
    {Dtype::f8_e4m3, "F8_E4M3", 1},
    {Dtype::i16, "I16", 2},
    {Dtype::u16, "U16", 2},
    {Dtype::f16, "F16", 2},
    {Dtype::bf16, "BF16", 2},
    {Dtype::i32, "I32", 4},
    {Dtype::u32, "U32", 4},
    {Dtype::f32, "F32", 4},
    {Dtype::f64, "F64", 8},
    {Dtype::i64, "I64", 8},
    {Dtype::u64, "U64", 8},
}};

std::optional<Dtype> parse_dtype(std::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.name == name) return d.dtype;
  }
  return std::nullopt;
}

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// A name from an untrusted header, quoted and escaped for a message.
std::string quote_name(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string shape_text(const std::vector<size_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// product(shape) * size_bytes, or nullopt when it overflows.
std::optional<size_t> bytes_of(const std::vector<size_t>& shape, size_t size_bytes) {
  size_t n = size_bytes;
  for (size_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

// ---- bfloat16 ----------------------------------------------------------------

uint16_t float_to_bf16(float f) {
  const auto u = std::bit_cast<uint32_t>(f);
  // Rounding a NaN could carry it into infinity: keep the sign and the top
  // of the payload, and make it quiet.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Round to nearest, ties to even (cannot overflow: |u| <= 0x7f800000).
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// ---- files -------------------------------------------------------------------

// A file descriptor, closed when it goes out of scope (unless released).
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now; 0 or the errno (a delayed write error shows here on NFS).
  int close() {
    int fd = std::exchange(fd_, -1);
    return ::close(fd) == 0 ? 0 : errno;
  }

 private:
  int fd_;
};


// 0, or the errno; a file shorter than offset + size is EIO (it shrank
// under us: the size came from fstat).
int read_all(int fd, uint64_t offset, std::span<std::byte> out) {
  std::byte* p = out.data();
  size_t left = out.size();
  while (left > 0) {
    ssize_t n = ::pread(fd, p, std::min<size_t>(left, size_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    p += n;
    offset += static_cast<uint64_t>(n);
    left -= static_cast<size_t>(n);
  }
  return 0;
}

// A file's first bytes: the 8-byte length and the header (all of the file
// when `whole`), and the file's size.
struct FileBytes {
  std::vector<std::byte> bytes;
  uint64_t file_size = 0;
};

Status bad_file(std::string_view source, const std::string& what) {
  return Status(ErrorCode::malformed, "safetensors " + std::string(source) + ": " + what);
}

uint64_t le_u64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The header's length from the first 8 bytes, checked against its bound and
// the file's size.
Result<uint64_t> header_length(const std::byte* first8, uint64_t file_size, std::string_view source) {
  const uint64_t n = le_u64(first8);
  if (n > kMaxHeaderBytes) {
    return error(bad_file(source, "header length " + std::to_string(n) + " is past the limit of " +
                                      std::to_string(kMaxHeaderBytes) + " bytes (not a safetensors file?)"));
  }
  if (n > file_size - 8) {
    return error(bad_file(source, "header length " + std::to_string(n) + " runs past the end of the file (" +
                                      std::to_string(file_size) + " bytes; truncated?)"));
  }
  return n;
}

Result<FileBytes> read_file(const fs::path& path, bool whole) {
  const std::string source = path.string();
  auto io_error = [&](int err, const std::string& doing) {
    return error(err == ENOENT ? ErrorCode::not_found : ErrorCode::storage,
                 "safetensors " + source + ": " + doing + ": " + errno_text(err));
  };
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return io_error(errno, "opening");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return io_error(errno, "stat");
  if (!S_ISREG(st.st_mode)) return error(bad_file(source, "not a regular file"));
  FileBytes out;
  out.file_size = static_cast<uint64_t>(st.st_size);
  if (out.file_size < 8) {
    return error(bad_file(
        source, "the file is " + std::to_string(out.file_size) + " bytes, shorter than the 8-byte header length"));
  }
  std::array<std::byte, 8> first8{};
  if (int err = read_all(fd.get(), 0, first8); err != 0) return io_error(err, "reading");
  auto n = header_length(first8.data(), out.file_size, source);
  if (!n) return error(n.error());
  const uint64_t size = whole ? out.file_size : 8 + *n;
  try {
    out.bytes.resize(size);
  } catch (const std::bad_alloc&) {
    return error(ErrorCode::storage,
                 "safetensors " + source + ": " + std::to_string(size) + " bytes do not fit in memory");
  }
  if (int err = read_all(fd.get(), 0, out.bytes); err != 0) {
    return io_error(err, err == EIO ? "reading (did the file shrink while it was read?)" : "reading");
  }
  return out;
}

// ---- the header --------------------------------------------------------------

// A validated header: the tensors (data not attached yet), where each one's
// data lies, and the metadata.
struct Header {
  std::vector<SafetensorsTensor> tensors;  // in data order
  std::vector<std::pair<uint64_t, uint64_t>> offsets;
  SafetensorsMetadata metadata;
  uint64_t data_start = 0;  // in the file: 8 + the header's length
};

// The non-negative integers of a JSON array, or nullopt.
std::optional<std::vector<uint64_t>> unsigned_array(const json& a) {
  if (!a.is_array()) return std::nullopt;
  std::vector<uint64_t> out;
  out.reserve(a.size());
  for (const json& v : a) {
    if (!v.is_number_unsigned()) return std::nullopt;
    out.push_back(v.get<uint64_t>());
  }
  return out;
}

// Parses and checks `text` (the header's bytes), whose data part holds
// `data_bytes` bytes.
Result<Header> parse_header(std::string_view text, uint64_t data_bytes, std::string_view source) {
  // nlohmann keeps the last of repeated keys; the callback sees them all.
  std::vector<std::set<std::string, std::less<>>> keys;  // per open object
  std::optional<std::string> repeated;
  auto on_event = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == json::parse_event_t::key && !repeated && !keys.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(key).second) repeated = key;
    }
    return true;
  };
  json root = json::parse(text.begin(), text.end(), on_event, /*allow_exceptions=*/false);
  if (root.is_discarded()) return error(bad_file(source, "the header is not valid JSON"));
  if (!root.is_object()) return error(bad_file(source, "the header is JSON but not an object"));
  if (repeated) return error(bad_file(source, "the header has the key " + quote_name(*repeated) + " more than once"));

  Header h;
  for (const auto& [name, entry] : root.items()) {
    if (name == kMetadataKey) {
      if (entry.is_null()) continue;
      if (!entry.is_object()) return error(bad_file(source, "__metadata__ is not an object of strings"));
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return error(
              bad_file(source, "__metadata__ " + quote_name(key) + " is " + value.type_name() + ", not a string"));
        }
        h.metadata.emplace(key, value.get<std::string>());
      }
      continue;
    }
    const std::string what = "tensor " + quote_name(name);
    if (!entry.is_object()) return error(bad_file(source, what + ": its entry is not an object"));
    auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return error(bad_file(source, what + ": no dtype string"));
    }
    auto dtype = parse_dtype(dtype_it->get_ref<const std::string&>());
    if (!dtype) {
      return error(bad_file(source, what + ": dtype " + quote_name(dtype_it->get_ref<const std::string&>()) +
                                        " is not one of the format's (F32, BF16, F16, I64, ...)"));
    }
    auto shape_it = entry.find("shape");
    auto shape = shape_it == entry.end() ? std::nullopt : unsigned_array(*shape_it);
    if (!shape) return error(bad_file(source, what + ": shape is not an array of non-negative integers"));
    auto offsets_it = entry.find("data_offsets");
    auto offsets = offsets_it == entry.end() ? std::nullopt : unsigned_array(*offsets_it);
    if (!offsets || offsets->size() != 2 || (*offsets)[0] > (*offsets)[1]) {
      return error(bad_file(source, what + ": data_offsets is not [begin, end] with begin <= end"));
    }
    SafetensorsTensor t{name, *dtype, std::vector<size_t>(shape->begin(), shape->end()), {}};
    const uint64_t begin = (*offsets)[0], end = (*offsets)[1];
    auto bytes = bytes_of(t.shape, dtype_size_bytes(*dtype));
    if (!bytes) return error(bad_file(source, what + ": shape " + shape_text(t.shape) + " overflows"));
    if (*bytes != end - begin) {
      return error(bad_file(source, what + ": shape " + shape_text(t.shape) + " of " + std::string(dtype_name(*dtype)) +
                                        " is " + std::to_string(*bytes) + " bytes, but data_offsets [" +
                                        std::to_string(begin) + ", " + std::to_string(end) + "] span " +
                                        std::to_string(end - begin)));
    }
    h.tensors.push_back(std::move(t));
    h.offsets.emplace_back(begin, end);
  }

  // The tensors must tile [0, data_bytes): in offset order, each begins
  // where the one before ended.
  std::vector<size_t> order(h.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return h.offsets[a] < h.offsets[b]; });
  uint64_t covered = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const auto [begin, end] = h.offsets[order[k]];
    const std::string what = "tensor " + quote_name(h.tensors[order[k]].name);
    if (end > data_bytes) {
      return error(bad_file(source, what + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                                        "] run past the data's " + std::to_string(data_bytes) +
                                        " bytes (truncated file?)"));
    }
    if (begin < covered) {
      return error(bad_file(source, what + " overlaps tensor " + quote_name(h.tensors[order[k - 1]].name) +
                                        " (bytes from " + std::to_string(begin) + " to " + std::to_string(covered) +
                                        ")"));
    }
    if (begin > covered) {
      return error(bad_file(source, "data bytes from " + std::to_string(covered) + " to " + std::to_string(begin) +
                                        " belong to no tensor"));
    }
    covered = end;
  }
  if (covered != data_bytes) {
    return error(bad_file(source, "data bytes from " + std::to_string(covered) + " to " + std::to_string(data_bytes) +
                                      " (the end of the file) belong to no tensor"));
  }
  Header sorted;
  sorted.metadata = std::move(h.metadata);
  for (size_t i : order) {
    sorted.tensors.push_back(std::move(h.tensors[i]));
    sorted.offsets.push_back(h.offsets[i]);
  }
  return sorted;
}

// Splits a file's first bytes into the header and the size of the data.
Result<Header> header_of(std::span<const std::byte> bytes, uint64_t file_size, std::string_view source) {
  if (file_size < 8) {
    return error(
        bad_file(source, "the file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length"));
  }
  auto n = header_length(bytes.data(), file_size, source);
  if (!n) return error(n.error());
  std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, *n);
  auto header = parse_header(text, file_size - 8 - *n, source);
  if (header) header->data_start = 8 + *n;
  return header;
}

// ---- the model's tensors -----------------------------------------------------

SafetensorsMetadata config_metadata(const GptConfig& c) {
  return {
      {"troupe.format", std::string(kModelFormat)},
      {"troupe.vocab_size", std::to_string(c.vocab_size)},
      {"troupe.context_length", std::to_string(c.context_length)},
      {"troupe.layers", std::to_string(c.layers)},
      {"troupe.heads", std::to_string(c.heads)},
      {"troupe.channels", std::to_string(c.channels)},
      {"troupe.tied_embeddings", c.tied_embeddings ? "true" : "false"},
      {"troupe.value_head", c.value_head ? "true" : "false"},
  };
}

std::optional<uint64_t> parse_u64(std::string_view s) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

Result<GptConfig> config_from_metadata(const SafetensorsMetadata& meta, std::string_view source) {
  auto format = meta.find("troupe.format");
  if (format == meta.end()) {
    return error(bad_file(source, "no troupe.format in the metadata (not a checkpoint of save_model)"));
  }
  if (format->second != kModelFormat) {
    return error(bad_file(
        source, "troupe.format is " + quote_name(format->second) + ", this build reads " + std::string(kModelFormat)));
  }
  GptConfig c;
  std::string missing;
  auto number = [&](const char* key, size_t& out) {
    auto it = meta.find(key);
    auto v = it == meta.end() ? std::nullopt : parse_u64(it->second);
    if (v) {
      out = *v;
    } else if (missing.empty()) {
      missing = key;
    }
  };
  number("troupe.vocab_size", c.vocab_size);
  number("troupe.context_length", c.context_length);
  number("troupe.layers", c.layers);
  number("troupe.heads", c.heads);
  number("troupe.channels", c.channels);
  auto flag = [&](const char* key, bool& out) {
    auto it = meta.find(key);
    if (it == meta.end() || (it->second != "true" && it->second != "false")) {
      if (missing.empty()) missing = key;
    } else {
      out = it->second == "true";
    }
  };
  flag("troupe.tied_embeddings", c.tied_embeddings);
  // Checkpoints written before the value head existed have no key: none.
  if (meta.contains("troupe.value_head")) flag("troupe.value_head", c.value_head);
  if (!missing.empty()) return error(bad_file(source, missing + " is missing or not a number (or true/false)"));
  if (Status s = c.validate(); !s.ok()) return error(bad_file(source, "the recorded " + s.message()));
  return c;
}

Status refuse_reserved_keys(const SafetensorsMetadata& metadata, std::string_view context) {
  for (const auto& [key, value] : metadata) {
    if (key.starts_with(kReservedPrefix)) {
      return Status(ErrorCode::invalid_argument, std::string(context) + ": metadata key " + key +
                                                     " is reserved (the troupe.* keys are the checkpoint's own)");
    }
  }
  return {};
}

// The caller's metadata plus the config's keys.
SafetensorsMetadata model_metadata(const ParamLayout& layout, const SafetensorsMetadata& caller) {
  SafetensorsMetadata meta = caller;
  meta.merge(config_metadata(layout.config()));
  return meta;
}

// The parameters' tensors, viewing `params` (f32) or `bf16` (filled here).
std::vector<SafetensorsTensor> param_tensors(const ParamLayout& layout, const float* params, Dtype dtype,
                                             std::vector<uint16_t>& bf16, std::string_view prefix = {}) {
  std::vector<SafetensorsTensor> out;
  out.reserve(layout.tensors().size());
  if (dtype == Dtype::bf16) {
    bf16.resize(layout.total());
    for (size_t i = 0; i < layout.total(); ++i) bf16[i] = float_to_bf16(params[i]);
  }
  for (const TensorSpec& s : layout.tensors()) {
    std::span<const std::byte> data = dtype == Dtype::bf16 ? std::as_bytes(std::span(bf16.data() + s.offset, s.count))
                                                           : std::as_bytes(std::span(params + s.offset, s.count));
    out.push_back(SafetensorsTensor{std::string(prefix) + s.name, dtype, s.shape, data});
  }
  return out;
}

// The file's tensor `name`, which must have `shape` as F32 or BF16.
Result<const SafetensorsTensor*> tensor_for(const SafetensorsFile& file, const std::string& name,
                                            const std::vector<size_t>& shape, const std::string& context) {
  const SafetensorsTensor* t = file.find(name);
  if (t == nullptr) return error(ErrorCode::invalid_argument, context + ": tensor " + name + " is missing");
  if (t->shape != shape) {
    return error(ErrorCode::invalid_argument, context + ": tensor " + name + " has shape " + shape_text(t->shape) +
                                                  ", the model wants " + shape_text(shape));
  }
  if (t->dtype != Dtype::f32 && t->dtype != Dtype::bf16) {
    return error(ErrorCode::invalid_argument, context + ": tensor " + name + " is " +
                                                  std::string(dtype_name(t->dtype)) + "; only F32 and BF16 load");
  }
  return t;
}

// `t`'s values as floats into `out` (its element count). REQUIRES: F32 or BF16.
void widen(const SafetensorsTensor& t, float* out) {
  if (t.dtype == Dtype::f32) {
    std::memcpy(out, t.data.data(), t.data.size());
    return;
  }
  const size_t n = t.data.size() / 2;
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, t.data.data() + 2 * i, 2);
    out[i] = bf16_to_float(h);
  }
}

// Checks that `file` fits `layout` (see load_model); the layout's tensors,
// in its order, on success.
Result<std::vector<const SafetensorsTensor*>> check_model(const SafetensorsFile& file, const ParamLayout& layout,
                                                          const std::string& context) {
  if (file.metadata().contains("troupe.format")) {
    auto recorded = config_from_metadata(file.metadata(), context);
    if (!recorded) return error(recorded.error());
    const GptConfig& want = layout.config();
    std::string diff;
    auto compare = [&](const char* what, size_t got, size_t wanted) {
      if (got != wanted) {
        diff += std::string(diff.empty() ? "" : ", ") + what + " " + std::to_string(got) + " in the file, " +
                std::to_string(wanted) + " in the model";
      }
    };
    compare("vocab_size", recorded->vocab_size, want.vocab_size);
    compare("context_length", recorded->context_length, want.context_length);
    compare("layers", recorded->layers, want.layers);
    compare("heads", recorded->heads, want.heads);
    compare("channels", recorded->channels, want.channels);
    auto compare_flag = [&](bool got, bool wanted, const char* on, const char* off) {
      if (got != wanted) {
        diff += std::string(diff.empty() ? "" : ", ") + (got ? on : off) + " in the file, " + (wanted ? on : off) +
                " in the model";
      }
    };
    compare_flag(recorded->tied_embeddings, want.tied_embeddings, "embeddings tied", "embeddings untied");
    compare_flag(recorded->value_head, want.value_head, "a value head", "no value head");
    if (!diff.empty()) {
      return error(ErrorCode::invalid_argument, context + ": the checkpoint's model config differs: " + diff);
    }
  }
  std::vector<const SafetensorsTensor*> out;
  for (const TensorSpec& s : layout.tensors()) {
    auto t = tensor_for(file, s.name, s.shape, context);
    if (!t) return error(t.error());
    out.push_back(*t);
  }
  // Every one of the layout's tensors is there, and names are unique: any
  // further tensor outside the optimizer's prefix is an extra.
  size_t model_tensors = 0;
  for (const SafetensorsTensor& t : file.tensors()) model_tensors += !t.name.starts_with(kOptimizerPrefix);
  if (model_tensors != out.size()) {
    std::set<std::string_view> names;
    for (const TensorSpec& s : layout.tensors()) names.insert(s.name);
    for (const SafetensorsTensor& t : file.tensors()) {
      if (!t.name.starts_with(kOptimizerPrefix) && !names.contains(t.name)) {
        return error(ErrorCode::invalid_argument, context + ": tensor " + quote_name(t.name) +
                                                      " is not one of the model's (a checkpoint of another config?)");
      }
    }
  }
  return out;
}

}  // namespace

// ---- public ------------------------------------------------------------------

std::string_view dtype_name(Dtype dtype) { return kDtypes[static_cast<size_t>(dtype)].name; }

size_t dtype_size_bytes(Dtype dtype) { return kDtypes[static_cast<size_t>(dtype)].size_bytes; }

Status write_safetensors(const fs::path& path, std::span<const SafetensorsTensor> tensors,
                         const SafetensorsMetadata& metadata) {
  const std::string target = path.string();
  auto invalid = [&](const std::string& what) {
    return Status(ErrorCode::invalid_argument, "safetensors " + target + ": writing: " + what);
  };
  if (!path.has_filename()) return invalid("the path names no file");

  // The header is written entry by entry, in the tensors' order (a JSON
  // object of them all would sort them, or cost quadratic time to keep
  // their order).
  std::string text = "{";
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) return invalid("a tensor may not be named " + quote_name(t.name));
    if (!names.insert(t.name).second) return invalid("tensor " + quote_name(t.name) + " is given twice");
    auto bytes = bytes_of(t.shape, dtype_size_bytes(t.dtype));
    if (!bytes || *bytes != t.data.size()) {
      return invalid("tensor " + quote_name(t.name) + ": shape " + shape_text(t.shape) + " of " +
                     std::string(dtype_name(t.dtype)) + " needs " + (bytes ? std::to_string(*bytes) : "too many") +
                     " bytes, the data has " + std::to_string(t.data.size()));
    }
  }
  try {
    auto dump = [](const auto& j) { return j.dump(-1, ' ', false, json::error_handler_t::strict); };
    if (!metadata.empty()) text += dump(json(kMetadataKey)) + ":" + dump(json(metadata));
    for (const SafetensorsTensor& t : tensors) {
      if (text.size() > 1) text += ",";
      nlohmann::ordered_json entry = {
          {"dtype", dtype_name(t.dtype)},
          {"shape", t.shape},
          {"data_offsets", nlohmann::ordered_json::array({offset, offset + t.data.size()})}};
      text += dump(json(t.name)) + ":" + dump(entry);
      offset += t.data.size();
    }
  } catch (const json::exception& e) {
    return invalid(std::string("a tensor name or metadata string is not valid UTF-8 (") + e.what() + ")");
  }
  text += "}";
  // Spaces up to a multiple of 8, so that the data starts aligned (the
  // reference writer does the same).
  text.append((8 - text.size() % 8) % 8, ' ');
  std::array<std::byte, 8> length;
  const uint64_t n = text.size();
  std::memcpy(length.data(), &n, 8);

  std::vector<std::span<const std::byte>> pieces;
  pieces.reserve(tensors.size() + 2);
  pieces.push_back(length);
  pieces.push_back(std::as_bytes(std::span(text)));
  for (const SafetensorsTensor& t : tensors) pieces.push_back(t.data);
  if (Status s = io::write_atomically(path, pieces); !s.ok()) {
    return Status(s.code(), "safetensors " + target + ": writing: " + s.message());
  }
  return {};
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<SafetensorsFile> parse_safetensors(std::vector<std::byte> bytes, std::string_view source) {
  auto header = header_of(bytes, bytes.size(), source);
  if (!header) return error(header.error());
  SafetensorsFile file;
  file.bytes_ = std::move(bytes);
  const std::byte* data = file.bytes_.data() + header->data_start;
  file.tensors_ = std::move(header->tensors);
  file.metadata_ = std::move(header->metadata);
  for (size_t i = 0; i < file.tensors_.size(); ++i) {
    const auto [begin, end] = header->offsets[i];
    file.tensors_[i].data = std::span(data + begin, end - begin);
    file.index_.emplace(file.tensors_[i].name, i);
  }
  return file;
}

Result<SafetensorsFile> read_safetensors(const fs::path& path) {
  auto bytes = read_file(path, /*whole=*/true);
  if (!bytes) return error(bytes.error());
  return parse_safetensors(std::move(bytes->bytes), path.string());
}

Status save_model(const fs::path& path, const ParamLayout& layout, const float* params,
                  const SafetensorsMetadata& metadata, Dtype dtype) {
  const std::string context = "save_model " + path.string();
  if (dtype != Dtype::f32 && dtype != Dtype::bf16) {
    return Status(ErrorCode::invalid_argument,
                  context + ": dtype " + std::string(dtype_name(dtype)) + "; the model saves as F32 or BF16");
  }
  if (Status s = refuse_reserved_keys(metadata, context); !s.ok()) return s;
  std::vector<uint16_t> bf16;
  auto tensors = param_tensors(layout, params, dtype, bf16);
  return write_safetensors(path, tensors, model_metadata(layout, metadata));
}

Result<GptConfig> read_model_config(const fs::path& path) {
  auto bytes = read_file(path, /*whole=*/false);
  if (!bytes) return error(bytes.error());
  auto header = header_of(bytes->bytes, bytes->file_size, path.string());
  if (!header) return error(header.error());
  return config_from_metadata(header->metadata, path.string());
}

Status load_model(const fs::path& path, const ParamLayout& layout, float* params) {
  auto file = read_safetensors(path);
  if (!file) return file.error();
  auto tensors = check_model(*file, layout, "load_model " + path.string());
  if (!tensors) return tensors.error();
  for (size_t i = 0; i < tensors->size(); ++i) widen(*(*tensors)[i], params + layout.tensors()[i].offset);
  return {};
}

Status save_training_state(const fs::path& path, const ParamLayout& layout, const float* params, const AdamW& optimizer,
                           const SafetensorsMetadata& metadata) {
  const std::string context = "save_training_state " + path.string();
  if (Status s = refuse_reserved_keys(metadata, context); !s.ok()) return s;
  if (optimizer.m().size() != layout.total()) {
    return Status(ErrorCode::invalid_argument, context + ": the optimizer holds " +
                                                   std::to_string(optimizer.m().size()) + " moments, the model has " +
                                                   std::to_string(layout.total()) +
                                                   " parameters (a shard: gather the moments first)");
  }
  return save_training_state(path, layout, params, optimizer.m().data(), optimizer.v().data(), optimizer.steps(),
                             metadata);
}

Status save_training_state(const fs::path& path, const ParamLayout& layout, const float* params, const float* m_data,
                           const float* v_data, size_t steps, const SafetensorsMetadata& metadata) {
  const std::string context = "save_training_state " + path.string();
  if (Status s = refuse_reserved_keys(metadata, context); !s.ok()) return s;
  std::vector<uint16_t> unused;
  auto tensors = param_tensors(layout, params, Dtype::f32, unused);
  auto m = param_tensors(layout, m_data, Dtype::f32, unused, std::string(kOptimizerPrefix) + "m.");
  auto v = param_tensors(layout, v_data, Dtype::f32, unused, std::string(kOptimizerPrefix) + "v.");
  tensors.insert(tensors.end(), m.begin(), m.end());
  tensors.insert(tensors.end(), v.begin(), v.end());
  SafetensorsMetadata meta = model_metadata(layout, metadata);
  meta.emplace(kStepKey, std::to_string(steps));
  return write_safetensors(path, tensors, meta);
}

Result<SafetensorsMetadata> load_training_state(const fs::path& path, const ParamLayout& layout, float* params,
                                                AdamW& optimizer) {
  const std::string context = "load_training_state " + path.string();
  auto file = read_safetensors(path);
  if (!file) return error(file.error());
  auto tensors = check_model(*file, layout, context);
  if (!tensors) return error(tensors.error());
  auto step_it = file->metadata().find(std::string(kStepKey));
  auto steps = step_it == file->metadata().end() ? std::nullopt : parse_u64(step_it->second);
  if (!steps) {
    return error(ErrorCode::malformed, context + ": no " + std::string(kStepKey) +
                                           " number in the metadata (a model, not a training state?)");
  }
  std::vector<float> m(layout.total()), v(layout.total());
  for (const TensorSpec& s : layout.tensors()) {
    for (auto [which, out] : {std::pair{"m.", &m}, std::pair{"v.", &v}}) {
      auto t = tensor_for(*file, std::string(kOptimizerPrefix) + which + s.name, s.shape, context);
      if (!t) return error(t.error());
      widen(**t, out->data() + s.offset);
    }
  }
  if (Status s = optimizer.restore(std::move(m), std::move(v), *steps); !s.ok()) {
    return error(ErrorCode::invalid_argument, context + ": " + s.message());
  }
  for (size_t i = 0; i < tensors->size(); ++i) widen(*(*tensors)[i], params + layout.tensors()[i].offset);
  return file->metadata();
}

}  // namespace troupe::rl::model
