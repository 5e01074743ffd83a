// GptCuda: the host side (buffers, cuBLAS calls, the order of the layers),
// compiled by the C++ compiler; the kernels are in kernels.cu.
//
// Matrices are row-major here and column-major to cuBLAS: a row-major
// (R, K) matrix is the column-major (K, R) one with the same pointer and
// leading dimension K. So out (N,OC) = inp (N,C) x W (OC,C)^T is, to cuBLAS,
// out^T (OC,N) = op_T(W viewed (C,OC)) x inp viewed (C,N); each call below
// says which product it is in row-major terms.
#include "model/cuda/gpt_cuda.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "model/cuda/flash_attention.cuh"
#include "model/cuda/kernels.cuh"

namespace troupe::rl::model {
namespace {

Status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return Status(ErrorCode::handler_failed,
                std::string("gpt cuda: ") + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

Status check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return {};
  return Status(ErrorCode::handler_failed, std::string("gpt cuda: ") + what + ": " + cublasGetStatusString(s));
}

// Returns the Status of a failed step from the enclosing Status function.
#define GPT_CUDA_TRY(expr)                       \
  do {                                           \
    if (Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)

Status invalid(const std::string& message) { return Status(ErrorCode::invalid_argument, "gpt cuda: " + message); }

// What an inference-only model (GptCudaOptions::gradients false) says when
// asked to train.
Status no_gradients(const char* what) {
  return Status(ErrorCode::invalid_argument,
                std::string("gpt cuda: ") + what +
                    ": this model was made for inference (GptCudaOptions::gradients false) and has no gradients; "
                    "make it with gradients to train it");
}

// a * b into *out, false on overflow.
bool mul(size_t a, size_t b, size_t* out) { return !__builtin_mul_overflow(a, b, out); }

/// `count` elements of device memory, freed on destruction. REQUIRES: the
/// model's device is current when it allocates or frees.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    if (this != &other) {
      reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  ~DeviceArray() { reset(); }

  /// Frees what it holds, then allocates `count` uninitialised elements.
  /// Errors carry `code` (the caller's meaning of "too large").
  Status allocate(size_t count, const char* what, ErrorCode code) {
    reset();
    if (count == 0) return {};
    size_t bytes = 0;
    if (!mul(count, sizeof(T), &bytes)) return Status(code, std::string("gpt cuda: ") + what + ": size overflows");
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
      (void)cudaGetLastError();  // an allocation failure is not sticky: clear it for the next launch's check
      return Status(code, std::string("gpt cuda: allocating ") + what + " (" + std::to_string(bytes) +
                              " bytes) failed: " + cudaGetErrorString(e) +
                              ": use a smaller batch or sequence, or a device with more free memory");
    }
    ptr_ = static_cast<T*>(p);
    count_ = count;
    return {};
  }
  void reset() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
    ptr_ = nullptr;
    count_ = 0;
  }
  T* get() const { return ptr_; }
  size_t count() const { return count_; }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

/// What one layer's forward keeps for the backward (shapes for N rows).
struct LayerActs {
  DeviceArray<float> ln1;        // (N,C)
  DeviceArray<float> ln1_mean;   // (N)
  DeviceArray<float> ln1_rstd;   // (N)
  DeviceArray<float> qkv;        // (N,3C)
  DeviceArray<float> att;        // (B,NH,T,T) the softmax of the scores; fused: (B,NH,T) their log-sum-exps
  DeviceArray<float> atty;       // (N,C) attention output, before its projection
  DeviceArray<float> residual2;  // (N,C)
  DeviceArray<float> ln2;        // (N,C)
  DeviceArray<float> ln2_mean;   // (N)
  DeviceArray<float> ln2_rstd;   // (N)
  DeviceArray<float> fch;        // (N,4C) before GELU
  DeviceArray<float> fch_gelu;   // (N,4C)
  DeviceArray<float> residual3;  // (N,C) the layer's output
};

/// One GEMM operand: a device pointer and its element type.
struct Operand {
  const void* ptr;
  cudaDataType type;
};

}  // namespace

struct GptCuda::Impl {
  ParamLayout layout;
  GptCudaOptions options;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaEvent_t staged = nullptr;  // the last copy out of `pinned` has run
  void* pinned = nullptr;        // host staging for the per-call inputs
  size_t pinned_bytes = 0;

  DeviceArray<float> params, grads;        // (P) each, the layout
  DeviceArray<float> standby;              // (P) the next parameters (standby_params), once asked for
  DeviceArray<__nv_bfloat16> params_bf16;  // (P), bf16_matmuls only: the forward's rounding
  DeviceArray<float> reduce;               // column reductions' scratch, for up to 4C columns
  DeviceArray<float> moment1, moment2;     // (P) AdamW's m and v, from the first step
  DeviceArray<uint8_t> decay;              // (P) 1 where weight decay applies
  DeviceArray<double> norm;                // [0] the sum of squares, then its scratch
  size_t adamw_steps = 0;

  // The last forward's shape, and the activations' capacity.
  size_t B = 0, T = 0;
  bool have_forward = false;
  size_t rows_capacity = 0, att_capacity = 0;
  DeviceArray<int32_t> inputs;  // (2N) tokens, then targets
  DeviceArray<float> dlosses;   // (N)
  DeviceArray<float> encoded;   // (N,C)
  std::vector<LayerActs> acts;
  DeviceArray<float> lnf, lnf_mean, lnf_rstd;  // (N,C), (N), (N)
  DeviceArray<float> logits, dlogits;          // (N,V)
  DeviceArray<float> lse, losses;              // (N)
  // Gradient scratch, shared by the layers: the residual stream's gradient,
  // one (N,C) and one (N,4C) buffer (a projection's output in the forward,
  // an input gradient in the backward), the attention output's gradient
  // and the scores' (B,NH,T,T) (fused: the backward's (B,NH,T) scratch).
  DeviceArray<float> dresidual, scratch_c, scratch_4c, datty, datt;
  DeviceArray<__nv_bfloat16> bf16_inp;   // (N,4C) a product's input, rounded
  DeviceArray<__nv_bfloat16> bf16_dout;  // (N, max(4C,V)) a product's output gradient, rounded
  // params_bf16 holds the parameters as they are now (the training forward
  // rounds them each time; decode rounds them when they changed).
  bool bf16_current = false;

  // The inference path: the cache, (layers, slots, context, C) each, and
  // one decode step's buffers for up to decode_capacity rows.
  size_t cache_slots = 0;
  DeviceArray<float> keys, values;
  size_t decode_capacity = 0;
  DeviceArray<int32_t> decode_rows;  // (3n) slots, positions, tokens
  DeviceArray<float> dec_x, dec_ln, dec_mean, dec_rstd, dec_qkv, dec_atty, dec_proj, dec_fch, dec_fch_gelu, dec_logits;
  DeviceArray<__nv_bfloat16> dec_bf16;  // (n,4C) a product's input, rounded

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl();

