#include "collectives/nccl_comm.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>
#include <mutex>
#include <string_view>
#include <utility>

#if TROUPE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if TROUPE_WITH_NCCL
#include <nccl.h>

#include <thread>

#include "log.h"
#endif

namespace troupe::collectives {
namespace {

// The engine validates user input before it gets here: a bad argument that
// reaches a REQUIRES is a bug in troupe, so it aborts.
[[noreturn]] void contract_broken(const std::string& what) {
  std::fprintf(stderr, "troupe: nccl: %s\n", what.c_str());
  std::abort();
}

#if TROUPE_WITH_CUDA
// Asked once: without a GPU every CUDA call fails, and the pointer queries
// should not pay for finding that out again.
bool gpu_present() {
  static const bool present = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return present;
}

// What CUDA knows of `p`: true for device or managed memory (attr filled
// in), false for host memory (registered or not) and without a GPU, an
// error when CUDA cannot say (a broken context, no context to be had): a
// device buffer taken for host memory would be read by the CPU and crash
// the process, so that is never guessed.
Result<bool> pointer_attributes(const void* p, cudaPointerAttributes* attr) {
  if (p == nullptr || !gpu_present()) return false;
  *attr = {};
  if (cudaError_t e = cudaPointerGetAttributes(attr, p); e != cudaSuccess) {
    (void)cudaGetLastError();  // reported here, not left for the next CUDA call to trip on
    return error(ErrorCode::handler_failed,
                 fmt::format("cuda: asking where the buffer at {} lives failed: {}: check the process's CUDA "
                             "context (an earlier kernel fault leaves it broken) and the device with nvidia-smi",
                             p, cudaGetErrorString(e)));
  }
  return attr->type == cudaMemoryTypeDevice || attr->type == cudaMemoryTypeManaged;
}
#endif

}  // namespace

Result<ElemRange> nccl_in_place_segment(CollectiveKind kind, size_t count_elems, size_t ranks, size_t rank) {
  if (rank >= ranks) {
    contract_broken(fmt::format("nccl_in_place_segment: rank {} is not below ranks {}", rank, ranks));
  }
  if (kind != CollectiveKind::reduce_scatter && kind != CollectiveKind::allgather) return ElemRange{0, count_elems};
  if (count_elems % ranks != 0) {
    size_t padded = (count_elems / ranks + 1) * ranks;
    return error(ErrorCode::invalid_argument,
                 fmt::format("nccl: {} of {} elements over {} ranks: NCCL needs segments of equal length, so the "
                             "count must be a multiple of the group size; pad the buffer to {} elements, or use "
                             "the CPU collectives",
                             kind_name(kind), count_elems, ranks, padded));
  }
  ElemRange nccl{rank * (count_elems / ranks), count_elems / ranks};
  // NCCL's in-place layout and the one CollectiveKind promises must be the
  // same bytes, or ranks would reduce the wrong segments without an error.
  if (ring_segment(count_elems, ranks, rank) != nccl) {
    contract_broken(fmt::format("nccl_in_place_segment: ring_segment({}, {}, {}) differs from NCCL's layout",
                                count_elems, ranks, rank));
  }
  return nccl;
}

int NcclComm::device_of(const void* p) {
#if TROUPE_WITH_CUDA
  cudaPointerAttributes attr;
  auto on_device = pointer_attributes(p, &attr);
  return on_device && *on_device ? attr.device : -1;
#else
  (void)p;
  return -1;
#endif
}

Result<bool> NcclComm::is_device_pointer(const void* p) {
#if TROUPE_WITH_CUDA
  cudaPointerAttributes attr;
  return pointer_attributes(p, &attr);
#else
  (void)p;
  return false;
#endif
}

#if TROUPE_WITH_NCCL

namespace {

// Makes `device` the calling thread's current CUDA device: NCCL init,
// streams and events belong to the current device. It is not put back
// after: the callers run on the actor system's shared threads, where the
// current device means nothing to the next actor (every troupe entry point
// that touches CUDA sets its own), and putting back device 0 on a thread
// that had none would make a context on GPU 0 (CUDA 12+) in every process,
// whichever GPU it uses.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != device) status_ = cudaSetDevice(device);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  cudaError_t status() const { return status_; }

 private:
  cudaError_t status_ = cudaSuccess;
};

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return ncclFloat32;
    case DType::bfloat16:
      return ncclBfloat16;
    case DType::int32:
      return ncclInt32;
    case DType::int64:
      return ncclInt64;
  }
  contract_broken("nccl_type: not a DType");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  contract_broken("nccl_op: not a ReduceOp");
}

