// The [gpu] suite's entry point: where no GPU is present every test reports
// as skipped (ctest's SKIP_RETURN_CODE), not as passed. The mesh tests'
// worker processes are this executable, started by node agents: it serves as
// one first when started as one.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

#include "support/catch_session.h"
#include "troupe/worker.h"

int main(int argc, char** argv) {
  troupe::serve_if_worker();
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing |= std::strncmp(argv[i], "--list", 6) == 0;
  int devices = 0;
  if (!listing && (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)) {
    std::printf("no CUDA device here: [gpu] tests skipped\n");
    return 77;
  }
  return troupe::test::run_catch_session(argc, argv);
}