  const GptConfig& config() const { return layout.config(); }
  size_t total() const { return layout.total(); }
  bool bf16() const { return options.bf16_matmuls; }
  // The attention runs fused (start() decides, from the head size).
  bool fused = false;
  cublasComputeType_t linear_compute() const {
    return options.tf32 && !options.bf16_matmuls ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  }
  cublasComputeType_t attention_compute() const {
    return options.tf32 || options.bf16_matmuls ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  }

  Status start();
  Status size_for(size_t batch, size_t time);
  Status stage(void* device_dst, const void* a, size_t a_bytes, const void* b, size_t b_bytes);
  Status copy_in(float* device_dst, const float* host, size_t count, const char* what);
  Status copy_out(float* host, const float* device_src, size_t count, const char* what);
  Status ensure_optimizer();

  Status gemm(cublasOperation_t ta, cublasOperation_t tb, size_t rows, size_t cols, size_t depth, float alpha,
              Operand a, size_t lda, Operand b, size_t ldb, float beta, float* out, size_t ldc,
              cublasComputeType_t compute, const char* what);
  Status gemm_batched(cublasOperation_t ta, cublasOperation_t tb, size_t rows, size_t cols, size_t depth, float alpha,
                      const float* a, size_t lda, size_t stride_a, const float* b, size_t ldb, size_t stride_b,
                      float* out, size_t ldc, size_t stride_out, size_t batch, const char* what);
  Status matmul_forward(float* out, const float* inp, size_t weight, size_t N, size_t C, size_t OC,
                        __nv_bfloat16* rounded);
  Status matmul_backward(float* dinp, size_t weight, float* dbias, const float* dout, const float* inp, size_t N,
                         size_t C, size_t OC);
  Status attention_forward(LayerActs& a);
  Status attention_backward(float* dqkv, const float* dout, const LayerActs& a);
  Status run_forward();
  Status run_backward();
  Status size_decode(size_t n);
  Status run_decode(size_t n);
};

GptCuda::Impl::~Impl() {
  // The arrays free themselves after this body, on this device; wait for
  // the work that may still use them first.
  (void)cudaSetDevice(options.device);
  if (stream != nullptr) (void)cudaStreamSynchronize(stream);
  if (cublas != nullptr) (void)cublasDestroy(cublas);
  if (staged != nullptr) (void)cudaEventDestroy(staged);
  if (pinned != nullptr) (void)cudaFreeHost(pinned);
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
}

