// The collective engine's GPU side (ProcAnchor): collectives on CUDA memory
// run on an NCCL communicator made for the group, one per group and process.
//
// Rank 0's engine makes the communicator's unique id on its first
// collective on CUDA memory and sends it to the others; each engine starts
// its rank's communicator (non-blocking init on the device the buffer is
// on) once it has both the id and a collective, queues the collectives
// until init is done, then enqueues them in order on the communicator's
// stream. Nothing blocks the engine: init and completion are polled every
// millisecond from a timer. A failure anywhere (NCCL's error, a peer
// engine gone, the group's deadline) breaks the group as on the CPU path:
// the communicator is aborted (ncclCommAbort: no rank waits on a dead one)
// and every collective in progress fails; a new group (made once the mesh
// is whole again) makes a new communicator.
#include "log.h"
#include "mesh/proc_anchor.h"

namespace troupe::mesh {

namespace {
/// How often init and completion are polled: a floor on a GPU collective's
/// latency as seen by the caller, and the engine's cost while one runs.
constexpr auto kPollInterval = std::chrono::milliseconds(1);
}  // namespace

void ProcAnchor::handle(const NcclId& m) {
  Group& g = groups_[m.group];  // it may come before this engine's own first GPU collective
  if (!g.broken.ok() || !g.gpu.unique_id.empty()) return;
  g.gpu.unique_id = m.id;
  gpu_progress(m.group);
}

void ProcAnchor::gpu_progress(const std::string& id) {
  auto it = groups_.find(id);
  if (it == groups_.end() || !it->second.broken.ok() || it->second.ranks.size() != 1) return;
  Group& g = it->second;
  Group::Gpu& gpu = g.gpu;
  auto& [rank, lr] = *g.ranks.begin();
  auto fail = [&](const Status& why) {
    break_group(id, Status(why.code(), "collectives: group " + id + " (NCCL): " + why.message()), /*tell_others=*/true);
  };
  auto poll_later = [&] {
    if (gpu.poll_set) return;
    gpu.poll_set = true;
    after(kPollInterval, [this, id] {
      auto again = groups_.find(id);
      if (again == groups_.end()) return;
      again->second.gpu.poll_set = false;
      gpu_progress(id);
    });
  };
  const Op* first = nullptr;
  for (auto& [seq, op] : lr.ops) {
    if (op.gpu) {
      first = &op;
      break;
    }
  }
  if (!gpu.comm) {
    if (first == nullptr) return;  // nothing on the GPU yet
    if (rank == 0 && gpu.unique_id.empty()) {
      auto unique = collectives::nccl_unique_id();
      if (!unique) return fail(unique.error());
      gpu.unique_id = *unique;
      std::set<uint64_t> told;
      for (const AnyRef& e : g.engines) {
        if (e == self() || !told.insert(e.id()).second) continue;
        (void)e.tell(NcclId{id, gpu.unique_id});
      }
    }
    if (gpu.unique_id.empty()) return;  // rank 0's id is on its way (bounded by the collective's deadline)
    int device = collectives::NcclComm::device_of(first->data);
    auto comm = collectives::NcclComm::start(gpu.unique_id, static_cast<int>(rank), static_cast<int>(g.spec.size),
                                             device, std::chrono::milliseconds(g.spec.timeout_ms));
    if (!comm) return fail(comm.error());
    gpu.comm = std::move(*comm);
    TROUPE_LOG(info, "event=nccl_comm_starting group={} rank={} size={} device={}", id, rank, g.spec.size, device);
  }
  if (!gpu.initialized) {
    collectives::Poll init = gpu.comm->init_state();
    if (init.failed()) return fail(init.status);
    if (init.pending()) return poll_later();
    gpu.initialized = true;
  }
  bool any_enqueued = false;
  for (auto& [seq, op] : lr.ops) {
    if (!op.gpu) continue;
    if (!op.enqueued) {
      Status s = gpu.comm->enqueue(op.kind, op.data, op.count, op.dtype, op.op, static_cast<int>(op.root));
      if (!s.ok()) return fail(s);
      op.enqueued = true;
    }
    any_enqueued = true;
  }
  if (!any_enqueued) return;
  // Each collective is answered once its own event has passed: they finish
  // in the order they were enqueued, which is sequence order.
  auto finished = gpu.comm->take_finished();
  if (!finished) return fail(finished.error());
  std::vector<Deferred<void>> replies;
  bool more = false;
  for (auto op = lr.ops.begin(); op != lr.ops.end();) {
    if (op->second.gpu && op->second.enqueued && replies.size() < *finished) {
      replies.push_back(op->second.reply);
      op = lr.ops.erase(op);
    } else {
      more = more || (op->second.gpu && op->second.enqueued);
      ++op;
    }
  }
  if (more) poll_later();
  for (auto& reply : replies) reply.complete();
}

}  // namespace troupe::mesh
