// Timed loops run by actors, shared by the benchmarks.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "report.h"
#include "troupe/troupe.h"

namespace troupe::bench {

using Clock = std::chrono::steady_clock;

/// `n` timed iterations run one after another by an actor: next() starts an
/// iteration with `fire` (or finishes), record() closes the current one.
class SampleLoop {
 public:
  using Finish = std::function<void(std::vector<double>)>;
  void reset(int n, Finish finish) {
    left_ = n;
    finish_ = std::move(finish);
    samples_.clear();
    samples_.reserve(n);
  }
  template <class Fire>
  void next(Fire&& fire) {
    if (left_-- == 0) {
      finish_(std::move(samples_));
      return;
    }
    t0_ = Clock::now();
    fire();
  }
  void record() { samples_.push_back(us_between(t0_, Clock::now())); }

 private:
  int left_ = 0;
  Finish finish_;
  std::vector<double> samples_;
  Clock::time_point t0_;
};

/// Asks a troupe sampler to run `n` timed iterations against `to`.
template <class Target>
struct RunSamples {
  troupe::ActorRef<Target> to;
  int n;
};

/// A troupe actor that runs a SampleLoop against one target and answers
/// with the samples. Self::next() starts one iteration.
template <class Self, class Target>
class Sampler : public troupe::Actor<Self, RunSamples<Target>> {
 public:
  troupe::Deferred<std::vector<double>> handle(const RunSamples<Target>& r) {
    auto reply = this->template defer<std::vector<double>>();
    to_ = r.to;
    loop_.reset(r.n, [reply](std::vector<double> s) mutable { reply.complete(std::move(s)); });
    static_cast<Self*>(this)->next();
    return reply;
  }

 protected:
  troupe::ActorRef<Target> to_;
  SampleLoop loop_;
};

}  // namespace troupe::bench