Status GptCuda::Impl::start() {
  GPT_CUDA_TRY(check(cudaSetDevice(options.device), "cudaSetDevice"));
  GPT_CUDA_TRY(check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  GPT_CUDA_TRY(check(cudaEventCreateWithFlags(&staged, cudaEventDisableTiming), "cudaEventCreate"));
  GPT_CUDA_TRY(check(cublasCreate(&cublas), "cublasCreate"));
  GPT_CUDA_TRY(check(cublasSetStream(cublas, stream), "cublasSetStream"));
  // CUBLAS_COMPUTE_32F stays float32 only in the default math mode.
  GPT_CUDA_TRY(check(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
  const size_t P = total();
  GPT_CUDA_TRY(params.allocate(P, "the parameters", ErrorCode::start_failed));
  if (options.gradients) GPT_CUDA_TRY(grads.allocate(P, "the gradients", ErrorCode::start_failed));
  if (bf16()) GPT_CUDA_TRY(params_bf16.allocate(P, "the bf16 parameters", ErrorCode::start_failed));
  fused = bf16() && options.fused_attention &&
          cuda::flash_attention_supported(config().channels / config().heads, options.device);
  GPT_CUDA_TRY(reduce.allocate(cuda::column_reduce_scratch_floats(4 * config().channels), "the reduction scratch",
                               ErrorCode::start_failed));
  GPT_CUDA_TRY(check(cudaMemsetAsync(params.get(), 0, P * sizeof(float), stream), "zeroing the parameters"));
  if (options.gradients) {
    GPT_CUDA_TRY(check(cudaMemsetAsync(grads.get(), 0, P * sizeof(float), stream), "zeroing the gradients"));
  }
  return check(cudaStreamSynchronize(stream), "starting the model");
}

Status GptCuda::Impl::size_for(size_t batch, size_t time) {
  const GptConfig& c = config();
  // The scores (B,NH,T,T), or with the fused attention one float a row.
  const size_t N = batch * time, C = c.channels, V = c.vocab_size,
               att = batch * c.heads * time * (fused ? 1 : time);
  B = batch;
  T = time;
  if (N <= rows_capacity && att <= att_capacity) return {};
  // The old buffers may still be in use by enqueued work.
  GPT_CUDA_TRY(check(cudaStreamSynchronize(stream), "waiting before resizing the activations"));
  have_forward = false;
  rows_capacity = att_capacity = 0;
  acts.clear();
  for (auto* a : {&dlosses, &encoded, &lnf, &lnf_mean, &lnf_rstd, &logits, &dlogits, &lse, &losses, &dresidual,
                  &scratch_c, &scratch_4c, &datty, &datt}) {
    a->reset();
  }
  inputs.reset();
  bf16_inp.reset();
  bf16_dout.reset();

  const ErrorCode code = ErrorCode::invalid_argument;
  GPT_CUDA_TRY(inputs.allocate(2 * N, "the tokens", code));
  GPT_CUDA_TRY(dlosses.allocate(N, "dlosses", code));
  GPT_CUDA_TRY(encoded.allocate(N * C, "the embeddings", code));
  acts.resize(c.layers);
  for (LayerActs& a : acts) {
    GPT_CUDA_TRY(a.ln1.allocate(N * C, "ln1", code));
    GPT_CUDA_TRY(a.ln1_mean.allocate(N, "ln1 mean", code));
    GPT_CUDA_TRY(a.ln1_rstd.allocate(N, "ln1 rstd", code));
    GPT_CUDA_TRY(a.qkv.allocate(N * 3 * C, "qkv", code));
    GPT_CUDA_TRY(a.att.allocate(att, fused ? "the attention's log-sum-exps" : "the attention matrix", code));
    GPT_CUDA_TRY(a.atty.allocate(N * C, "the attention output", code));
    GPT_CUDA_TRY(a.residual2.allocate(N * C, "residual2", code));
    GPT_CUDA_TRY(a.ln2.allocate(N * C, "ln2", code));
    GPT_CUDA_TRY(a.ln2_mean.allocate(N, "ln2 mean", code));
    GPT_CUDA_TRY(a.ln2_rstd.allocate(N, "ln2 rstd", code));
    GPT_CUDA_TRY(a.fch.allocate(N * 4 * C, "the MLP's hidden layer", code));
    GPT_CUDA_TRY(a.fch_gelu.allocate(N * 4 * C, "the MLP's GELU", code));
    GPT_CUDA_TRY(a.residual3.allocate(N * C, "residual3", code));
  }
  GPT_CUDA_TRY(lnf.allocate(N * C, "ln_f", code));
  GPT_CUDA_TRY(lnf_mean.allocate(N, "ln_f mean", code));
  GPT_CUDA_TRY(lnf_rstd.allocate(N, "ln_f rstd", code));
  GPT_CUDA_TRY(logits.allocate(N * V, "the logits", code));
  GPT_CUDA_TRY(dlogits.allocate(N * V, "the logits' gradient", code));
  GPT_CUDA_TRY(lse.allocate(N, "the log-sum-exps", code));
  GPT_CUDA_TRY(losses.allocate(N, "the losses", code));
  GPT_CUDA_TRY(dresidual.allocate(N * C, "the residual gradient", code));
  GPT_CUDA_TRY(scratch_c.allocate(N * C, "scratch (N,C)", code));
  GPT_CUDA_TRY(scratch_4c.allocate(N * 4 * C, "scratch (N,4C)", code));
  GPT_CUDA_TRY(datty.allocate(N * C, "the attention output's gradient", code));
  GPT_CUDA_TRY(datt.allocate(att, fused ? "the attention backward's scratch" : "the attention matrix's gradient", code));
  if (bf16()) {
    GPT_CUDA_TRY(bf16_inp.allocate(N * 4 * C, "bf16 inputs", code));
    GPT_CUDA_TRY(bf16_dout.allocate(N * std::max(4 * C, V), "bf16 output gradients", code));
  }
  rows_capacity = N;
  att_capacity = att;
  return {};
}

Status GptCuda::Impl::stage(void* device_dst, const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  // The pinned buffer is free once the copy out of it that was enqueued
  // last has run.
  GPT_CUDA_TRY(check(cudaEventSynchronize(staged), "waiting for the staging buffer"));
  const size_t bytes = a_bytes + b_bytes;
  if (pinned_bytes < bytes) {
    if (pinned != nullptr) (void)cudaFreeHost(pinned);
    pinned = nullptr;
    pinned_bytes = 0;
    if (cudaError_t e = cudaMallocHost(&pinned, bytes); e != cudaSuccess) {
      pinned = nullptr;
      (void)cudaGetLastError();
      return check(e, "allocating pinned staging memory");
    }
    pinned_bytes = bytes;
  }
  std::memcpy(pinned, a, a_bytes);
  if (b_bytes > 0) std::memcpy(static_cast<char*>(pinned) + a_bytes, b, b_bytes);
  GPT_CUDA_TRY(check(cudaMemcpyAsync(device_dst, pinned, bytes, cudaMemcpyHostToDevice, stream), "copying inputs in"));
  return check(cudaEventRecord(staged, stream), "cudaEventRecord");
}

Status GptCuda::Impl::copy_in(float* device_dst, const float* host, size_t count, const char* what) {
  if (host == nullptr) return invalid(std::string(what) + ": null host pointer");
  GPT_CUDA_TRY(check(cudaSetDevice(options.device), "cudaSetDevice"));
  GPT_CUDA_TRY(check(cudaMemcpyAsync(device_dst, host, count * sizeof(float), cudaMemcpyHostToDevice, stream), what));
  return check(cudaStreamSynchronize(stream), what);  // the host array is the caller's again on return
}

Status GptCuda::Impl::copy_out(float* host, const float* device_src, size_t count, const char* what) {
  if (host == nullptr) return invalid(std::string(what) + ": null host pointer");
  GPT_CUDA_TRY(check(cudaSetDevice(options.device), "cudaSetDevice"));
  GPT_CUDA_TRY(check(cudaMemcpyAsync(host, device_src, count * sizeof(float), cudaMemcpyDeviceToHost, stream), what));
  return check(cudaStreamSynchronize(stream), what);
}

Status GptCuda::Impl::ensure_optimizer() {
  // `norm` is allocated last: the optimizer is ready exactly when it is.
  if (norm.get() != nullptr) return {};
  auto undo = [this](Status s) {
    for (auto* a : {&moment1, &moment2}) a->reset();  // retried by the next step
    decay.reset();
    norm.reset();
    return s;
  };
  const size_t P = total();
  const ErrorCode code = ErrorCode::invalid_argument;
  if (Status s = moment1.allocate(P, "the first moment", code); !s.ok()) return undo(s);
  if (Status s = moment2.allocate(P, "the second moment", code); !s.ok()) return undo(s);
  if (Status s = decay.allocate(P, "the decay mask", code); !s.ok()) return undo(s);
  std::vector<uint8_t> mask(P, 0);
  for (const TensorSpec& t : layout.tensors()) {
    if (t.shape.size() >= 2) std::fill(mask.begin() + t.offset, mask.begin() + t.offset + t.count, uint8_t{1});
  }
  Status s = check(cudaMemsetAsync(moment1.get(), 0, P * sizeof(float), stream), "zeroing the moments");
  if (s.ok()) s = check(cudaMemsetAsync(moment2.get(), 0, P * sizeof(float), stream), "zeroing the moments");
  if (s.ok()) s = check(cudaMemcpyAsync(decay.get(), mask.data(), P, cudaMemcpyHostToDevice, stream), "decay mask");
  if (s.ok()) s = check(cudaStreamSynchronize(stream), "starting the optimizer");  // `mask` dies here
  if (s.ok()) s = norm.allocate(1 + cuda::sum_of_squares_scratch_doubles(), "the norm scratch", code);
  return s.ok() ? s : undo(s);
}

Status GptCuda::Impl::gemm(cublasOperation_t ta, cublasOperation_t tb, size_t rows, size_t cols, size_t depth,
                           float alpha, Operand a, size_t lda, Operand b, size_t ldb, float beta, float* out,
                           size_t ldc, cublasComputeType_t compute, const char* what) {
  // Sizes were bounded by INT_MAX in forward().
  return check(cublasGemmEx(cublas, ta, tb, static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(depth),
                            &alpha, a.ptr, a.type, static_cast<int>(lda), b.ptr, b.type, static_cast<int>(ldb), &beta,
                            out, CUDA_R_32F, static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT),
               what);
}

Status GptCuda::Impl::gemm_batched(cublasOperation_t ta, cublasOperation_t tb, size_t rows, size_t cols, size_t depth,
                                   float alpha, const float* a, size_t lda, size_t stride_a, const float* b, size_t ldb,
                                   size_t stride_b, float* out, size_t ldc, size_t stride_out, size_t batch,
                                   const char* what) {
  const float beta = 0;
  return check(cublasGemmStridedBatchedEx(cublas, ta, tb, static_cast<int>(rows), static_cast<int>(cols),
                                          static_cast<int>(depth), &alpha, a, CUDA_R_32F, static_cast<int>(lda),
                                          static_cast<long long>(stride_a), b, CUDA_R_32F, static_cast<int>(ldb),
                                          static_cast<long long>(stride_b), &beta, out, CUDA_R_32F,
                                          static_cast<int>(ldc), static_cast<long long>(stride_out),
                                          static_cast<int>(batch), attention_compute(), CUBLAS_GEMM_DEFAULT),
               what);
}

// out (N,OC) = inp (N,C) x W (OC,C)^T, W at params[weight]. No bias (the
// callers fuse it into the next kernel). bf16: `rounded` (N*C) takes the
// input's rounding.
Status GptCuda::Impl::matmul_forward(float* out, const float* inp, size_t weight, size_t N, size_t C, size_t OC,
                                     __nv_bfloat16* rounded) {
  Operand w{params.get() + weight, CUDA_R_32F}, x{inp, CUDA_R_32F};
  if (bf16()) {
    GPT_CUDA_TRY(check(cuda::to_bf16(rounded, inp, N * C, stream), "rounding a matmul input"));
    w = {params_bf16.get() + weight, CUDA_R_16BF};
    x = {rounded, CUDA_R_16BF};
  }
  return gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, w, C, x, C, 0.0f, out, OC, linear_compute(), "matmul forward");
}

// dinp (N,C) = dout (N,OC) x W (OC,C); grads[weight] (OC,C) += dout^T x inp;
// dbias (OC) += column sums of dout (when not null).
Status GptCuda::Impl::matmul_backward(float* dinp, size_t weight, float* dbias, const float* dout, const float* inp,
                                      size_t N, size_t C, size_t OC) {
  Operand w{params.get() + weight, CUDA_R_32F}, d{dout, CUDA_R_32F}, x{inp, CUDA_R_32F};
  if (bf16()) {
    // Rounded as the forward rounded them (params_bf16 is the forward's).
    GPT_CUDA_TRY(check(cuda::to_bf16(bf16_dout.get(), dout, N * OC, stream), "rounding a matmul gradient"));
    GPT_CUDA_TRY(check(cuda::to_bf16(bf16_inp.get(), inp, N * C, stream), "rounding a matmul input"));
    w = {params_bf16.get() + weight, CUDA_R_16BF};
    d = {bf16_dout.get(), CUDA_R_16BF};
    x = {bf16_inp.get(), CUDA_R_16BF};
  }
  GPT_CUDA_TRY(gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, w, C, d, OC, 0.0f, dinp, C, linear_compute(),
                    "matmul backward (input)"));
  GPT_CUDA_TRY(gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, x, C, d, OC, 1.0f, grads.get() + weight, C,
                    linear_compute(), "matmul backward (weight)"));
  if (dbias == nullptr) return {};
  return check(cuda::bias_backward(dbias, dout, N, OC, reduce.get(), stream), "bias backward");
}

