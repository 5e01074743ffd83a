// The test runner. The cluster tests spawn actors in worker processes that
// node agents start from this same executable, so it serves as a worker
// first when started as one.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/test_driver.h"
#include "troupe/worker.h"

int main(int argc, char** argv) {
  troupe::serve_if_worker();
  troupe::test::run_test_driver_if_asked();
  return Catch::Session().run(argc, argv);
}
