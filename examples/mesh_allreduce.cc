// A data-parallel mesh that averages its gradients: troupe::init starts an
// embedded cluster (or joins TROUPE_ADDRESS), a proc mesh of 4 worker
// processes (this program) holds one Trainer each, and every step each
// trainer computes its "gradients" and averages them with the others by an
// allreduce inside the mesh. The driver checks that every rank ends with the
// same average. The gradients live in a CollectiveBuffer: the ranks of a
// host read each other's where they are, instead of copying them through the
// group's shared memory (an ordinary std::vector works too, a little slower).
#include <cmath>
#include <cstdio>
#include <string>
#include <span>
#include <vector>

#include <troupe/collective_buffer.h>
#include <troupe/collective_group.h>
#include <troupe/init.h>
#include <troupe/mesh.h>
#include <troupe/troupe.h>

struct Join {
  troupe::CollectiveGroup group;
  TROUPE_MESSAGE_NAMED(Join, "example.Join", group);
};
struct Step {
  uint32_t step = 0;
  TROUPE_MESSAGE_NAMED(Step, "example.Step", step);
};

class Trainer : public troupe::Actor<Trainer, Join, Step> {
 public:
  explicit Trainer(uint64_t params) : buffer_(troupe::CollectiveBuffer::allocate(params * sizeof(float))) {}
  void handle(const Join& m) { group_ = m.group; }

  /// Computes this rank's gradients, averages them across the mesh, and
  /// answers with their sum (the same on every rank once averaged).
  troupe::Deferred<double> handle(const Step& m) {
    auto reply = defer<double>();
    if (!buffer_) {
      reply.fail(buffer_.error());
      return reply;
    }
    std::span<float> grads = buffer_->as<float>();
    for (float& g : grads) g = static_cast<float>(group_.rank + 1) * (m.step + 1);
    ask<void>(group_.engine(self()), troupe::AllReduce{group_.id, group_.rank, grads.data(), grads.size(),
                                                       troupe::DType::float32, troupe::ReduceOp::avg})
        .then([grads, reply](troupe::Result<void> r) mutable {
          if (!r) return reply.fail(r.error());
          double sum = 0;
          for (float g : grads) sum += g;
          reply.complete(sum);
        });
    return reply;
  }

 private:
  troupe::CollectiveGroup group_;
  troupe::Result<troupe::CollectiveBuffer> buffer_;
};

int main() {
  auto session = troupe::init();  // in a worker process, this line serves actors and never returns
  if (!session) return std::fprintf(stderr, "%s\n", session.error().to_string().c_str()), 1;
  const troupe::ClusterClient& cluster = (*session)->cluster();
  constexpr uint32_t kRanks = 4;
  constexpr uint64_t kParams = 1 << 16;
  troupe::PlacementGroupSpec spec;
  spec.bundles.assign(kRanks, troupe::Bundle{{{"CPU", 0.25}}});
  auto pg = cluster.create_placement_group(spec);
  if (!pg) return std::fprintf(stderr, "%s\n", pg.error().to_string().c_str()), 1;
  auto procs = troupe::ProcMesh::create(cluster, troupe::Shape::make({{"ranks", kRanks}}).value(), *pg);
  if (!procs) return std::fprintf(stderr, "%s\n", procs.error().to_string().c_str()), 1;
  auto trainers = procs->spawn<Trainer>({}, kParams);
  if (!trainers) return std::fprintf(stderr, "%s\n", trainers.error().to_string().c_str()), 1;
  auto groups = trainers->make_group().value();
  for (uint32_t r = 0; r < kRanks; ++r) (void)trainers->member(r).ask(Join{groups[r]}).get();

  for (uint32_t step = 0; step < 3; ++step) {
    auto sums = trainers->call(Step{step});
    if (!sums.ok()) return std::fprintf(stderr, "step %u: %s\n", step, sums.errors()[0].second.to_string().c_str()), 1;
    // The average of (r + 1) * (step + 1) over ranks r, times the parameters.
    double want = (kRanks + 1) / 2.0 * (step + 1) * kParams;
    for (size_t r = 0; r < sums.size(); ++r) {
      if (std::abs(*sums[r] - want) > 1e-6 * want) {
        return std::fprintf(stderr, "step %u: rank %zu has %f, want %f\n", step, r, *sums[r], want), 1;
      }
    }
    std::printf("step %u: %u ranks in %zu processes averaged %llu gradients: sum %.0f on every rank\n", step, kRanks,
                procs->processes().size(), static_cast<unsigned long long>(kParams), want);
  }
  return 0;
}