// Per batch row b and head h (NH heads at once, a strided batch): scores
// (T,T) = q (T,hs) x k^T * scale, the causal softmax, then atty (T,hs) =
// att x v. q, k, v are (T,hs) blocks of qkv with row stride 3C.
Status GptCuda::Impl::attention_forward(LayerActs& a) {
  const GptConfig& c = config();
  const size_t C = c.channels, NH = c.heads, hs = C / NH, TT = T * T;
  if (fused) {
    return check(cuda::flash_attention_forward(a.atty.get(), a.att.get(), a.qkv.get(), B, T, NH, C, stream),
                 "fused attention");
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (size_t b = 0; b < B; ++b) {
    const float* q = a.qkv.get() + b * T * 3 * C;
    // scores (T,T) = q x k^T: to cuBLAS, scores^T = op_T(k) x q.
    GPT_CUDA_TRY(gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, q + C, 3 * C, hs, q, 3 * C, hs,
                              a.att.get() + b * NH * TT, T, TT, NH, "attention scores"));
  }
  GPT_CUDA_TRY(check(cuda::causal_softmax_forward(a.att.get(), B * NH * T, T, stream), "attention softmax"));
  for (size_t b = 0; b < B; ++b) {
    const float* q = a.qkv.get() + b * T * 3 * C;
    // atty (T,hs) = att (T,T) x v (T,hs): atty^T = v^T x att^T.
    GPT_CUDA_TRY(gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, q + 2 * C, 3 * C, hs, a.att.get() + b * NH * TT,
                              T, TT, a.atty.get() + b * T * C, C, hs, NH, "attention values"));
  }
  return {};
}

// dqkv (N,3C) = the gradient of q, k and v for dout (N,C) = d atty.
Status GptCuda::Impl::attention_backward(float* dqkv, const float* dout, const LayerActs& a) {
  const GptConfig& c = config();
  const size_t C = c.channels, NH = c.heads, hs = C / NH, TT = T * T;
  if (fused) {
    return check(cuda::flash_attention_backward(dqkv, dout, a.qkv.get(), a.atty.get(), a.att.get(), datt.get(), B, T,
                                                NH, C, stream),
                 "fused attention backward");
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (size_t b = 0; b < B; ++b) {
    const float* q = a.qkv.get() + b * T * 3 * C;
    const float* d = dout + b * T * C;
    float* dq = dqkv + b * T * 3 * C;
    // datt (T,T) = dout (T,hs) x v^T: datt^T = op_T(v) x dout.
    GPT_CUDA_TRY(gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, q + 2 * C, 3 * C, hs, d, C, hs,
                              datt.get() + b * NH * TT, T, TT, NH, "attention backward (scores)"));
    // dv (T,hs) = att^T (T,T) x dout (T,hs): dv^T = dout^T x op_T(att^T).
    GPT_CUDA_TRY(gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, d, C, hs, a.att.get() + b * NH * TT, T, TT,
                              dq + 2 * C, 3 * C, hs, NH, "attention backward (values)"));
  }
  GPT_CUDA_TRY(check(cuda::causal_softmax_backward(datt.get(), a.att.get(), B * NH * T, T, stream),
                     "attention softmax backward"));
  for (size_t b = 0; b < B; ++b) {
    const float* q = a.qkv.get() + b * T * 3 * C;
    float* dq = dqkv + b * T * 3 * C;
    const float* dpre = datt.get() + b * NH * TT;
    // dq (T,hs) = dpre (T,T) x k * scale: dq^T = k^T x dpre^T.
    GPT_CUDA_TRY(gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, scale, q + C, 3 * C, hs, dpre, T, TT, dq, 3 * C, hs,
                              NH, "attention backward (queries)"));
    // dk (T,hs) = dpre^T x q * scale: dk^T = q^T x op_T(dpre^T).
    GPT_CUDA_TRY(gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, scale, q, 3 * C, hs, dpre, T, TT, dq + C, 3 * C, hs,
                              NH, "attention backward (keys)"));
  }
  return {};
}