// NCCL's word for `r`, with the detail it keeps for the calling thread.
std::string nccl_says(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') s += fmt::format(" ({})", last);
  return s;
}

// A code for an NCCL failure: the caller's mistake, a lost peer or network,
// or `otherwise` (CUDA and NCCL's internal errors).
ErrorCode code_of(ncclResult_t r, ErrorCode otherwise) {
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return ErrorCode::invalid_argument;
    case ncclRemoteError:
    case ncclSystemError:
      return ErrorCode::peer_lost;
    default:
      return otherwise;
  }
}

Status aborted_status() {
  return Status(ErrorCode::invalid_argument,
                "nccl: communicator aborted: start a new one (NcclComm::start) to run more collectives");
}

}  // namespace

struct NcclComm::Impl {
  int rank = 0;
  int size = 0;
  int device = 0;
  std::chrono::milliseconds poll_timeout{};
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  // One event recorded after each collective, oldest first: a collective is
  // answered when its own has passed, not when the newest has (a caller
  // that keeps enqueueing would otherwise never see the first one done).
  std::deque<cudaEvent_t> in_flight;
  std::vector<cudaEvent_t> spare_events;  // passed, for reuse
  size_t finished_unclaimed = 0;           // passed, not yet told by take_finished()
  // Recorded on the legacy default stream before each enqueue, and waited
  // for by `stream`: the caller's writes to the buffer on that stream (a
  // cudaMemcpy from pageable memory returns before its last DMA) land
  // before the collective reads it. One way only: the default stream never
  // waits for a collective, so a stuck one cannot hang other CUDA work.
  cudaEvent_t ready_event = nullptr;
  // The barrier's one float: NCCL has no barrier, a 1-element allreduce is one.
  void* scratch = nullptr;
  bool init_done = false;
  bool aborted = false;
  // The first error that broke the communicator; ok while it is healthy.
  Status broken;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl();

  // "rank 1 of 4 on device 0", for messages.
  std::string who() const { return fmt::format("rank {} of {} on device {}", rank, size, device); }

  // Keeps the first failure: later ones are usually its echoes.
  Status fail(Status s) {
    if (broken.ok()) broken = std::move(s);
    return broken;
  }

  // ok, or why no NCCL call may be made now.
  Status unusable() const {
    if (aborted) return aborted_status();
    return broken;
  }

  // Moves the collectives whose events have passed (oldest first) to
  // finished_unclaimed; the error that broke the communicator otherwise.
  Status drain();

  // NCCL's state of the communicator: ncclSuccess, ncclInProgress, or the
  // error that broke it.
  ncclResult_t async_state() const {
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    return r != ncclSuccess ? r : state;
  }

  // NCCL answers ncclInProgress from a non-blocking call it finishes on its
  // own threads (a first collective connecting to its peers, a finalize), and
  // no NCCL call may come until it is over. It offers no callback: the
  // documented wait is polling ncclCommGetAsyncError, so that is what this
  // does, yielding between polls and for at most poll_timeout (then it still
  // answers ncclInProgress).
  ncclResult_t settle(ncclResult_t r) const {
    auto deadline = std::chrono::steady_clock::now() + poll_timeout;
    while (r == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
      r = async_state();
    }
    return r;
  }

  void abort_now() {
    if (aborted) return;
    aborted = true;
    if (comm == nullptr) return;
    DeviceScope scope(device);
    // Abort frees the communicator whatever it answers; there is nothing
    // left to retry.
    if (ncclResult_t r = ncclCommAbort(comm); r != ncclSuccess) {
      TROUPE_LOG(warn, "event=nccl_abort_failed rank={} size={} device={} reason=\"{}\"", rank, size, device,
                 ncclGetErrorString(r));
    }
    comm = nullptr;
  }
};

NcclComm::Impl::~Impl() {
  DeviceScope scope(device);
  if (comm != nullptr && !aborted) {
    // Healthy: finalize flushes what is enqueued and quiesces NCCL's
    // threads, then destroy frees the rest locally. Anything else (init not
    // over, an error, a finalize that does not end) is aborted, which never
    // waits for peers.
    // (NCCL says ncclSuccess only once init is over, polled for or not.)
    bool healthy = broken.ok() && async_state() == ncclSuccess;
    ncclResult_t r = healthy ? settle(ncclCommFinalize(comm)) : ncclInProgress;
    if (healthy && r == ncclSuccess) {
      // Not aborted if it fails: what destroy did free cannot be freed twice.
      if (ncclResult_t d = ncclCommDestroy(comm); d != ncclSuccess) {
        TROUPE_LOG(warn, "event=nccl_destroy_failed rank={} size={} device={} reason=\"{}\"", rank, size, device,
                   ncclGetErrorString(d));
      }
      comm = nullptr;
    } else {
      if (healthy) {
        TROUPE_LOG(warn, "event=nccl_finalize_failed rank={} size={} device={} reason=\"{}\"", rank, size, device,
                   r == ncclInProgress ? "still in progress after the poll timeout" : ncclGetErrorString(r));
      }
      abort_now();
    }
  }
  // After the communicator, which may still have work on the stream.
  for (cudaEvent_t e : in_flight) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : spare_events) (void)cudaEventDestroy(e);
  if (ready_event != nullptr) (void)cudaEventDestroy(ready_event);
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  if (scratch != nullptr) (void)cudaFree(scratch);
}

