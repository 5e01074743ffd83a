// The test runner. The cluster tests spawn actors in worker processes that
// node agents start from this same executable, so it serves as a worker
// first when started as one.
#include "support/catch_session.h"
#include "support/test_driver.h"
#include "troupe/worker.h"

int main(int argc, char** argv) {
  troupe::serve_if_worker();
  troupe::test::run_test_driver_if_asked();
  return troupe::test::run_catch_session(argc, argv);
}