Status GptCuda::Impl::run_forward() {
  const GptConfig& c = config();
  const size_t N = B * T, C = c.channels, V = c.vocab_size;
  const float* p = params.get();
  const int32_t* tokens = inputs.get();
  const int32_t* targets = inputs.get() + N;
  if (bf16()) {
    GPT_CUDA_TRY(check(cuda::to_bf16(params_bf16.get(), p, total(), stream), "rounding the parameters"));
    bf16_current = true;
  }
  GPT_CUDA_TRY(check(cuda::encoder_forward(encoded.get(), tokens, p + layout.wte(), p + layout.wpe(), B, T, C, stream),
                     "encoder"));
  for (size_t l = 0; l < c.layers; ++l) {
    const LayerOffsets& o = layout.layer(l);
    LayerActs& a = acts[l];
    const float* residual = l == 0 ? encoded.get() : acts[l - 1].residual3.get();
    GPT_CUDA_TRY(check(cuda::layernorm_forward(a.ln1.get(), a.ln1_mean.get(), a.ln1_rstd.get(), residual, p + o.ln1_w,
                                               p + o.ln1_b, N, C, stream),
                       "ln_1"));
    GPT_CUDA_TRY(matmul_forward(a.qkv.get(), a.ln1.get(), o.qkv_w, N, C, 3 * C, bf16_inp.get()));
    GPT_CUDA_TRY(check(cuda::add_bias(a.qkv.get(), p + o.qkv_b, N, 3 * C, stream), "qkv bias"));
    GPT_CUDA_TRY(attention_forward(a));
    GPT_CUDA_TRY(matmul_forward(scratch_c.get(), a.atty.get(), o.proj_w, N, C, C, bf16_inp.get()));
    GPT_CUDA_TRY(
        check(cuda::add_bias_residual(a.residual2.get(), residual, scratch_c.get(), p + o.proj_b, N, C, stream),
              "attention residual"));
    GPT_CUDA_TRY(check(cuda::layernorm_forward(a.ln2.get(), a.ln2_mean.get(), a.ln2_rstd.get(), a.residual2.get(),
                                               p + o.ln2_w, p + o.ln2_b, N, C, stream),
                       "ln_2"));
    GPT_CUDA_TRY(matmul_forward(a.fch.get(), a.ln2.get(), o.fc_w, N, C, 4 * C, bf16_inp.get()));
    GPT_CUDA_TRY(check(cuda::add_bias_gelu(a.fch.get(), a.fch_gelu.get(), p + o.fc_b, N, 4 * C, stream), "gelu"));
    GPT_CUDA_TRY(matmul_forward(scratch_c.get(), a.fch_gelu.get(), o.fcproj_w, N, 4 * C, C, bf16_inp.get()));
    GPT_CUDA_TRY(check(
        cuda::add_bias_residual(a.residual3.get(), a.residual2.get(), scratch_c.get(), p + o.fcproj_b, N, C, stream),
        "mlp residual"));
  }
  GPT_CUDA_TRY(check(cuda::layernorm_forward(lnf.get(), lnf_mean.get(), lnf_rstd.get(), acts.back().residual3.get(),
                                             p + layout.lnf_w(), p + layout.lnf_b(), N, C, stream),
                     "ln_f"));
  GPT_CUDA_TRY(matmul_forward(logits.get(), lnf.get(), layout.lm_head(), N, C, V, bf16_inp.get()));
  return check(cuda::crossentropy_forward(losses.get(), lse.get(), logits.get(), targets, N, V, stream),
               "cross-entropy");
}

// The CPU model's backward (gpt.cc) with one gradient buffer for the
// residual stream: dresidual holds d loss / d (the residual at that point),
// and each LayerNorm backward adds its input's share into it.
Status GptCuda::Impl::run_backward() {
  const GptConfig& c = config();
  const size_t N = B * T, C = c.channels, V = c.vocab_size;
  const float* p = params.get();
  float* g = grads.get();
  const int32_t* tokens = inputs.get();
  const int32_t* targets = inputs.get() + N;
  GPT_CUDA_TRY(
      check(cuda::crossentropy_backward(dlogits.get(), logits.get(), lse.get(), targets, dlosses.get(), N, V, stream),
            "cross-entropy backward"));
  GPT_CUDA_TRY(matmul_backward(scratch_c.get(), layout.lm_head(), nullptr, dlogits.get(), lnf.get(), N, C, V));
  GPT_CUDA_TRY(check(cudaMemsetAsync(dresidual.get(), 0, N * C * sizeof(float), stream), "zeroing dresidual"));
  GPT_CUDA_TRY(check(cuda::layernorm_backward(dresidual.get(), g + layout.lnf_w(), g + layout.lnf_b(), scratch_c.get(),
                                              acts.back().residual3.get(), p + layout.lnf_w(), lnf_mean.get(),
                                              lnf_rstd.get(), N, C, reduce.get(), stream),
                     "ln_f backward"));
  for (size_t l = c.layers; l-- > 0;) {
    const LayerOffsets& o = layout.layer(l);
    const LayerActs& a = acts[l];
    const float* residual = l == 0 ? encoded.get() : acts[l - 1].residual3.get();
    // dresidual is d residual3 here: the MLP's projection's output gradient.
    GPT_CUDA_TRY(
        matmul_backward(scratch_4c.get(), o.fcproj_w, g + o.fcproj_b, dresidual.get(), a.fch_gelu.get(), N, 4 * C, C));
    GPT_CUDA_TRY(check(cuda::gelu_backward_inplace(scratch_4c.get(), a.fch.get(), N * 4 * C, stream), "gelu backward"));
    GPT_CUDA_TRY(matmul_backward(scratch_c.get(), o.fc_w, g + o.fc_b, scratch_4c.get(), a.ln2.get(), N, C, 4 * C));
    GPT_CUDA_TRY(
        check(cuda::layernorm_backward(dresidual.get(), g + o.ln2_w, g + o.ln2_b, scratch_c.get(), a.residual2.get(),
                                       p + o.ln2_w, a.ln2_mean.get(), a.ln2_rstd.get(), N, C, reduce.get(), stream),
              "ln_2 backward"));
    // dresidual is d residual2 now: the attention projection's output gradient.
    GPT_CUDA_TRY(matmul_backward(datty.get(), o.proj_w, g + o.proj_b, dresidual.get(), a.atty.get(), N, C, C));
    GPT_CUDA_TRY(attention_backward(scratch_4c.get(), datty.get(), a));
    GPT_CUDA_TRY(matmul_backward(scratch_c.get(), o.qkv_w, g + o.qkv_b, scratch_4c.get(), a.ln1.get(), N, C, 3 * C));
    GPT_CUDA_TRY(
        check(cuda::layernorm_backward(dresidual.get(), g + o.ln1_w, g + o.ln1_b, scratch_c.get(), residual,
                                       p + o.ln1_w, a.ln1_mean.get(), a.ln1_rstd.get(), N, C, reduce.get(), stream),
              "ln_1 backward"));
  }
  return check(cuda::encoder_backward(g + layout.wte(), g + layout.wpe(), dresidual.get(), tokens, B, T, C, stream),
               "encoder backward");
}

