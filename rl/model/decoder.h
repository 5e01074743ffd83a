// The inference path's interface: a cache of `slots` sequences and a step
// that appends tokens to any of them and returns their next-token logits.
// Generation, scoring and the rollout engine's continuous batching are
// written against it once; the CPU's KV cache (kv_cache.h) and a device's
// (device_model.h: make_device_decoder) implement it.
//
//   std::unique_ptr<Decoder> d = ...;     // a KvCache, or a CUDA one
//   d->set_weights(model);                // the policy to run
//   DecodeRow rows[] = {{0, bos}, {0, '1'}, {1, bos}};
//   d->append(rows, logits);              // logits: 3 rows of vocab_size
//
// Not thread-safe: one caller at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/gpt.h"
#include "troupe/codec.h"
#include "troupe/status.h"

namespace troupe::rl::model {

/// One token to append: `token` goes at position length(slot) of `slot`.
struct DecodeRow {
  uint32_t slot = 0;
  int32_t token = 0;
};

/// Where a resident device model's parameters are, for a decoder on the
/// same device to copy them device to device (DeviceModel::share_params,
/// Decoder::copy_into_standby): within their process by address, from
/// another process on the same GPU by CUDA IPC. Valid until the model's
/// next step or write.
struct SharedParams {
  /// The device: "cuda:" and its UUID, or "host" (the host kind: within
  /// its process only). Empty: nothing shared.
  std::string device;
  /// The process that holds them (process_nonce(): pids repeat across PID
  /// namespaces; the pid is for messages), and their address there.
  uint64_t process = 0;
  int64_t pid = 0;
  uint64_t address = 0;
  /// A cudaIpcMemHandle_t's bytes for the allocation that starts at
  /// `address` (CUDA only), for other processes.
  std::string ipc_handle;
  /// Floats there (the layout's total()).
  uint64_t floats = 0;
  /// Until when (Unix time, ms) a copy may start: the model may change
  /// after it. 0: not offered (a reader copies nothing).
  int64_t valid_until_unix_ms = 0;
  TROUPE_FIELDS(device, process, pid, address, ipc_handle, floats, valid_until_unix_ms);
};

/// A random number drawn once per process, for SharedParams::process.
uint64_t process_nonce();

/// Keys and values of every layer for `slots()` sequences of up to the
/// context length, and the model that fills them.
class Decoder {
 public:
  virtual ~Decoder() = default;

  /// Where it runs, for logs: "cpu", "cuda:0 NVIDIA H100 80GB HBM3, fp32 products".
  virtual std::string describe() const = 0;
  /// The shape it was made for (a value head, if any, is never run).
  virtual const GptConfig& config() const = 0;
  /// Sequences it holds at once.
  virtual size_t slots() const = 0;
  /// Tokens cached for `slot` (its next position).
  virtual size_t length(size_t slot) const = 0;
  /// Forgets `slot`'s sequence (its next token goes at position 0).
  virtual void clear(size_t slot) = 0;
  /// Forgets every sequence.
  virtual void clear_all() = 0;

  /// Runs `model`'s weights from now on. The CPU cache refers to `model`
  /// (the caller keeps it alive and unchanged while it appends); a device
  /// copies the weights in. Cached keys and values are kept: clear the
  /// slots whose sequences must be recomputed. Errors: a model of another
  /// shape (with or without a value head is the same), a device failure.
  virtual Status set_weights(const Gpt<float>& model) = 0;
  /// Runs the model on `rows` (in order; a slot may appear in several rows,
  /// which then take consecutive positions) and writes each row's
  /// next-token logits to `logits` (rows.size() x vocab_size). Errors,
  /// before anything is cached: no weights set, a slot out of range, a
  /// token outside the vocabulary, a slot that would pass the context
  /// length; and a device's failure.
  virtual Status append(std::span<const DecodeRow> rows, float* logits) = 0;

  // The next weights, written where the decoder runs them: a device
  // decoder keeps a second copy of the weights in its own memory, the
  // standby, which a collective (NCCL's broadcast from the trainer's GPU)
  // or a device copy fills while the decoder keeps appending with the
  // current ones; take_standby() then runs it. Nothing crosses to the host
  // on the way. The CPU cache has none: it runs a host model (set_weights).

  /// The standby: the policy's parameters (ParamLayout of config(): its
  /// total() floats, layout order) in the decoder's memory (a CUDA pointer on a GPU), allocated on the first
  /// call; all earlier work has finished when this returns, and the
  /// pointer stays valid until take_standby() or the decoder's end. Errors:
  /// unsupported (a decoder without one: the CPU cache), a device failure.
  virtual Result<float*> standby_weights();
  /// Runs the standby's weights from now on; the weights it ran become the
  /// standby. The writer of the standby must have finished. Cached keys and
  /// values are kept, as with set_weights. Errors: no standby_weights()
  /// before it, unsupported.
  virtual Status take_standby();
  /// Copies `from` (a device model's parameters on this decoder's device:
  /// DeviceModel::share_params) into the standby, device to device; then
  /// take_standby() runs them. Errors: unsupported when `from` is on
  /// another device or out of reach (the host kind reaches its own
  /// process only; the CPU cache has no standby): read the weights another
  /// way; invalid_argument for another model's size; a device failure
  /// (the IPC handle refused).
  virtual Status copy_into_standby(const SharedParams& from);
  /// Copies the policy's parameters it runs (as the standby's: a value
  /// head's are not among them) to `host`. Errors: no weights set, a
  /// device failure.
  virtual Status read_weights(float* host) = 0;
};

/// The positions `rows` take (Decoder::append's rule), checking every row
/// first: on success `lengths` (per slot) has grown by the rows and
/// `positions[i]` is row i's; on error neither changed. For implementations
/// of Decoder.
Status assign_positions(const GptConfig& config, std::span<const DecodeRow> rows, std::vector<size_t>& lengths,
                        std::vector<size_t>& positions);

/// Whether `model` fits a decoder made for `config` (the value head aside).
Status check_decoder_shape(const GptConfig& config, const Gpt<float>& model);

}  // namespace troupe::rl::model
