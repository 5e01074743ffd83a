#include "model/config.h"

#include <limits>

namespace troupe::rl::model {

Status GptConfig::validate() const {
  auto bad = [](const std::string& what) { return Status(ErrorCode::invalid_argument, "model config: " + what); };
  if (vocab_size == 0 || context_length == 0 || layers == 0 || heads == 0 || channels == 0) {
    return bad("vocab_size, context_length, layers, heads and channels must all be at least 1");
  }
  if (channels % heads != 0) {
    return bad("channels (" + std::to_string(channels) + ") must be a multiple of heads (" + std::to_string(heads) +
               ")");
  }
  // 12 C^2 + 13 C per layer, plus the embeddings: bounded well below size_t.
  const size_t limit = size_t{1} << 40;
  if (channels > (size_t{1} << 16) || vocab_size > (size_t{1} << 24) || context_length > (size_t{1} << 20) ||
      layers > 4096 || channels * channels * 12 * layers > limit) {
    return bad("sizes too large (more than 2^40 parameters, or a dimension past its bound)");
  }
  return {};
}

Result<ParamLayout> ParamLayout::make(const GptConfig& config) {
  if (Status s = config.validate(); !s.ok()) return error(s);
  ParamLayout p;
  p.config_ = config;
  const size_t C = config.channels, V = config.vocab_size, T = config.context_length;
  auto add = [&](std::string name, std::vector<size_t> shape) {
    size_t count = 1;
    for (size_t d : shape) count *= d;
    size_t offset = p.total_;
    p.tensors_.push_back(TensorSpec{std::move(name), std::move(shape), offset, count});
    p.total_ += count;
    return offset;
  };
  p.wte_ = add("wte.weight", {V, C});
  p.wpe_ = add("wpe.weight", {T, C});
  for (size_t l = 0; l < config.layers; ++l) {
    std::string h = "h." + std::to_string(l) + ".";
    LayerOffsets o{};
    o.ln1_w = add(h + "ln_1.weight", {C});
    o.ln1_b = add(h + "ln_1.bias", {C});
    o.qkv_w = add(h + "attn.qkv.weight", {3 * C, C});
    o.qkv_b = add(h + "attn.qkv.bias", {3 * C});
    o.proj_w = add(h + "attn.proj.weight", {C, C});
    o.proj_b = add(h + "attn.proj.bias", {C});
    o.ln2_w = add(h + "ln_2.weight", {C});
    o.ln2_b = add(h + "ln_2.bias", {C});
    o.fc_w = add(h + "mlp.fc.weight", {4 * C, C});
    o.fc_b = add(h + "mlp.fc.bias", {4 * C});
    o.fcproj_w = add(h + "mlp.proj.weight", {C, 4 * C});
    o.fcproj_b = add(h + "mlp.proj.bias", {C});
    p.layers_.push_back(o);
  }
  p.lnf_w_ = add("ln_f.weight", {C});
  p.lnf_b_ = add("ln_f.bias", {C});
  p.lm_head_ = config.tied_embeddings ? p.wte_ : add("lm_head.weight", {V, C});
  p.policy_count_ = p.total_;
  // Without a head its offsets are the buffer's end: nothing is there.
  p.value_head_w_ = config.value_head ? add("value_head.weight", {C}) : p.total_;
  p.value_head_b_ = config.value_head ? add("value_head.bias", {1}) : p.total_;
  return p;
}

const TensorSpec* ParamLayout::find(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace troupe::rl::model