Result<std::string> nccl_unique_id() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return error(code_of(r, ErrorCode::start_failed),
                 fmt::format("nccl: making a unique id failed: {}: check that this host has a network interface "
                             "NCCL can listen on (NCCL_SOCKET_IFNAME picks one)",
                             nccl_says(r, nullptr)));
  }
  return std::string(id.internal, sizeof id.internal);
}

Result<std::unique_ptr<NcclComm>> NcclComm::start(const std::string& unique_id, int rank, int size, int device,
                                                  std::chrono::milliseconds poll_timeout) {
  static_assert(kNcclUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);
  if (unique_id.size() != kNcclUniqueIdBytes) {
    return error(ErrorCode::invalid_argument,
                 fmt::format("nccl: the unique id is {} bytes, not {}: pass every rank the bytes that "
                             "nccl_unique_id() returned, unchanged",
                             unique_id.size(), kNcclUniqueIdBytes));
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return error(
        ErrorCode::invalid_argument,
        fmt::format("nccl: rank {} of {} ranks: a group has at least one rank, numbered 0 to size - 1", rank, size));
  }
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    return error(ErrorCode::unsupported,
                 fmt::format("nccl: no CUDA device here ({}): run NCCL collectives on a machine with a GPU, or use "
                             "the CPU collectives",
                             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices"));
  }
  if (device < 0 || device >= devices) {
    return error(
        ErrorCode::invalid_argument,
        fmt::format("nccl: device {} does not exist here: this machine has devices 0 to {}", device, devices - 1));
  }

  auto s = std::make_unique<Impl>();
  s->rank = rank;
  s->size = size;
  s->device = device;
  s->poll_timeout = poll_timeout;
  DeviceScope scope(device);
  auto cuda_failed = [&](const char* what, cudaError_t e) {
    return error(ErrorCode::start_failed, fmt::format("nccl: {}: {} failed: {}: check the device with nvidia-smi",
                                                      s->who(), what, cudaGetErrorString(e)));
  };
  if (cudaError_t e = scope.status(); e != cudaSuccess) return cuda_failed("selecting the device", e);
  // Its own non-blocking stream: collectives must not queue behind, or
  // synchronise with, the legacy default stream the caller's work may use.
  if (cudaError_t e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return cuda_failed("creating the stream", e);
  }
  if (cudaError_t e = cudaEventCreateWithFlags(&s->ready_event, cudaEventDisableTiming); e != cudaSuccess) {
    return cuda_failed("creating the ordering event", e);
  }
  if (cudaError_t e = cudaMalloc(&s->scratch, sizeof(float)); e != cudaSuccess) {
    return cuda_failed("allocating the barrier's scratch element", e);
  }
  if (cudaError_t e = cudaMemset(s->scratch, 0, sizeof(float)); e != cudaSuccess) {
    return cuda_failed("clearing the barrier's scratch element", e);
  }

  // NCCL 2.22+ connects to the peers on a collective's first use, inside
  // the launch, which then waits for all of them on the engine's thread;
  // connecting during init instead keeps that wait in the polled init.
  // (The process's own setting wins; set once, before any init reads it.)
  static std::once_flag connect_at_init;
  std::call_once(connect_at_init, [] { ::setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0); });
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init, connects and errors come back through polls, never as a blocked thread
  ncclResult_t r = ncclCommInitRankConfig(&s->comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    // A comm it did make is aborted by ~Impl.
    return error(code_of(r, ErrorCode::start_failed),
                 fmt::format("nccl: {}: init failed: {}: check that every rank got the same unique id and that "
                             "the ranks can reach each other (NCCL_DEBUG=WARN says more)",
                             s->who(), nccl_says(r, s->comm)));
  }
  return std::unique_ptr<NcclComm>(new NcclComm(std::move(s)));
}

