// Records what a transport reports (frames, connections, losses, signs of
// life), for tests that drive a Transport directly; they wait on it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "transport.h"

namespace troupe::test {

/// Records what a transport reports; tests wait on it.
struct Recorder {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<transport::PeerId, transport::InFrame>> frames;
  std::vector<transport::PeerId> connected;
  std::vector<std::pair<transport::PeerId, troupe::Status>> lost;
  std::vector<transport::PeerId> activity;  // mid-frame signs of life

  transport::Events events() {
    return transport::Events{
        [this](transport::PeerId p, transport::InFrame f) {
          std::lock_guard<std::mutex> l(mu);
          frames.emplace_back(p, std::move(f));
          cv.notify_all();
        },
        [this](transport::PeerId p, bool) {
          std::lock_guard<std::mutex> l(mu);
          connected.push_back(p);
          cv.notify_all();
        },
        [this](transport::PeerId p, troupe::Status s) {
          std::lock_guard<std::mutex> l(mu);
          lost.emplace_back(p, std::move(s));
          cv.notify_all();
        },
        [this](transport::PeerId p) {
          std::lock_guard<std::mutex> l(mu);
          activity.push_back(p);
        },
    };
  }
  template <class Pred>
  bool wait(Pred pred, std::chrono::milliseconds t = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, t, pred);
  }
};

/// A heartbeat frame (the smallest kind) with `payload`.
inline transport::OutFrame heartbeat(uint64_t n, std::string payload = {}) {
  return transport::OutFrame{wire::encode(wire::Heartbeat{n}), std::move(payload)};
}

/// The heartbeat number of a frame made by heartbeat().
inline uint64_t beat(const transport::InFrame& f) { return std::get<wire::Heartbeat>(f.message).time_us; }

}  // namespace troupe::test
