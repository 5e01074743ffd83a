// NCCL communicators: collectives on CUDA device buffers, for the collective
// engine to use when a group's buffers live on GPUs. One NcclComm is one
// rank's handle on a group of GPUs (one GPU per rank, in any processes).
//
// Nothing here blocks the calling thread on the network or on the GPU, so an
// actor can drive it from its handlers:
//
//   rank 0:      id = nccl_unique_id()          (then sent to every rank)
//   every rank:  comm = NcclComm::start(id, rank, size, device)
//                poll comm->init_state() until done, under your own deadline
//                comm->enqueue(...); poll comm->done_state() until done
//   on timeout:  comm->abort(), then make a new communicator
//
// The communicator is non-blocking (ncclConfig_t::blocking = 0): init runs
// on NCCL's own threads, and a failed or lost peer shows up in a poll
// instead of as a hang. The connections to the peers are made during init
// (NCCL_RUNTIME_CONNECT=0, unless the process set it): a collective's
// launch that had to connect would wait for every peer to reach the same
// collective inside enqueue(), up to the poll timeout. (With the process's
// own NCCL_RUNTIME_CONNECT=1, enqueue() may wait so, bounded.)
//
// In a build without NCCL (no CUDA toolkit, or no nccl.h / libnccl there)
// this header is the same and every call answers ErrorCode::unsupported.
//
// Not thread-safe: one thread at a time per NcclComm (an actor owns it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "collectives/ring.h"
#include "troupe/collective_group.h"
#include "troupe/collectives.h"
#include "troupe/status.h"

namespace troupe::collectives {

/// Bytes in an NCCL unique id (NCCL_UNIQUE_ID_BYTES, part of NCCL's ABI).
inline constexpr size_t kNcclUniqueIdBytes = 128;

/// A fresh id for one communicator, as kNcclUniqueIdBytes raw bytes. One rank
/// makes it and sends it to every rank of the group, each of which passes it
/// to NcclComm::start. It names a socket that NCCL keeps listening on until
/// the group is up: make a new one for every communicator.
Result<std::string> nccl_unique_id();

/// Where NCCL's in-place reduce_scatter / allgather put `rank`'s segment of a
/// buffer of `count_elems` elements over `ranks` ranks. NCCL wants equal
/// segments (recvbuff = sendbuff + rank * recvcount), which is the ring
/// layout of CollectiveKind (ring_segment) exactly when `ranks` divides
/// `count_elems`; any other count is invalid_argument. For the kinds that
/// are not segmented (allreduce, broadcast, barrier) it is the whole buffer.
/// Pure: it only looks at its arguments.
/// REQUIRES: rank < ranks (aborts otherwise).
Result<ElemRange> nccl_in_place_segment(CollectiveKind kind, size_t count_elems, size_t ranks, size_t rank);

/// Where a non-blocking step (a communicator's init, its collectives) stands,
/// as seen by one poll that did not block.
struct Poll {
  /// pending: still running, poll again; done: finished well; failed: see
  /// `status`, and the communicator is broken (abort it).
  enum class State : uint8_t { pending, done, failed };

  State state = State::pending;
  /// Why it failed; ok unless state is failed.
  Status status;