Poll NcclComm::init_state() {
  Impl& s = impl();
  if (Status st = s.unusable(); !st.ok()) return {Poll::State::failed, st};
  if (s.init_done) return {Poll::State::done, {}};
  ncclResult_t r = s.async_state();
  if (r == ncclInProgress) return {Poll::State::pending, {}};
  if (r != ncclSuccess) {
    return {Poll::State::failed,
            s.fail(Status(code_of(r, ErrorCode::start_failed),
                          fmt::format("nccl: {}: init failed: {}: abort it; check that every rank got the same "
                                      "unique id and that the ranks can reach each other (NCCL_DEBUG=WARN says more)",
                                      s.who(), nccl_says(r, s.comm))))};
  }
  s.init_done = true;
  return {Poll::State::done, {}};
}

Status NcclComm::enqueue(CollectiveKind kind, void* data, size_t count, DType dtype, ReduceOp op, int root) {
  Impl& s = impl();
  if (Status st = s.unusable(); !st.ok()) return st;
  if (!s.init_done) {
    Poll init = init_state();
    if (init.failed()) return init.status;
    if (init.pending()) {
      return Status(
          ErrorCode::invalid_argument,
          fmt::format("nccl: {}: {} before init is done: poll init_state() until it is", s.who(), kind_name(kind)));
    }
  }
  // For error messages only: no formatting on the way that succeeds.
  auto what = [&] {
    return fmt::format("{} of {} {} elements on {}", kind_name(kind), count, dtype_name(dtype), s.who());
  };
  if (kind == CollectiveKind::broadcast && (root < 0 || root >= s.size)) {
    return Status(ErrorCode::invalid_argument,
                  fmt::format("nccl: {}: root {} is not a rank of the group (0 to {})", what(), root, s.size - 1));
  }
  if (kind != CollectiveKind::barrier) {
    // Every rank passes the same count, so every rank skips together.
    if (count == 0) return {};
    cudaPointerAttributes attr;
    auto on_device = pointer_attributes(data, &attr);
    if (!on_device) return on_device.error();
    if (!*on_device || (attr.type == cudaMemoryTypeDevice && attr.device != s.device)) {
      return Status(ErrorCode::invalid_argument,
                    fmt::format("nccl: {}: the buffer at {} is not device memory on device {}: NCCL reaches only "
                                "its device's memory; copy the data there, or use the CPU collectives",
                                what(), data, s.device));
    }
  }
  auto segment = nccl_in_place_segment(kind, count, static_cast<size_t>(s.size), static_cast<size_t>(s.rank));
  if (!segment) return segment.error();

  DeviceScope scope(s.device);
  cudaError_t ordered = cudaEventRecord(s.ready_event, cudaStreamLegacy);
  if (ordered == cudaSuccess) ordered = cudaStreamWaitEvent(s.stream, s.ready_event, 0);
  if (ordered != cudaSuccess) {
    return s.fail(Status(ErrorCode::handler_failed, fmt::format("nccl: {}: ordering after the default stream: {}",
                                                                what(), cudaGetErrorString(ordered))));
  }
  auto* base = static_cast<char*>(data);
  void* mine = base + segment->offset_elems * dtype_size(dtype);  // this rank's segment, in place
  ncclResult_t r = ncclSuccess;
  switch (kind) {
    case CollectiveKind::allreduce:
      r = ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op), s.comm, s.stream);
      break;
    case CollectiveKind::reduce_scatter:
      r = ncclReduceScatter(data, mine, segment->len_elems, nccl_type(dtype), nccl_op(op), s.comm, s.stream);
      break;
    case CollectiveKind::allgather:
      r = ncclAllGather(mine, data, segment->len_elems, nccl_type(dtype), s.comm, s.stream);
      break;
    case CollectiveKind::broadcast:
      r = ncclBroadcast(data, data, count, nccl_type(dtype), root, s.comm, s.stream);
      break;
    case CollectiveKind::barrier:
      r = ncclAllReduce(s.scratch, s.scratch, 1, ncclFloat32, ncclSum, s.comm, s.stream);
      break;
  }
  // The collective is on the stream only once NCCL stops saying "in
  // progress": an event recorded before would pass before it ran.
  r = s.settle(r);
  if (r == ncclInProgress) {
    return s.fail(Status(ErrorCode::timeout,
                         fmt::format("nccl: {}: still being launched after {} ms (NCCL connects to the peers on "
                                     "first use, and waits for all of them): abort the communicator",
                                     what(), s.poll_timeout.count())));
  }
  if (r != ncclSuccess) {
    return s.fail(Status(code_of(r, ErrorCode::handler_failed),
                         fmt::format("nccl: {}: {}: abort the communicator and start a new one once the group is "
                                     "whole",
                                     what(), nccl_says(r, s.comm))));
  }
  cudaEvent_t done = nullptr;
  cudaError_t e = cudaSuccess;
  if (!s.spare_events.empty()) {
    done = s.spare_events.back();
    s.spare_events.pop_back();
  } else {
    e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  }
  if (e == cudaSuccess) e = cudaEventRecord(done, s.stream);
  if (e != cudaSuccess) {
    if (done != nullptr) (void)cudaEventDestroy(done);
    return s.fail(Status(ErrorCode::handler_failed,
                         fmt::format("nccl: {}: recording its completion event failed: {}: abort the communicator",
                                     what(), cudaGetErrorString(e))));
  }
  s.in_flight.push_back(done);
  return {};
}

