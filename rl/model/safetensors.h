// Checkpoints in the safetensors format (huggingface/safetensors), so that
// Python's safetensors, transformers and any other reader can open them:
//
//   8 bytes   N, the header's length (little-endian u64)
//   N bytes   JSON: {"__metadata__": {string: string},
//                    "<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...}
//             padded with spaces to a multiple of 8, so the data is aligned
//   the rest  every tensor's bytes, little-endian, row-major; offsets count
//             from the start of this part, and the tensors tile it exactly
//
// Two levels: write_safetensors / read_safetensors move named tensors of
// any dtype; save_model / load_model (and the training-state pair) map the
// model's ParamLayout onto them, one tensor per TensorSpec under the
// layout's own names ("wte.weight", "h.0.attn.qkv.weight", ...), with the
// GptConfig in the metadata under "troupe.*" keys.
//
// Writes are atomic: the file appears complete under its name or not at all
// (a temporary file beside it, fsync, rename, fsync of the directory).
// Reads validate the whole header and refuse, with a message naming the
// file and the tensor, anything the format does not allow; they never read
// past what the file holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/adamw.h"
#include "model/config.h"
#include "troupe/status.h"

namespace troupe::rl::model {

/// The element types of the format (its names: "F32", "BF16", ...).
enum class Dtype : uint8_t { boolean, u8, i8, f8_e5m2, f8_e4m3, i16, u16, f16, bf16, i32, u32, f32, f64, i64, u64 };

/// The format's name of `dtype`, e.g. "BF16".
std::string_view dtype_name(Dtype dtype);
/// Bytes of one element of `dtype`.
size_t dtype_size_bytes(Dtype dtype);

/// String to string, as the header's "__metadata__" holds.
using SafetensorsMetadata = std::map<std::string, std::string>;

/// One named tensor: what write_safetensors takes, and what a read file
/// gives back (then `data` views the file's buffer).
struct SafetensorsTensor {
  std::string name;
  Dtype dtype = Dtype::f32;
  /// Row-major; empty for a scalar.
  std::vector<size_t> shape;
  /// product(shape) * dtype_size_bytes(dtype) bytes, little-endian.
  std::span<const std::byte> data;
};

/// Writes `tensors` (in this order) and `metadata` to `path`, atomically:
/// the file is complete under `path` or absent, and an existing file there
/// is replaced only by a complete one. Errors: invalid_argument (a name
/// empty, repeated or "__metadata__", data of the wrong size for the shape,
/// a string not valid UTF-8), storage (the OS refused: the message names
/// the path and the errno's text; the temporary file is removed).
Status write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsTensor> tensors,
                         const SafetensorsMetadata& metadata = {});

/// A safetensors file read into memory (all of it) and validated.
/// Move-only: the tensors view its buffer.
class SafetensorsFile {
 public:
  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  /// Every tensor, in the order of their data.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  /// The tensor named `name`, or nullptr.
  const SafetensorsTensor* find(std::string_view name) const;
  /// The header's "__metadata__" (empty when it has none).
  const SafetensorsMetadata& metadata() const { return metadata_; }

 private:
  friend Result<SafetensorsFile> parse_safetensors(std::vector<std::byte> bytes, std::string_view source);
  SafetensorsFile() = default;

  std::vector<std::byte> bytes_;  // the whole file; the tensors view it
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> tensors_ index
  SafetensorsMetadata metadata_;
};

/// Reads and validates the file at `path`. Errors: not_found (no file),
/// storage (it could not be read), malformed (anything the format does not
/// allow: shorter than 8 bytes, a header length past 100,000,000 bytes or
/// the file's end, a header not a JSON object, a dtype outside the format,
/// a shape whose size is not its data_offsets span, offsets outside the
/// data, overlapping or leaving bytes uncovered, a repeated name, metadata
/// not string to string).
Result<SafetensorsFile> read_safetensors(const std::filesystem::path& path);

/// As read_safetensors, for a file's bytes from elsewhere (a transfer);
/// `source` names them in error messages.
Result<SafetensorsFile> parse_safetensors(std::vector<std::byte> bytes, std::string_view source);

/// The value of metadata "troupe.format" in the files save_model writes.
inline constexpr std::string_view kModelFormat = "troupe-gpt-1";
/// Tensors named with this prefix are the optimizer's state: load_model
/// skips them, so a training state loads as a model.
inline constexpr std::string_view kOptimizerPrefix = "optimizer.";

/// Writes the parameters `params` (layout.total() floats) to `path`, one
/// tensor per TensorSpec under its name, stored as `dtype` (f32, or bf16:
/// rounded to nearest even, NaN kept a NaN, half the size), with the
/// layout's GptConfig under "troupe.*" keys of the metadata and
/// `metadata` beside it. Errors: as write_safetensors; invalid_argument
/// for another dtype or a caller's key starting with "troupe.".
Status save_model(const std::filesystem::path& path, const ParamLayout& layout, const float* params,
                  const SafetensorsMetadata& metadata = {}, Dtype dtype = Dtype::f32);

/// The GptConfig that save_model recorded in the file at `path` (reads the
/// header only). Errors: as read_safetensors; malformed for a file without
/// the "troupe.*" keys of format kModelFormat or with values out of range.
Result<GptConfig> read_model_config(const std::filesystem::path& path);

/// Reads the parameters at `path` into `params` (layout.total() floats).
/// Every tensor of the layout must be there with the layout's shape, as
/// F32 or BF16 (widened exactly); other tensors are refused, except those
/// named with kOptimizerPrefix; when the file records a GptConfig it must
/// be the layout's (heads, for one, shows in no shape). Nothing is written
/// to `params` unless all of that holds. Errors: as read_safetensors;
/// invalid_argument naming the tensor or setting that does not fit, e.g.
/// "tensor h.1.mlp.fc.weight has shape [512, 128], the model wants [1024, 256]".
/// A policy checkpoint (no value head) starts a model with one: load it
/// with the policy-only layout (the config with value_head false) into the
/// same buffer, whose first policy_count() elements it fills, and keep the
/// head's zeros.
Status load_model(const std::filesystem::path& path, const ParamLayout& layout, float* params);

/// Writes a training state to `path`: the parameters as save_model does in
/// F32, the optimizer's moments as tensors "optimizer.m.<name>" and
/// "optimizer.v.<name>" (F32), its step count as metadata
/// "troupe.optimizer.step", and `metadata` (the caller's: data position,
/// seeds, ...). The optimizer's settings are the caller's to keep. Errors:
/// as save_model.
Status save_training_state(const std::filesystem::path& path, const ParamLayout& layout, const float* params,
                           const AdamW& optimizer, const SafetensorsMetadata& metadata = {});
/// The same with the moments given (the whole layout's each) and the step
/// count: a sharded optimizer's state, gathered from its ranks.
Status save_training_state(const std::filesystem::path& path, const ParamLayout& layout, const float* params,
                           const float* m, const float* v, size_t steps, const SafetensorsMetadata& metadata = {});

/// Reads a training state written by save_training_state into `params`
/// and `optimizer` (made for `layout`), so that training continues exactly
/// where it was saved; returns the file's metadata (the caller's keys
/// included). Nothing is changed unless the whole state fits. Errors: as
/// load_model, which includes a file without the moments or the step (a
/// model's, not a training state) and an optimizer of another size.
Result<SafetensorsMetadata> load_training_state(const std::filesystem::path& path, const ParamLayout& layout,
                                                float* params, AdamW& optimizer);

}  // namespace troupe::rl::model