Status GptCuda::Impl::size_decode(size_t n) {
  if (n <= decode_capacity) return {};
  const GptConfig& c = config();
  const size_t C = c.channels, V = c.vocab_size;
  GPT_CUDA_TRY(check(cudaStreamSynchronize(stream), "waiting before resizing the decode buffers"));
  decode_capacity = 0;
  const ErrorCode code = ErrorCode::invalid_argument;
  GPT_CUDA_TRY(decode_rows.allocate(3 * n, "the decode rows", code));
  GPT_CUDA_TRY(dec_x.allocate(n * C, "the decode residual", code));
  GPT_CUDA_TRY(dec_ln.allocate(n * C, "the decode LayerNorm", code));
  GPT_CUDA_TRY(dec_mean.allocate(n, "the decode LayerNorm mean", code));
  GPT_CUDA_TRY(dec_rstd.allocate(n, "the decode LayerNorm rstd", code));
  GPT_CUDA_TRY(dec_qkv.allocate(n * 3 * C, "the decode qkv", code));
  GPT_CUDA_TRY(dec_atty.allocate(n * C, "the decode attention output", code));
  GPT_CUDA_TRY(dec_proj.allocate(n * C, "the decode projection", code));
  GPT_CUDA_TRY(dec_fch.allocate(n * 4 * C, "the decode MLP", code));
  GPT_CUDA_TRY(dec_fch_gelu.allocate(n * 4 * C, "the decode GELU", code));
  GPT_CUDA_TRY(dec_logits.allocate(n * V, "the decode logits", code));
  if (bf16()) GPT_CUDA_TRY(dec_bf16.allocate(n * 4 * C, "the decode bf16 inputs", code));
  decode_capacity = n;
  return {};
}

// KvCache::append's computation (kv_cache.cc) on the device, for the n rows
// staged in decode_rows.
Status GptCuda::Impl::run_decode(size_t n) {
  const GptConfig& c = config();
  const size_t C = c.channels, V = c.vocab_size, Tmax = c.context_length;
  const float* p = params.get();
  const int32_t* rows = decode_rows.get();
  __nv_bfloat16* rounded = dec_bf16.get();
  if (bf16() && !bf16_current) {
    GPT_CUDA_TRY(check(cuda::to_bf16(params_bf16.get(), p, total(), stream), "rounding the parameters"));
    bf16_current = true;
  }
  GPT_CUDA_TRY(
      check(cuda::decode_encoder(dec_x.get(), rows, p + layout.wte(), p + layout.wpe(), n, C, stream), "encoder"));
  const size_t layer_floats = cache_slots * Tmax * C;
  for (size_t l = 0; l < c.layers; ++l) {
    const LayerOffsets& o = layout.layer(l);
    float* k = keys.get() + l * layer_floats;
    float* v = values.get() + l * layer_floats;
    GPT_CUDA_TRY(check(cuda::layernorm_forward(dec_ln.get(), dec_mean.get(), dec_rstd.get(), dec_x.get(), p + o.ln1_w,
                                               p + o.ln1_b, n, C, stream),
                       "ln_1"));
    GPT_CUDA_TRY(matmul_forward(dec_qkv.get(), dec_ln.get(), o.qkv_w, n, C, 3 * C, rounded));
    GPT_CUDA_TRY(check(cuda::add_bias(dec_qkv.get(), p + o.qkv_b, n, 3 * C, stream), "qkv bias"));
    // Every row's key and value first: a row may attend to an earlier row
    // of the same step (a prompt's tokens).
    GPT_CUDA_TRY(check(cuda::kv_store(k, v, dec_qkv.get(), rows, n, C, Tmax, stream), "caching keys and values"));
    GPT_CUDA_TRY(check(cuda::decode_attention(dec_atty.get(), dec_qkv.get(), k, v, rows, n, c.heads, C, Tmax, stream),
                       "decode attention"));
    GPT_CUDA_TRY(matmul_forward(dec_proj.get(), dec_atty.get(), o.proj_w, n, C, C, rounded));
    GPT_CUDA_TRY(check(cuda::add_bias_residual(dec_x.get(), dec_x.get(), dec_proj.get(), p + o.proj_b, n, C, stream),
                       "attention residual"));
    GPT_CUDA_TRY(check(cuda::layernorm_forward(dec_ln.get(), dec_mean.get(), dec_rstd.get(), dec_x.get(), p + o.ln2_w,
                                               p + o.ln2_b, n, C, stream),
                       "ln_2"));
    GPT_CUDA_TRY(matmul_forward(dec_fch.get(), dec_ln.get(), o.fc_w, n, C, 4 * C, rounded));
    GPT_CUDA_TRY(check(cuda::add_bias_gelu(dec_fch.get(), dec_fch_gelu.get(), p + o.fc_b, n, 4 * C, stream), "gelu"));
    GPT_CUDA_TRY(matmul_forward(dec_proj.get(), dec_fch_gelu.get(), o.fcproj_w, n, 4 * C, C, rounded));
    GPT_CUDA_TRY(check(cuda::add_bias_residual(dec_x.get(), dec_x.get(), dec_proj.get(), p + o.fcproj_b, n, C, stream),
                       "mlp residual"));
  }
  GPT_CUDA_TRY(check(cuda::layernorm_forward(dec_ln.get(), dec_mean.get(), dec_rstd.get(), dec_x.get(),
                                             p + layout.lnf_w(), p + layout.lnf_b(), n, C, stream),
                     "ln_f"));
  return matmul_forward(dec_logits.get(), dec_ln.get(), layout.lm_head(), n, C, V, rounded);
}

// -- GptCuda ------------------------------------------------------------------------

GptCuda::GptCuda(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GptCuda::GptCuda(GptCuda&&) noexcept = default;
GptCuda& GptCuda::operator=(GptCuda&&) noexcept = default;
GptCuda::~GptCuda() = default;

Result<GptCuda> GptCuda::make(const GptConfig& config, GptCudaOptions options) {
  auto layout = ParamLayout::make(config);
  if (!layout) return error(layout.error());
  if (config.value_head) {
    return error(ErrorCode::unsupported,
                 "gpt cuda: the value head (GptConfig::value_head) has no CUDA kernels; train a value-head model on "
                 "the CPU model (gpt.h), or give the GPU its policy-only config (value_head false) and the first "
                 "policy_count() parameters");
  }
  auto devices = device_count();
  if (!devices) {
    return error(ErrorCode::unsupported, "gpt cuda: " + devices.error().message() + ": use the CPU model (gpt.h)");
  }
  const int count = *devices;
  if (options.device < 0 || options.device >= count) {
    return error(ErrorCode::unsupported, "gpt cuda: device " + std::to_string(options.device) +
                                             " asked for; this machine has devices 0 to " + std::to_string(count - 1));
  }
  auto impl = std::make_unique<Impl>();
  impl->layout = std::move(*layout);
  impl->options = options;
  if (Status s = impl->start(); !s.ok()) {
    // Whatever failed while starting (a CUDA call, an allocation) failed the start.
    return error(ErrorCode::start_failed, s.message());
  }
  return GptCuda(std::move(impl));
}

Result<int> GptCuda::device_count() {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return error(ErrorCode::unsupported, std::string("no CUDA device here (") +
                                             (e == cudaSuccess ? "none found" : cudaGetErrorString(e)) + ")");
  }
  return count;
}

const ParamLayout& GptCuda::layout() const { return impl_->layout; }
const GptConfig& GptCuda::config() const { return impl_->config(); }
const GptCudaOptions& GptCuda::options() const { return impl_->options; }
bool GptCuda::attention_fused() const { return impl_->fused; }