Status NcclComm::Impl::drain() {
  if (Status st = unusable(); !st.ok()) return st;
  if (in_flight.empty()) return {};
  // NCCL first: a lost peer leaves the kernel waiting, so the events alone
  // would stay pending for ever.
  ncclResult_t r = async_state();
  if (r != ncclSuccess && r != ncclInProgress) {
    return fail(Status(code_of(r, ErrorCode::handler_failed),
                       fmt::format("nccl: {}: a collective failed: {}: abort the communicator and start a new one "
                                   "once the group is whole",
                                   who(), nccl_says(r, comm))));
  }
  DeviceScope scope(device);
  while (!in_flight.empty()) {
    cudaError_t e = cudaEventQuery(in_flight.front());
    if (e == cudaErrorNotReady) break;
    if (e != cudaSuccess) {
      return fail(Status(ErrorCode::handler_failed,
                         fmt::format("nccl: {}: a collective failed on the device: {}: abort the communicator", who(),
                                     cudaGetErrorString(e))));
    }
    spare_events.push_back(in_flight.front());
    in_flight.pop_front();
    ++finished_unclaimed;
  }
  return {};
}

Poll NcclComm::done_state() {
  Impl& s = impl();
  if (Status st = s.drain(); !st.ok()) return {Poll::State::failed, st};
  return {s.in_flight.empty() ? Poll::State::done : Poll::State::pending, {}};
}

Result<size_t> NcclComm::take_finished() {
  Impl& s = impl();
  if (Status st = s.drain(); !st.ok()) return error(st);
  size_t n = s.finished_unclaimed;
  s.finished_unclaimed = 0;
  return n;
}

void NcclComm::abort() {
  if (impl_ == nullptr) return;
  if (!impl_->aborted) {
    TROUPE_LOG(info, "event=nccl_comm_abort rank={} size={} device={}", impl_->rank, impl_->size, impl_->device);
  }
  impl_->abort_now();
}

#else  // a build without NCCL: the same API, answering unsupported

namespace {

Status built_without_nccl() {
  return Status(ErrorCode::unsupported,
                "nccl: this troupe was built without NCCL (configure found no CUDA toolkit with nccl.h and libnccl, "
                "e.g. in /usr/local/cuda): rebuild with them, or use the CPU collectives");
}

}  // namespace

// Never made (start fails), but the members still need a definition.
struct NcclComm::Impl {
  int rank = 0;
  int size = 0;
  int device = 0;
};

Result<std::string> nccl_unique_id() { return error(built_without_nccl()); }

Result<std::unique_ptr<NcclComm>> NcclComm::start(const std::string&, int, int, int, std::chrono::milliseconds) {
  return error(built_without_nccl());
}

Poll NcclComm::init_state() { return {Poll::State::failed, built_without_nccl()}; }

Status NcclComm::enqueue(CollectiveKind, void*, size_t, DType, ReduceOp, int) { return built_without_nccl(); }

Poll NcclComm::done_state() { return {Poll::State::failed, built_without_nccl()}; }

Result<size_t> NcclComm::take_finished() { return error(built_without_nccl()); }

void NcclComm::abort() {}

#endif  // TROUPE_WITH_NCCL

NcclComm::NcclComm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclComm::~NcclComm() = default;
NcclComm::NcclComm(NcclComm&&) noexcept = default;
NcclComm& NcclComm::operator=(NcclComm&&) noexcept = default;

NcclComm::Impl& NcclComm::impl() const {
  if (impl_ == nullptr) contract_broken("a moved-from NcclComm was used");
  return *impl_;
}

int NcclComm::rank() const { return impl().rank; }
int NcclComm::size() const { return impl().size; }
int NcclComm::device() const { return impl().device; }

}  // namespace troupe::collectives