  /// True while the step is still running.
  bool pending() const { return state == State::pending; }
  /// True once the step has finished well.
  bool done() const { return state == State::done; }
  /// True when the step failed (status says why).
  bool failed() const { return state == State::failed; }
};

/// One rank of an NCCL communicator on one CUDA device, with its own CUDA
/// stream on which every collective runs, in the order enqueued. Move-only;
/// the destructor releases the communicator (gracefully when it is healthy,
/// by abort otherwise), its stream and its events.
class NcclComm {
 public:
  /// How long enqueue() and the destructor poll NCCL when it answers "in
  /// progress" (a first collective connecting to its peers; a finalize).
  static constexpr std::chrono::milliseconds kDefaultPollTimeout{30'000};

  /// Begins joining the group named by `unique_id` (from nccl_unique_id(),
  /// the same on every rank) as `rank` of `size`, on CUDA device `device`,
  /// and returns at once: poll init_state() until it is done, abort() on your
  /// deadline. `poll_timeout` bounds the polls enqueue() and the destructor
  /// make (kDefaultPollTimeout). Errors: invalid_argument (an id of the wrong
  /// length, rank or device out of range), unsupported (no GPU here, or a
  /// build without NCCL), start_failed (CUDA or NCCL refused to start).
  static Result<std::unique_ptr<NcclComm>> start(const std::string& unique_id, int rank, int size, int device,
                                                 std::chrono::milliseconds poll_timeout = kDefaultPollTimeout);

  /// Where init stands: pending until every rank has joined, then done for
  /// good (or failed). Never blocks.
  Poll init_state();

  /// Enqueues `kind` on the communicator's stream, in place on `count`
  /// elements of `dtype` at `data` (device memory on this communicator's
  /// device, or managed memory), with the layout CollectiveKind documents;
  /// poll done_state() for the end. `op` is used by allreduce and
  /// reduce_scatter, `root` by broadcast; a barrier uses none of data, count,
  /// dtype and op. NCCL's max and min drop a NaN (fmaxf) where the CPU
  /// collectives keep it; reduce_scatter leaves the other segments
  /// unspecified. Errors: invalid_argument (a host pointer, a count the
  /// group size does not divide for reduce_scatter and allgather, a root out
  /// of range, init not done yet); timeout (NCCL still "in progress" after
  /// the poll timeout: abort); the error that broke the communicator, or
  /// "communicator aborted", once it is broken.
  /// The collective runs after the work enqueued before it on the legacy
  /// default stream (the caller's cudaMemcpy into the buffer, say).
  /// REQUIRES: the memory stays valid and untouched until done_state() is
  /// done, or until abort() once anything failed (NCCL may still be using
  /// it); writes made on other streams are synchronised by the caller
  /// first; every rank enqueues the same collectives in the same order.
  Status enqueue(CollectiveKind kind, void* data, size_t count, DType dtype, ReduceOp op, int root);

  /// Where the collectives enqueued so far stand: pending, done (all of
  /// them, also when none was enqueued), or failed with NCCL's or CUDA's
  /// error. Never blocks.
  Poll done_state();
  /// How many more of the collectives enqueued so far have finished since
  /// the last call (each has an event of its own; they finish in the order
  /// they were enqueued, so these are the oldest not yet told), or NCCL's
  /// or CUDA's error. Never blocks.
  Result<size_t> take_finished();

  /// Aborts the communicator: NCCL stops its kernels and threads and frees it,
  /// and every later call fails with "communicator aborted". For a deadline
  /// that passed or a peer that is gone; the other ranks must abort theirs
  /// too. Safe at any time and more than once (later calls do nothing).
  void abort();

  /// This rank in the group.
  int rank() const;
  /// Ranks in the group.
  int size() const;
  /// The CUDA device the communicator runs on.
  int device() const;

  /// True when `p` points into CUDA device or managed memory (where NCCL can
  /// reach it); false for host memory, in a build without CUDA, and on a
  /// machine without a GPU; an error (handler_failed) when CUDA cannot tell
  /// (a broken context), never a guess.
  static Result<bool> is_device_pointer(const void* p);
  /// The CUDA device `p` is on (the one a communicator for it must use), or
  /// -1 where is_device_pointer(p) is false.
  static int device_of(const void* p);

  /// Releases the communicator: finalize then destroy when it is healthy
  /// (polled for at most the poll timeout, then aborted), abort otherwise.
  ~NcclComm();
  NcclComm(NcclComm&&) noexcept;
  NcclComm& operator=(NcclComm&&) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

 private:
  struct Impl;
  explicit NcclComm(std::unique_ptr<Impl> impl);
  // Aborts with a message on a moved-from NcclComm (a bug in the caller).
  Impl& impl() const;

  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::collectives
