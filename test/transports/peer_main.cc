// A separate OS process for the remote tests: listens on loopback, publishes
// a Service as "service", prints its address on stdout, and runs until its
// stdin closes (or it is killed, which is the point of some tests).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "support/remote_actors.h"

int main(int argc, char** argv) {
  troupe::RuntimeConfig cfg;
  cfg.listen = std::string(argc > 2 ? argv[2] : "tcp") + "://127.0.0.1:0";
  if (argc > 1) cfg.cluster_token = argv[1];
  troupe::Runtime rt(cfg);
  auto service = rt.spawn<troupe::test::Service>();
  if (auto s = rt.publish("service", service); !s.ok()) {
    std::fprintf(stderr, "peer: %s\n", s.to_string().c_str());
    return 1;
  }
  std::vector<uint8_t> data(4 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = troupe::test::pattern(i);
  auto reg = rt.register_buffer(data.data(), data.size());
  if (!reg || !rt.publish("buffers", rt.spawn<troupe::test::BufferKeeper>(reg->handle())).ok()) {
    std::fprintf(stderr, "peer: cannot register the buffer\n");
    return 1;
  }
  std::printf("%s\n", rt.address().c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}
