#include "model/kv_cache.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "model/kernels.h"
#include "model/threads.h"

namespace troupe::rl::model {

Result<KvCache> KvCache::make(const GptConfig& config, size_t slots) {
  if (Status s = config.validate(); !s.ok()) return error(s);
  if (slots == 0) return error(ErrorCode::invalid_argument, "kv cache: zero slots; give it at least one sequence");
  return KvCache(config, slots);
}

KvCache::KvCache(const GptConfig& config, size_t slots)
    : config_(config),
      keys_(config.layers * slots * config.context_length * config.channels),
      values_(keys_.size()),
      lengths_(slots, 0) {}

void KvCache::clear_all() { std::fill(lengths_.begin(), lengths_.end(), size_t{0}); }

void KvCache::size_scratch(size_t n) {
  const size_t C = config_.channels;
  positions_.resize(n);
  for (auto* v : {&x_, &ln_, &atty_, &proj_}) v->resize(n * C);
  mean_.resize(n);
  rstd_.resize(n);
  qkv_.resize(n * 3 * C);
  fch_.resize(n * 4 * C);
  fch_gelu_.resize(n * 4 * C);
  // One row of scores per row: the rows' attention runs in parallel.
  scores_.resize(n * config_.context_length);
}

Status KvCache::set_weights(const Gpt<float>& model) {
  if (Status s = check_decoder_shape(config_, model); !s.ok()) return s;
  model_ = &model;
  return {};
}

Status KvCache::read_weights(float* host) {
  if (model_ == nullptr) {
    return Status(ErrorCode::invalid_argument, "kv cache: no weights; call set_weights(model) first");
  }
  std::memcpy(host, model_->params(), model_->layout().policy_count() * sizeof(float));
  return {};
}

Status KvCache::append(const Gpt<float>& model, std::span<const DecodeRow> rows, float* logits) {
  if (Status s = set_weights(model); !s.ok()) return s;
  return append(rows, logits);
}

Status KvCache::append(std::span<const DecodeRow> rows, float* logits) {
  if (model_ == nullptr) {
    return Status(ErrorCode::invalid_argument, "kv cache: no weights; call set_weights(model) first");
  }
  const size_t n = rows.size();
  if (n == 0) return {};
  const size_t C = config_.channels, NH = config_.heads, hs = C / NH, V = config_.vocab_size;
  size_scratch(n);
  // Check every row and give it its position before caching anything, so a
  // bad row leaves the cache as it was.
  if (Status s = assign_positions(config_, rows, lengths_, positions_); !s.ok()) return s;

  const Gpt<float>& model = *model_;
  const ParamLayout& layout = model.layout();
  const float* p = model.params();
  for (size_t i = 0; i < n; ++i) {
    const float* te = p + layout.wte() + static_cast<size_t>(rows[i].token) * C;
    const float* pe = p + layout.wpe() + positions_[i] * C;
    float* x = x_.data() + i * C;
    for (size_t c = 0; c < C; ++c) x[c] = te[c] + pe[c];
  }
  auto product = [this](float* out, const float* inp, const float* weight, const float* bias, size_t rows, size_t in,
                        size_t outs) {
    if (batch_invariant_) {
      matmul_forward_invariant(out, inp, weight, bias, rows, in, outs);
    } else {
      matmul_forward(out, inp, weight, bias, rows, in, outs);
    }
  };
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (size_t l = 0; l < config_.layers; ++l) {
    const LayerOffsets& o = layout.layer(l);
    layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), p + o.ln1_w, p + o.ln1_b, n, C);
    product(qkv_.data(), ln_.data(), p + o.qkv_w, p + o.qkv_b, n, C, 3 * C);
    // Cache every row's key and value first: a row may attend to an earlier
    // row of the same step (a prompt's tokens).
    for (size_t i = 0; i < n; ++i) {
      const float* qkv = qkv_.data() + i * 3 * C;
      std::copy(qkv + C, qkv + 2 * C, key(l, rows[i].slot, positions_[i]));
      std::copy(qkv + 2 * C, qkv + 3 * C, value(l, rows[i].slot, positions_[i]));
    }
    // Each row's attention is its own: the rows run in parallel, each on
    // one thread with OpenBLAS single-threaded there, so a row's bits do
    // not depend on the thread count or on what shares its step.
    parallel_for(n, 1, [&](size_t i0, size_t i1) {
      for (size_t i = i0; i < i1; ++i) {
        const size_t len = positions_[i] + 1;
        const float* keys = key(l, rows[i].slot, 0);
        const float* values = value(l, rows[i].slot, 0);
        float* s = scores_.data() + i * config_.context_length;
        for (size_t h = 0; h < NH; ++h) {
          const float* q = qkv_.data() + i * 3 * C + h * hs;
          // scores = K_h (len, hs) x q * scale; out = V_h^T (hs, len) x softmax(scores).
          cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(len), static_cast<int>(hs), scale, keys + h * hs,
                      static_cast<int>(C), q, 1, 0.0f, s, 1);
          float maxval = *std::max_element(s, s + len);
          float sum = 0;
          for (size_t t = 0; t < len; ++t) {
            s[t] = std::exp(s[t] - maxval);
            sum += s[t];
          }
          cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(len), static_cast<int>(hs), 1.0f / sum,
                      values + h * hs, static_cast<int>(C), s, 1, 0.0f, atty_.data() + i * C + h * hs, 1);
        }
      }
    });
    product(proj_.data(), atty_.data(), p + o.proj_w, p + o.proj_b, n, C, C);
    for (size_t j = 0; j < n * C; ++j) x_[j] += proj_[j];
    layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), p + o.ln2_w, p + o.ln2_b, n, C);
    product(fch_.data(), ln_.data(), p + o.fc_w, p + o.fc_b, n, C, 4 * C);
    gelu_forward(fch_gelu_.data(), fch_.data(), n * 4 * C);
    product(proj_.data(), fch_gelu_.data(), p + o.fcproj_w, p + o.fcproj_b, n, 4 * C, C);
    for (size_t j = 0; j < n * C; ++j) x_[j] += proj_[j];
  }
  layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), p + layout.lnf_w(), p + layout.lnf_b(), n, C);
  product(logits, ln_.data(), p + layout.lm_head(), nullptr, n, C, V);
  return {};
}

}  // namespace troupe::rl::model