Status GptCuda::upload_params(const float* host) {
  impl_->bf16_current = false;
  return impl_->copy_in(impl_->params.get(), host, impl_->total(), "uploading the parameters");
}
Status GptCuda::download_params(float* host) {
  return impl_->copy_out(host, impl_->params.get(), impl_->total(), "downloading the parameters");
}
Status GptCuda::upload_grads(const float* host) {
  if (!impl_->options.gradients) return no_gradients("upload_grads");
  return impl_->copy_in(impl_->grads.get(), host, impl_->total(), "uploading the gradients");
}
Status GptCuda::download_grads(float* host) {
  if (!impl_->options.gradients) return no_gradients("download_grads");
  return impl_->copy_out(host, impl_->grads.get(), impl_->total(), "downloading the gradients");
}

Status GptCuda::init_from(const Gpt<float>& cpu) {
  const GptConfig &a = cpu.config(), &b = config();
  if (a.vocab_size != b.vocab_size || a.context_length != b.context_length || a.layers != b.layers ||
      a.heads != b.heads || a.channels != b.channels || a.tied_embeddings != b.tied_embeddings ||
      a.value_head != b.value_head) {
    return invalid("init_from: the CPU model's config differs from this model's");
  }
  return upload_params(cpu.params());
}

Status GptCuda::forward(const int32_t* tokens, const int32_t* targets, size_t B, size_t T) {
  Impl& m = *impl_;
  const GptConfig& c = m.config();
  if (tokens == nullptr || targets == nullptr) return invalid("forward: null tokens or targets");
  if (B == 0 || T == 0 || T > c.context_length) {
    return Status(ErrorCode::invalid_argument, "gpt cuda: forward: batch " + std::to_string(B) + " x " +
                                                   std::to_string(T) + " positions; positions must be 1 to " +
                                                   std::to_string(c.context_length) + " (the context length)");
  }
  // cuBLAS takes int sizes: N rows must fit one; the attention matrix and
  // the logits must fit size_t.
  size_t N = 0, att = 0, logits = 0;
  if (!mul(B, T, &N) || N > static_cast<size_t>(INT_MAX) || !mul(N, c.heads, &att) || !mul(att, T, &att) ||
      !mul(N, c.vocab_size, &logits)) {
    return invalid("forward: batch " + std::to_string(B) + " x " + std::to_string(T) +
                   " positions is too large (more than 2^31 positions, or activations past size_t)");
  }
  const size_t V = c.vocab_size;
  for (size_t i = 0; i < N; ++i) {
    if (tokens[i] < 0 || static_cast<size_t>(tokens[i]) >= V || targets[i] < 0 ||
        static_cast<size_t>(targets[i]) >= V) {
      return Status(ErrorCode::invalid_argument,
                    "gpt cuda: forward: position " + std::to_string(i) + " has token " + std::to_string(tokens[i]) +
                        " / target " + std::to_string(targets[i]) + " outside the vocabulary of " + std::to_string(V));
    }
  }
  GPT_CUDA_TRY(check(cudaSetDevice(m.options.device), "cudaSetDevice"));
  m.have_forward = false;
  GPT_CUDA_TRY(m.size_for(B, T));
  GPT_CUDA_TRY(m.stage(m.inputs.get(), tokens, N * sizeof(int32_t), targets, N * sizeof(int32_t)));
  GPT_CUDA_TRY(m.run_forward());
  m.have_forward = true;
  return {};
}

Status GptCuda::losses(float* host) {
  Impl& m = *impl_;
  if (!m.have_forward) return invalid("losses: no forward has run");
  return m.copy_out(host, m.losses.get(), m.B * m.T, "copying the losses out");
}

Status GptCuda::zero_grad() {
  Impl& m = *impl_;
  if (!m.options.gradients) return no_gradients("zero_grad");
  GPT_CUDA_TRY(check(cudaSetDevice(m.options.device), "cudaSetDevice"));
  return check(cudaMemsetAsync(m.grads.get(), 0, m.total() * sizeof(float), m.stream), "zeroing the gradients");
}

Status GptCuda::backward(const float* dlosses) {
  Impl& m = *impl_;
  if (!m.options.gradients) return no_gradients("backward");
  if (!m.have_forward) return invalid("backward: no forward before it (the backward needs its activations)");
  if (dlosses == nullptr) return invalid("backward: null dlosses");
  GPT_CUDA_TRY(check(cudaSetDevice(m.options.device), "cudaSetDevice"));
  GPT_CUDA_TRY(m.stage(m.dlosses.get(), dlosses, m.B * m.T * sizeof(float), nullptr, 0));
  return m.run_backward();
}

Result<double> GptCuda::adamw_step(const AdamWConfig& config) {
  Impl& m = *impl_;
  auto fail = [](Status s) { return Result<double>(error(std::move(s))); };
  if (!m.options.gradients) return fail(no_gradients("adamw_step"));
  if (Status s = check(cudaSetDevice(m.options.device), "cudaSetDevice"); !s.ok()) return fail(s);
  if (Status s = m.ensure_optimizer(); !s.ok()) return fail(s);
  const size_t P = m.total();
  double sumsq = 0;
  Status s = check(cuda::sum_of_squares(m.norm.get(), m.grads.get(), P, m.norm.get() + 1, m.stream), "gradient norm");
  if (s.ok()) {
    s = check(cudaMemcpyAsync(&sumsq, m.norm.get(), sizeof(double), cudaMemcpyDeviceToHost, m.stream),
              "copying the gradient norm out");
  }
  if (s.ok()) s = check(cudaStreamSynchronize(m.stream), "gradient norm");
  if (!s.ok()) return fail(s);
  const double norm = std::sqrt(sumsq);
  if (!std::isfinite(norm)) return norm;  // a bad batch must not ruin the model

  // The scalars exactly as AdamW::step computes them.
  const size_t step = m.adamw_steps + 1;
  cuda::AdamWScalars a{};
  a.clip = config.clip_norm > 0 && norm > config.clip_norm;
  a.grad_scale = a.clip ? static_cast<float>(config.clip_norm / norm) : 1.0f;
  a.learning_rate = static_cast<float>(adamw_learning_rate(config, m.adamw_steps));
  a.beta1 = static_cast<float>(config.beta1);
  a.beta2 = static_cast<float>(config.beta2);
  a.correction1 = static_cast<float>(1.0 - std::pow(config.beta1, static_cast<double>(step)));
  a.correction2 = static_cast<float>(1.0 - std::pow(config.beta2, static_cast<double>(step)));
  a.eps = static_cast<float>(config.eps);
  a.weight_decay = static_cast<float>(config.weight_decay);
  if (Status u = check(cuda::adamw_update(m.params.get(), m.grads.get(), m.moment1.get(), m.moment2.get(),
                                          m.decay.get(), P, a, m.stream),
                       "adamw update");
      !u.ok()) {
    return fail(u);
  }
  m.adamw_steps = step;
  m.bf16_current = false;
  return norm;
}

size_t GptCuda::adamw_steps() const { return impl_->adamw_steps; }

