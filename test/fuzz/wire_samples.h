// One valid frame of every kind: fuzzing seeds and round-trip test cases.
#pragma once

#include <string>
#include <vector>

#include "wire.h"

namespace troupe::wire {

inline std::vector<Message> samples() {
  return {Hello{kProtocolVersion, 7, std::string("tok\0en", 6), "tcp://127.0.0.1:7000"},
          HelloReply{true, 9, "ucx://127.0.0.1:7001", ""},
          EnvelopeHeader{EnvelopeKind::ask, 1, 2, 3, 0xabcdef, 42, 0, ""},
          EnvelopeHeader{EnvelopeKind::error, 1, 2, 3, 0, 42, 3, "dead"},
          Resolve{5, "counter"},
          Resolved{5, 77, ""},
          MonitorRequest{77},
          DownNotice{77, 2, "failed: boom"},
          RegionRequest{8, 1, 64, 4096, true},
          RegionResponse{8, "no such region"},
          Heartbeat{123456},
          Goodbye{"bye"}};
}

}  // namespace troupe::wire