Status GptCuda::download_adamw_state(float* m_host, float* v_host) {
  Impl& m = *impl_;
  if (m_host == nullptr || v_host == nullptr) return invalid("download_adamw_state: null host pointer");
  if (m.norm.get() == nullptr) {  // no optimizer yet (ensure_optimizer)
    std::fill(m_host, m_host + m.total(), 0.0f);
    std::fill(v_host, v_host + m.total(), 0.0f);
    return {};
  }
  GPT_CUDA_TRY(m.copy_out(m_host, m.moment1.get(), m.total(), "copying the first moment out"));
  return m.copy_out(v_host, m.moment2.get(), m.total(), "copying the second moment out");
}

Status GptCuda::restore_adamw_state(const float* m_host, const float* v_host, size_t steps) {
  Impl& m = *impl_;
  if (m_host == nullptr || v_host == nullptr) return invalid("restore_adamw_state: null host pointer");
  if (!m.options.gradients) return no_gradients("restore_adamw_state");
  GPT_CUDA_TRY(check(cudaSetDevice(m.options.device), "cudaSetDevice"));
  GPT_CUDA_TRY(m.ensure_optimizer());
  GPT_CUDA_TRY(m.copy_in(m.moment1.get(), m_host, m.total(), "copying the first moment in"));
  GPT_CUDA_TRY(m.copy_in(m.moment2.get(), v_host, m.total(), "copying the second moment in"));
  m.adamw_steps = steps;
  return {};
}

Status GptCuda::make_cache(size_t slots) {
  Impl& m = *impl_;
  const GptConfig& c = m.config();
  if (slots == 0) return invalid("make_cache: zero slots; give it at least one sequence");
  if (c.context_length > cuda::decode_attention_max_positions()) {
    return Status(ErrorCode::unsupported, "gpt cuda: make_cache: a context of " + std::to_string(c.context_length) +
                                              " positions; the decode attention takes up to " +
                                              std::to_string(cuda::decode_attention_max_positions()));
  }
  size_t floats = 0;
  if (!mul(c.layers, slots, &floats) || !mul(floats, c.context_length, &floats) || !mul(floats, c.channels, &floats)) {
    return invalid("make_cache: " + std::to_string(slots) + " slots overflow size_t");
  }
  GPT_CUDA_TRY(check(cudaSetDevice(m.options.device), "cudaSetDevice"));
  GPT_CUDA_TRY(check(cudaStreamSynchronize(m.stream), "waiting before replacing the cache"));
  m.cache_slots = 0;
  m.values.reset();
  GPT_CUDA_TRY(m.keys.allocate(floats, "the cached keys", ErrorCode::invalid_argument));
  GPT_CUDA_TRY(m.values.allocate(floats, "the cached values", ErrorCode::invalid_argument));
  // Zeroed: a row whose position skips ahead attends to finite zeros, not
  // to whatever the allocation held (NaN poisons a softmax).
  GPT_CUDA_TRY(check(cudaMemsetAsync(m.keys.get(), 0, floats * sizeof(float), m.stream), "zeroing the cached keys"));
  GPT_CUDA_TRY(check(cudaMemsetAsync(m.values.get(), 0, floats * sizeof(float), m.stream), "zeroing the cached values"));
  m.cache_slots = slots;
  return {};
}

Status GptCuda::decode(const uint32_t* slots, const uint32_t* positions, const int32_t* tokens, size_t n,
                       float* logits) {
  Impl& m = *impl_;
  const GptConfig& c = m.config();
  if (m.cache_slots == 0) return invalid("decode: no cache; call make_cache(slots) first");
  if (n == 0) return {};
  if (slots == nullptr || positions == nullptr || tokens == nullptr || logits == nullptr) {
    return invalid("decode: null rows or logits");
  }
  // cuBLAS takes int sizes; the widest product is (n, max(4C, V)).
  size_t widest = 0;
  if (n > static_cast<size_t>(INT_MAX) / 3 || !mul(n, std::max(4 * c.channels, c.vocab_size), &widest)) {
    return invalid("decode: " + std::to_string(n) + " rows is too many for one step");
  }
  std::vector<int32_t> staged(3 * n);
  for (size_t i = 0; i < n; ++i) {
    if (slots[i] >= m.cache_slots || positions[i] >= c.context_length || tokens[i] < 0 ||
        static_cast<size_t>(tokens[i]) >= c.vocab_size) {
      return invalid("decode: row " + std::to_string(i) + " (slot " + std::to_string(slots[i]) + ", position " +
                     std::to_string(positions[i]) + ", token " + std::to_string(tokens[i]) + ") is outside " +
                     std::to_string(m.cache_slots) + " slots, " + std::to_string(c.context_length) +
                     " positions and a vocabulary of " + std::to_string(c.vocab_size));
    }
    staged[i] = static_cast<int32_t>(slots[i]);
    staged[n + i] = static_cast<int32_t>(positions[i]);
    staged[2 * n + i] = tokens[i];
  }
  GPT_CUDA_TRY(check(cudaSetDevice(m.options.device), "cudaSetDevice"));
  GPT_CUDA_TRY(m.size_decode(n));
  GPT_CUDA_TRY(m.stage(m.decode_rows.get(), staged.data(), staged.size() * sizeof(int32_t), nullptr, 0));
  GPT_CUDA_TRY(m.run_decode(n));
  return m.copy_out(logits, m.dec_logits.get(), n * c.vocab_size, "copying the logits out");
}

float* GptCuda::device_params() {
  impl_->bf16_current = false;  // the caller may write through it
  return impl_->params.get();
}
float* GptCuda::device_grads() { return impl_->grads.get(); }

Result<float*> GptCuda::standby_params() {
  Impl& m = *impl_;
  if (Status s = check(cudaSetDevice(m.options.device), "cudaSetDevice"); !s.ok()) return error(s);
  if (m.standby.get() == nullptr) {
    if (Status s = m.standby.allocate(m.total(), "the standby parameters", ErrorCode::start_failed); !s.ok()) {
      return error(s);
    }
  }
  // Its writer runs on another stream: the steps enqueued here that read
  // it (before a swap made it the standby) must be done.
  if (Status s = synchronize(); !s.ok()) return error(s);
  return m.standby.get();
}

Status GptCuda::fill_standby(const float* device_src) {
  Impl& m = *impl_;
  auto dst = standby_params();
  if (!dst) return dst.error();
  // On the model's stream (non-blocking: a cudaMemcpy on the legacy
  // stream would not be ordered with it, nor waited for, device to device).
  GPT_CUDA_TRY(check(cudaMemcpyAsync(*dst, device_src, m.total() * sizeof(float), cudaMemcpyDeviceToDevice, m.stream),
                     "copying parameters into the standby"));
  return synchronize();
}

Status GptCuda::swap_standby() {
  Impl& m = *impl_;
  if (m.standby.get() == nullptr) return invalid("swap_standby: no standby; call standby_params() and fill it first");
  std::swap(m.params, m.standby);
  m.bf16_current = false;
  return {};
}

Status GptCuda::synchronize() {
  GPT_CUDA_TRY(check(cudaSetDevice(impl_->options.device), "cudaSetDevice"));
  return check(cudaStreamSynchronize(impl_->stream), "synchronize");
}

#undef GPT_CUDA_TRY

}  // namespace troupe::rl::model
